# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""TransformerEngine's NVFP4 quantizers and GEMMs called directly, as `transformer_engine.jax.dense.dense` calls them
for the recipe: the candidate the in-training audit and the self-check hold against the bit-exact emulator.

Facts of TE 2.20.2's JAX API this relies on (transformer_engine/jax/...):
  - dense's quantizer set for NVFP4BlockScaling: three `quantize.quantizer.NVFP4Quantizer`s with q_layout
    ROWWISE_COLWISE (quantize/quantizer.py:1156, 1165-1169; quantize/helper.py:627-677): x 1D (1x16) with RHT,
    kernel 2D (16x16) without RHT, dgrad 1D with RHT and a stochastic-rounding RNG state (uint32, (devices, 4)).
    RHT applies to the column-wise (wgrad) copy only (cpp_extensions/quantization.py:809-823). Built here directly,
    with each switch of our recipe: `QuantizerFactory.create_set` under `autocast` would silently drop RHT and SR.
  - `cpp_extensions.quantize(x, quantizer, flatten_axis=-1)` runs TE's CUDA kernel (the quantizer's own
    `.quantize` is a pure-JAX emulation that is not TE's kernel) and returns a ScaledTensor2x whose row-wise copy has
    data (M, K) float4_e2m1fn, scale_inv (M, K/16) float8_e4m3fn and amax (1,), and whose column-wise copy is stored
    transposed, (K, M) with scale_inv (K, M/16) and the post-RHT amax (tensor.py:186-256, 818-819;
    scaling_modes.py:1056-1062). scale_inv is compact and unswizzled there (quantization.py:331-342): the GEMM
    swizzles its own padded copy (gemm.py:749-760). A 2D kernel's scale is stored repeated over the 16 rows of its
    tile (scaling_modes.py:561-562), our layout too.
  - `TensorUsage` picks the copy: LHS / RHS_TRANS row-wise, LHS_TRANS / RHS column-wise (scaling_modes.py:610-612).
Only on a GPU where TE runs NVFP4 (Blackwell) do these kernels execute; elsewhere they lower and compile (tests/te).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from MaxText.nvfp4.gemm import MATMUL_DIMS, GemmRecipe
from MaxText.nvfp4.operands import Operand

__all__ = ["candidate", "dense", "quantizer_set", "sr_state"]


def sr_state(key: jax.Array) -> jax.Array:
  """A stochastic-rounding RNG state for TE's dgrad quantizer from a jax key: uint32 (devices in the mesh, 4), 16
  bytes per device, which TE reads as its philox seed and offset (quantization.py:104-126)."""
  # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, only where TE quantizes
  from transformer_engine.jax.sharding import get_num_devices_in_mesh

  return jax.random.randint(key, (get_num_devices_in_mesh(), 4), 0, jnp.iinfo(jnp.int32).max,
                            dtype=jnp.int32).view(jnp.uint32)


def quantizer_set(recipe: GemmRecipe, key: jax.Array | None) -> Any:
  """TE's quantizer set for our recipe, as dense builds it: x 1D with the recipe's RHT, the kernel 2D (or 1D without
  RHT), the output gradient 1D with the recipe's RHT and, with stochastic rounding, an RNG state from `key`."""
  # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, only where TE quantizes
  from transformer_engine.jax.quantize import QuantizeLayout, QuantizerSet, ScalingMode

  # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, as above
  from transformer_engine.jax.quantize.quantizer import NVFP4Quantizer

  def make(mode: Any, rht: bool, state: jax.Array | None = None) -> Any:
    return NVFP4Quantizer(q_dtype=recipe.format.element_dtype, scaling_mode=mode, q_layout=QuantizeLayout.ROWWISE_COLWISE,
                          use_rht=rht, stochastic_rounding_rng_state=state)

  kernel_mode = ScalingMode.NVFP4_2D_SCALING if recipe.weight_2d else ScalingMode.NVFP4_1D_SCALING
  state = sr_state(key) if recipe.stochastic_rounding and key is not None else None
  return QuantizerSet(x=make(ScalingMode.NVFP4_1D_SCALING, recipe.rht), kernel=make(kernel_mode, False),
                      dgrad=make(ScalingMode.NVFP4_1D_SCALING, recipe.rht, state))


def _bits(a: jax.Array, dtype: Any) -> jax.Array:
  return jax.lax.bitcast_convert_type(a, dtype).astype(jnp.uint8)


def candidate(recipe: GemmRecipe) -> Any:
  """TE's quantization of a 2-D bf16 tensor as one GEMM operand: (tensor, operand, key=None) -> (codes, scales, amax)
  as bits in the operand's blocked orientation (MaxText.nvfp4.audit.Encoded's layout): the copy dense's GEMM reads."""

  def quantize(tensor: jax.Array, operand: Operand, key: jax.Array | None = None) -> tuple[jax.Array, ...]:
    # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, only where TE quantizes
    from transformer_engine.jax import cpp_extensions as tex

    # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, as above
    from transformer_engine.jax.quantize import TensorUsage

    quantizers = quantizer_set(recipe, jax.random.key(0) if key is None else key)
    quantizer = {"x": quantizers.x, "w": quantizers.kernel, "dy": quantizers.dgrad}[operand.source]
    scaled = tex.quantize(tensor.astype(jnp.bfloat16), quantizer, flatten_axis=-1)
    copy = scaled.get_tensor(TensorUsage.LHS_TRANS if operand.axis == 0 else TensorUsage.LHS)
    return _bits(copy.data, jnp.uint4), _bits(copy.scale_inv, jnp.uint8), copy.amax.reshape(()).astype(jnp.float32)

  return quantize


def dense(x: jax.Array, w: jax.Array, quantizers: Any) -> jax.Array:
  """y = x . W (x: M x K, W: K x N, bf16) through TE's dense with `quantizers`: its fprop, and under jax.vjp its dgrad
  and wgrad, as the TE backend runs them (MaxText.backends.te)."""
  # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, only where TE runs
  from transformer_engine.jax.dense import dense as te_dense

  return te_dense(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), contracting_dims=MATMUL_DIMS[0],
                  quantizer_set=quantizers)
