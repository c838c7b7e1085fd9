# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""How much one NVFP4 quantization loses: amax, underflow, relative error and subnormal block scales; and how much
of a weight gradient is exactly zero (`weight_gradient_stats`, for NVFP4 and BF16 GEMMs alike).

Why in the numerics layer: the statistics must describe the operands the GEMM really sees, so they are computed
by the same encoding (`quantize.encode`: RHT, tensor scale, E4M3 block scales, the kernels' f32 order) that
`quantize` and the GEMM use, then read off before and after the E2M1 rounding. They are therefore exact with
respect to TransformerEngine's quantizer, which ours equals bit for bit.

Rounding: always round-to-nearest-even. Operands that the recipe rounds stochastically (the output gradient dY)
get the statistics of their nearest rounding: stochastic rounding is unbiased, its error is larger than
nearest's by design (about sqrt(2) in rms), and a statistic that depended on the random bits would not be
reproducible across runs that differ only in logging.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.nvfp4 import hadamard
from MaxText.nvfp4.arithmetic import divide, widen
from MaxText.nvfp4.e2m1 import round_to_e2m1_grid
from MaxText.nvfp4.formats import NVFP4, TENSOR_SCALE_RANGE
from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.nvfp4.operands import BACKWARD_ROWS, FORWARD_ROWS, GEMM_OPERANDS, gemm_operands
from MaxText.nvfp4.quantize import Scaling, blocked, check_input, encode

__all__ = ["STAT_NAMES", "SUBNORMAL_SCALE", "WGRAD_STAT_NAMES", "backward_operand_stats", "empty_gemm_stats",
           "forward_operand_stats", "quantization_stats", "weight_gradient_stats"]

#: The statistics, in the order `quantization_stats` returns them (and stacked arrays of them are laid out).
STAT_NAMES = ("amax", "underflow", "rel_error", "subnormal_scales")

#: The weight gradient's figures, in the order `weight_gradient_stats` returns them.
WGRAD_STAT_NAMES = ("zero", "zero_channels")

#: Smallest normal E4M3 value (2**-6): a block scale below it (or 0) has lost precision to the subnormal range.
SUBNORMAL_SCALE = NVFP4.scale_min_normal


def _fraction(hits: jax.Array, of: jax.Array) -> jax.Array:
  """sum(hits & of) / sum(of) as float32; 0 where `of` selects nothing. Divided correctly rounded (arithmetic.divide),
  so a statistic is the same number on a GPU as here."""
  count = jnp.sum(of, dtype=jnp.float32)
  return jnp.where(count > 0, divide(jnp.sum(hits & of, dtype=jnp.float32), jnp.maximum(count, 1.0)), np.float32(0.0))


def quantization_stats(
    x: jax.Array, *, scaling: Scaling | str = "1d", rht: bool = False, axis: int = -1
) -> dict[str, jax.Array]:
  """Statistics of quantize(x, scaling, rht) with nearest rounding: float32 scalars, jit-able.

  - amax: max |x| over the tensor (of the RHT output with rht=True): what the tensor scale is made from.
  - underflow: the fraction of x's nonzero elements that quantize to 0 (flushed: their block's scale made them
    smaller than half the smallest E2M1 step, or the block scale itself is 0).
  - rel_error: ||dequantize(quantize(x)) - x||_2 / ||x||_2; with rht=True both sides in the transformed domain
    (the RHT is orthogonal, so this is also the error of the operand the GEMM multiplies). 0 for an all-zero x.
  - subnormal_scales: the fraction of blocks with a nonzero amax whose E4M3 block scale is 0 or subnormal
    (< 2**-6): blocks far below the tensor's amax, whose scales have fewer than 4 significant bits.

  Args:
    x: bfloat16/float16/float32, as for `quantize`.
    scaling: "1d" (1x16 blocks along `axis`) or "2d" (16x16 tiles over the last two axes).
    rht: the Random Hadamard Transform first, along the block axis (the recipe's wgrad operands).
    axis: the axis 1D blocks run along (the GEMM's contracting axis: -1 for x in fprop, 0 for x^T in wgrad).

  Returns:
    {name: float32 scalar} for each of STAT_NAMES. NaN in x makes rel_error NaN (the quantizer maps NaN to a
    finite value; the statistic does not hide it).

  Raises:
    TypeError, ValueError: as `quantize` for x, scaling and axis.
  """
  x = jnp.asarray(x)
  scaling = Scaling(scaling)
  axis = axis % max(x.ndim, 1)
  check_input(x, scaling, False, None, axis)
  if rht:
    x = hadamard.rht(x, axis)  # the bf16 tensor TE's RHT kernel writes; every statistic describes it
  y, s8, bamax, amax = encode(x, scaling, False, axis)
  q = round_to_e2m1_grid(y)
  scale = s8.astype(jnp.float32)
  reference = widen(blocked(x, scaling, axis)[0])
  error = q * (scale * divide(amax, TENSOR_SCALE_RANGE)) - reference
  norm = jnp.sum(jnp.square(reference))
  rel_error = jnp.sqrt(divide(jnp.sum(jnp.square(error)), jnp.where(norm > 0, norm, np.float32(1.0))))
  return {
      "amax": amax,
      "underflow": _fraction(q == 0, reference != 0),
      "rel_error": rel_error,
      "subnormal_scales": _fraction(scale < SUBNORMAL_SCALE, bamax > 0),
  }


# --- The operands of one GEMM -----------------------------------------------------------------------------------
# Rows in the operand table's order (MaxText.nvfp4.operands; GEMM_OPERANDS, FORWARD_ROWS and BACKWARD_ROWS are
# named here too for MaxText.backends.pipeline and MaxText.integration.telemetry, which take them with the stats).


def _row(stats: dict[str, jax.Array]) -> jax.Array:
  return jnp.stack([stats[name] for name in STAT_NAMES])


def _operand_rows(tensors: dict[str, jax.Array], recipe: GemmRecipe, rows: tuple[int, ...]) -> jax.Array:
  """The statistics of the table's `rows` under `recipe`, each operand made from tensors[its source] as the GEMM
  quantizes it (its scaling, block axis and RHT)."""
  operands = gemm_operands(recipe)
  return jnp.stack([_row(quantization_stats(tensors[o.source], scaling=o.scaling, rht=o.rht, axis=o.axis))
                    for o in (operands[i] for i in rows)])


def forward_operand_stats(x: jax.Array, w: jax.Array, recipe: GemmRecipe) -> jax.Array:
  """Rows fprop_x, fprop_w, wgrad_x (3 x len(STAT_NAMES)) for y = x . W, x (M, K), W (K, N), as the GEMM
  quantizes them: x 1D along K; W in 16x16 tiles (or 1D along K); x^T 1D along M with the recipe's RHT."""
  return _operand_rows({"x": x, "w": w}, recipe, FORWARD_ROWS)


def backward_operand_stats(dy: jax.Array, recipe: GemmRecipe) -> jax.Array:
  """Rows dgrad_dy, wgrad_dy (2 x len(STAT_NAMES)) for the output gradient dY (M, N): 1D along N; dY^T 1D along M
  with the recipe's RHT. Nearest rounding stands in for the recipe's stochastic rounding (module docstring)."""
  return _operand_rows({"dy": dy}, recipe, BACKWARD_ROWS)


def empty_gemm_stats() -> jax.Array:
  """The statistics array of one GEMM before any statistics step: zeros, (len(GEMM_OPERANDS), len(STAT_NAMES))."""
  return jnp.zeros((len(GEMM_OPERANDS), len(STAT_NAMES)), jnp.float32)


# --- The weight gradient ----------------------------------------------------------------------------------------


def _share(hits: jax.Array) -> jax.Array:
  """The share of true elements of `hits` as float32: an int32 count (exact past float32's 2^24), divided correctly
  rounded (arithmetic.divide) so the figure is the same number on every platform."""
  count = jnp.sum(hits, dtype=jnp.int32).astype(jnp.float32)
  return divide(count, np.float32(max(hits.size, 1)))


def weight_gradient_stats(dw: jax.Array, contracting: tuple[int, ...] = (0,)) -> jax.Array:
  """The share of dW's entries that are exactly zero, and the share of its output channels whose whole gradient is
  zero: float32 (2,), in WGRAD_STAT_NAMES order, jit-able.

  Why exactly zero: an NVFP4 wgrad multiplies quantized x^T and dY^T, whose elements flush to 0 below half the
  smallest E2M1 step of their block; a weight entry whose every product flushed gets no update at all, where BF16
  would give it a small one. An output channel (a column n of W) with dW[:, n] == 0 everywhere learns nothing in that
  step: a routed expert that received no token, or a dY column that flushed whole. -0.0 counts as zero; NaN does not.

  Args:
    dw: the weight gradient in the weight's own layout, any float dtype.
    contracting: dW's axes that the GEMM contracts (K; DenseGeneral's kernel axes against its input); every other
      axis is an output channel axis (N).
  """
  dw = jnp.asarray(dw)
  zero = dw == 0
  contracting = tuple(a % dw.ndim for a in contracting)
  return jnp.stack([_share(zero), _share(jnp.all(zero, axis=contracting))])
