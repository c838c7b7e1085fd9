# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The fused backend's GEMM on Blackwell: TransformerEngine's cuBLASLt NVFP4 GEMM on our operands.

The fused backend quantizes with our quantizer inside the step (MaxText.nvfp4.block_scaled.quantize_codes) and keeps
each operand as E2M1 codes, E4M3 block scales and its amax. TE 2.20.2's `cpp_extensions.gemm.gemm` takes exactly
that as `ScaledTensor`s (`ScaledTensorFactory.create_1x`, NVFP4_1D_SCALING): it swizzles the scales itself, applies
the tensor scales from the two amaxes (alpha = amax_a/2688 * amax_b/2688, as our dot does) and runs one
`te_gemm_v2_ffi` call, the call the pre-flight prices. Without a Blackwell GPU the fused backend multiplies with
`jax.nn.scaled_matmul` instead (MaxText.nvfp4.gemm.scaled_matmul_gemm), on the same operands.

Layout: K last for both operands, row-wise (what `BlockCodes.contracting` gives). A 16x16 weight tile's scale is
repeated on each of its 16 rows, so every operand goes as 1x16 blocks: the same numbers the GEMM multiplies. The
scales go unpadded: TE pads them to its swizzle's granule itself. The output takes the operands' `dq_dtype`, set to
the caller's output dtype: cuBLASLt's epilogue rounds the f32 accumulator times alpha once to it, the rounding the
emulated GEMM's cast does, and no f32 product is written out to be cast afterwards.

Mapped over routed experts (jax.vmap, MaxText.nvfp4.grouped), the GEMM runs once per expert on that expert's codes,
scales and amax: TE 2.20.2's GemmPrimitive refuses batching ("Batching is not supported"), and it has no NVFP4
grouped GEMM, so the batch is E GEMMs of the same shape, each its own tensor scales, the outputs stacked.
transformer_engine is imported when the GEMM is first traced, never at import time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from MaxText.backends import environment
from MaxText.nvfp4.block_scaled import BlockCodes
from MaxText.nvfp4.gemm import BlockScaledGemm, scaled_matmul_gemm

__all__ = ["fused_gemm", "te_block_scaled_gemm"]


def fused_gemm() -> tuple[BlockScaledGemm, str]:
  """The fused backend's block-scaled GEMM in the environment the model is built for (environment.current()), and
  its name: TransformerEngine's cuBLASLt NVFP4 GEMM where TE runs NVFP4 (Blackwell), else jax.nn.scaled_matmul."""
  if environment.te_unavailable_reason(environment.current()) is None:
    return te_block_scaled_gemm, "TransformerEngine NVFP4 GEMM (te_gemm_v2_ffi)"
  return scaled_matmul_gemm, "jax.nn.scaled_matmul"


def te_block_scaled_gemm(a: BlockCodes, a_axis: int, b: BlockCodes, b_axis: int, out_dtype: jnp.dtype) -> jax.Array:
  """a . b contracting a's `a_axis` with b's `b_axis` through TE's NVFP4 GEMM: `out_dtype`, a's free axis first
  (MaxText.nvfp4.gemm.BlockScaledGemm). Under jax.vmap: one TE GEMM per mapped index (per expert)."""

  @jax.custom_batching.custom_vmap
  def product(a: BlockCodes, b: BlockCodes) -> jax.Array:
    return _te_gemm(a, a_axis, b, b_axis, out_dtype)

  @product.def_vmap
  def _one_gemm_per_index(size: int, in_batched: list, a: BlockCodes, b: BlockCodes) -> tuple[jax.Array, bool]:
    def index(tree: BlockCodes, batched: BlockCodes, i: int) -> BlockCodes:
      return jax.tree.map(lambda leaf, mapped: leaf[i] if mapped else leaf, tree, batched)

    return jnp.stack([product(index(a, in_batched[0], i), index(b, in_batched[1], i)) for i in range(size)]), True

  return product(a, b)


def _te_gemm(a: BlockCodes, a_axis: int, b: BlockCodes, b_axis: int, out_dtype: jnp.dtype) -> jax.Array:
  """One TE NVFP4 GEMM on 2D operands."""
  # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, only where this GEMM is traced
  import transformer_engine.jax.quantize as te_quantize
  from transformer_engine.jax.cpp_extensions.gemm import gemm  # pylint: disable=import-outside-toplevel  # TE, as above

  def operand(q: BlockCodes, axis: int):
    codes, scales = q.contracting(axis)
    return te_quantize.ScaledTensorFactory.create_1x(codes, scales, amax=q.amax.reshape(1),
                                                     scaling_mode=te_quantize.ScalingMode.NVFP4_1D_SCALING,
                                                     dq_dtype=out_dtype)

  out = gemm(operand(a, a_axis), operand(b, b_axis), contracting_dims=((1,), (1,)))
  return (out[0] if isinstance(out, (tuple, list)) else out).astype(out_dtype)
