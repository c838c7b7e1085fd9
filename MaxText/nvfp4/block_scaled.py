# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What a GEMM multiplies of an NVFP4 quantization, in the two forms the backends take: `quantize_block_scaled`, the
E2M1 values times their E4M3 scales as exact bfloat16 (the emulated backend's f32 dot), and `quantize_codes`, the
codes and scales as NVIDIA's block-scaled GEMM reads them (`BlockCodes`: the fused backend's).

Why a module of its own: `quantize` (MaxText.nvfp4.quantize) is TE's storage format, one tensor at a time; these are
GEMM operands, with one rounding rule for both forms (`_rounded`) and their own NaN rule (a block holding a NaN or an
Inf is NaN, so the GEMM's output is non-finite wherever a BF16 GEMM's would be).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.nvfp4 import hadamard, rounding
from MaxText.nvfp4.arithmetic import anchored, materialized_on_cpu
from MaxText.nvfp4.e2m1 import e2m1_codes, pack_e2m1, round_to_e2m1_grid
from MaxText.nvfp4.formats import BLOCK_SIZE
from MaxText.nvfp4.quantize import Scaling, check_input, encode

__all__ = ["BlockCodes", "quantize_block_scaled", "quantize_codes"]


def quantize_block_scaled(
    x: jax.Array,
    scaling: Scaling | str = "1d",
    rht: bool = False,
    stochastic_rounding: bool = False,
    key: jax.Array | None = None,
    axis: int = -1,
) -> tuple[jax.Array, jax.Array]:
  """What a GEMM consumes of quantize(x, ...): (e2m1 * e4m3 scale as bfloat16 in x's shape, amax).

  The same numbers as `quantize`, without materializing float4 data: every product of an E2M1 value and an
  E4M3 scale has at most 5 significant bits and lies in [2**-10, 2688], so it is exact in bfloat16, and a GEMM
  on these operands with f32 accumulation is the FP4 GEMM (at bf16, not f32, matmul speed). With 2D scaling
  the result's transpose is the block-scaled transpose (the tiles are shared).

  One deliberate difference from `quantize`: every value of a block that holds a NaN or an Inf (after RHT,
  where it applies) is NaN here, where `quantize` stores TE's kernels' 448 and +6. A GEMM on these values is
  then non-finite wherever a BF16 GEMM would be, so a NaN in activations, weights or gradients reaches the
  loss or the gradients and upstream NaN checks fire, instead of turning into a finite +-6 * 448.

  Args:
    x, scaling, rht, stochastic_rounding, key: as for `quantize`.
    axis: the axis 1D blocks run along (scaling="1d" only). quantize_block_scaled(x, axis=0, ...) equals
      quantize_block_scaled(x.T, ...) transposed back, random bits of stochastic rounding included, without
      materializing x.T: the wgrad operands x^T and dY^T are quantized in place.

  Returns:
    (values, amax): bfloat16 values of x's shape; the float32 global amax.
  """
  x, scaling, axis = _operand(x, scaling, stochastic_rounding, key, axis)
  return _block_scaled(x, key if stochastic_rounding else None, scaling=scaling, rht=rht, axis=axis)


def _operand(x: jax.Array, scaling: Scaling | str, stochastic_rounding: bool, key: jax.Array | None, axis: int
             ) -> tuple[jax.Array, Scaling, int]:
  """A GEMM operand's arguments checked (check_input) and normalized: (x as an array, scaling, axis >= 0)."""
  x = jnp.asarray(x)
  scaling = Scaling(scaling)
  axis = axis % max(x.ndim, 1)
  check_input(x, scaling, stochastic_rounding, key, axis)
  return x, scaling, axis


def _rounded(x: jax.Array, key: jax.Array | None, scaling: Scaling, rht: bool, axis: int, as_codes: bool = False,
             rht_order: hadamard.Order = hadamard.Order.EXACT) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(elements rounded to E2M1, blocked: float32 grid values, or with `as_codes` their E2M1 bit patterns (uint8);
  e4m3 scales, blocked; block amaxes, blocked; global amax): what both GEMM operand forms (`quantize_block_scaled`,
  `quantize_codes`) are made of, one rounding rule each way (tests/nvfp4/formats_test.py, rounding_test.py hold the
  codes to the values' float4 cast, bit for bit)."""
  y, s8, bamax, amax = encode(x, scaling, rht, axis, nan_blocks_out=True, rht_order=rht_order)
  if key is not None:
    # The bits x's transpose (block axis last) would draw, in x's layout.
    order = tuple(d for d in range(x.ndim) if d != axis) + (axis,)
    bits = rounding.random_bits(key, x.shape, order).reshape(y.shape)
    rounded = rounding.stochastic_e2m1_codes(y, bits) if as_codes else rounding.stochastic_round_to_grid(y, bits)
  else:
    rounded = e2m1_codes(y) if as_codes else round_to_e2m1_grid(y)
  return rounded, s8, bamax, amax


@functools.partial(jax.jit, static_argnames=("scaling", "rht", "axis"))
def _block_scaled(x: jax.Array, key: jax.Array | None, *, scaling: Scaling, rht: bool, axis: int
                  ) -> tuple[jax.Array, jax.Array]:
  """quantize_block_scaled after its checks, as one jitted function. Why jitted: a model calls it for every GEMM
  operand, and maxtext traces each model several times before training (abstract shapes, initialization, the
  step); jit traces and lowers each (shape, dtype, switches) once and reuses it, where inline code is traced and
  lowered again at every call. XLA inlines the call, so the compiled program is the same."""
  q, s8, bamax, amax = _rounded(x, key, scaling, rht, axis)
  return _to_bf16_exactly(q * materialized_on_cpu(_operand_block_scales(s8, bamax))).reshape(x.shape), amax


def _operand_block_scales(s8: jax.Array, bamax: jax.Array) -> jax.Array:
  """The GEMM operand forms' block scales as float32: the E4M3 scale, or NaN for a block holding a NaN or an Inf
  (bamax is NaN or inf exactly then: block_amax propagates NaN). Per block, so nearly free."""
  return jnp.where(jnp.isfinite(bamax), s8.astype(jnp.float32), anchored(np.float32(np.nan), bamax))


def _to_bf16_exactly(v: jax.Array) -> jax.Array:
  """float32 values that are bf16 values (e2m1 * e4m3 products: at most 6 significant bits, in [2**-10, 2688], or NaN)
  as bfloat16, by keeping the upper 16 bits: the conversion's result for such values, without its rounding logic
  (XLA:CPU converts float32 to bfloat16 element by element in software: 14 ms of the 4096^2 wgrad operand's 59)."""
  return jax.lax.bitcast_convert_type((jax.lax.bitcast_convert_type(v, jnp.uint32) >> 16).astype(jnp.uint16),
                                      jnp.bfloat16)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BlockCodes:
  """A 2D GEMM operand as NVIDIA's block-scaled GEMM takes it: E2M1 codes, E4M3 block scales, the tensor amax.

  codes: float4_e2m1fn, the operand's own layout (rows, cols); never a dequantized copy.
  scales: float8_e4m3fn, compact: (rows, cols/16) for 1x16 blocks along axis 1, (rows/16, cols) along axis 0,
    (rows/16, cols/16) for 16x16 tiles. A block holding a NaN or an Inf has a NaN scale, so the GEMM's output is
    non-finite wherever a BF16 GEMM's would be (float4 has no NaN; the codes of such a block are +-6).
  codes * scales per block equals `quantize_block_scaled`'s values of the same call, bit for bit.
  """

  codes: jax.Array
  scales: jax.Array
  amax: jax.Array
  scaling: Scaling = dataclasses.field(metadata={"static": True})
  axis: int = dataclasses.field(metadata={"static": True})  # the 1D block axis (1 for 2D tiles: both)

  def contracting(self, axis: int) -> tuple[jax.Array, jax.Array]:
    """(codes, scales) laid out for a GEMM contracting `axis`: (rows, K) and (rows, K/16), K last, as
    `jax.nn.scaled_matmul` (and TE's GEMM, row-wise) take them. Axis 0 transposes: a data movement of 4-bit codes
    (TE's column-wise copy is the same transpose, written by its quantizer)."""
    if self.scaling is Scaling.ONE_D and axis != self.axis:
      raise ValueError(f"BlockCodes: 1x16 blocks along axis {self.axis} cannot contract axis {axis}")
    scales = self.scales
    if self.scaling is Scaling.TWO_D:  # one scale per tile: repeated for each of its 16 rows across `axis`
      scales = jnp.repeat(scales, BLOCK_SIZE, axis=1 - axis)
    return (self.codes, scales) if axis == 1 else (self.codes.T, scales.T)


def quantize_codes(
    x: jax.Array,
    scaling: Scaling | str = "1d",
    rht: bool = False,
    stochastic_rounding: bool = False,
    key: jax.Array | None = None,
    axis: int = -1,
    rht_order: hadamard.Order = hadamard.Order.EXACT,
) -> BlockCodes:
  """A 2D GEMM operand as E2M1 codes and E4M3 block scales (`BlockCodes`): the same quantization as
  `quantize_block_scaled` of the same arguments (random bits of stochastic rounding included), kept in the form
  NVIDIA's block-scaled GEMM reads, never dequantized. What the fused backend multiplies (with
  `rht_order=hadamard.Order.PLATFORM`: the RHT in a fixed pairwise order on a GPU,
  docs/numerics.md#the-fused-backends-rht)."""
  if jnp.ndim(x) != 2:
    raise ValueError(f"quantize_codes: a GEMM operand is 2D, got shape {jnp.shape(x)}")
  x, scaling, axis = _operand(x, scaling, stochastic_rounding, key, axis)
  codes, scales, amax = _codes(x, key if stochastic_rounding else None, scaling=scaling, rht=rht, axis=axis,
                               rht_order=hadamard.Order(rht_order))
  return BlockCodes(codes, scales, amax, scaling, 1 if scaling is Scaling.TWO_D else axis)


@functools.partial(jax.jit, static_argnames=("scaling", "rht", "axis", "rht_order"))
def _codes(x: jax.Array, key: jax.Array | None, *, scaling: Scaling, rht: bool, axis: int,
           rht_order: hadamard.Order = hadamard.Order.EXACT) -> tuple[jax.Array, jax.Array, jax.Array]:
  """quantize_codes after its checks, jitted for the reason `_block_scaled` is."""
  codes, s8, bamax, amax = _rounded(x, key, scaling, rht, axis, as_codes=True, rht_order=rht_order)
  scales = _operand_block_scales(s8, bamax).astype(s8.dtype)
  m, n = x.shape
  compact = (m, n // BLOCK_SIZE) if (scaling is Scaling.ONE_D and axis == 1) else (
      (m // BLOCK_SIZE, n) if scaling is Scaling.ONE_D else (m // BLOCK_SIZE, n // BLOCK_SIZE))
  return pack_e2m1(codes.reshape(x.shape), materialize=False), scales.reshape(compact), amax
