# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The E2M1 element codec: NVFP4's 4-bit elements rounded, coded, decoded and packed on float32's bits.

Why on the bits: a GPU runs the quantizer's element passes bound by their instructions (docs/prediction.md), and
XLA:CPU converts to float4 one scalar at a time; every function here equals the plain float4 cast bit for bit
(tests/nvfp4/formats_test.py).
"""

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.nvfp4.arithmetic import materialized_on_cpu
from MaxText.nvfp4.formats import E2M1, E2M1_MAGNITUDES, E2M1_MAX


def e2m1_grid_step(a: jnp.ndarray) -> jnp.ndarray:
  """Spacing of the E2M1 grid at magnitude a: 0.5 below 2, 1 in [2, 4), 2 from 4 on (float32)."""
  # Arithmetic on the two flags rather than where(flag, constant, ...): see `anchored`. Every term is exact.
  return np.float32(0.5) + np.float32(0.5) * (a >= 2.0).astype(jnp.float32) + (a >= 4.0).astype(jnp.float32)


def e2m1_grid_inverse_step(a: jnp.ndarray) -> jnp.ndarray:
  """1 / e2m1_grid_step(a), exact: dividing by the step is a multiply, never a division (a GPU's fast division is
  not always exact, see `divide`)."""
  return np.float32(2.0) - (a >= 2.0).astype(jnp.float32) - np.float32(0.5) * (a >= 4.0).astype(jnp.float32)


def e2m1_neighbours(y: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """(lower, upper E2M1 magnitude around |y|, and the grid step there), float32; equal where |y| is on the grid or
  >= 6. lower is |y| rounded toward zero (clamped at 6): what stochastic rounding may round down to, and what a
  truncating quantizer would give."""
  a = jnp.minimum(jnp.abs(y), E2M1_MAX)
  step = e2m1_grid_step(a)
  lower = jnp.floor(a * e2m1_grid_inverse_step(a)) * step
  upper = jnp.where(lower == a, lower, jnp.minimum(lower + step, E2M1_MAX))
  return lower, upper, step


def e2m1_magnitudes(codes: jnp.ndarray) -> jnp.ndarray:
  """The magnitude of each E2M1 bit pattern (uint8, sign in bit 3 ignored), float32: E2M1 decoding."""
  return jnp.asarray(E2M1_MAGNITUDES)[(codes & 7).astype(jnp.int32)]


def e2m1_values(codes: jnp.ndarray) -> jnp.ndarray:
  """The value of each E2M1 bit pattern (uint8, sign in bit 3), float32; code 8 is -0."""
  magnitude = e2m1_magnitudes(codes)
  return jnp.where(((codes >> 3) & 1).astype(bool), -magnitude, magnitude)


def _f32_bits(value: float) -> np.uint32:
  return np.float32(value).view(np.uint32)


#: float32 bit patterns the E2M1 coding compares and adds on, as unsigned integers: for magnitudes (sign bit clear)
#: the integers' order is the floats' order, with every NaN above +inf.
_E2M1_MAX_BITS = _f32_bits(E2M1_MAX)
E2M1_MIN_NORMAL_BITS = _f32_bits(jnp.finfo(E2M1).smallest_normal)  # 1: below it the grid is 0, 0.5, 1
_INF_BITS = _f32_bits(np.inf)
#: float32's mantissa bits below E2M1's one: an E2M1 normal value v has bits(v) >> 22 = (exponent << 1) | mantissa bit,
#: 254 for 1.0, whose code is 2, up to 259 for 6.0, code 7 (the codes of 1, 1.5, 2, 3, 4, 6 count up with it).
E2M1_DROPPED_BITS = jnp.finfo(jnp.float32).nmant - jnp.finfo(E2M1).nmant
E2M1_CODE_OFFSET = int(E2M1_MIN_NORMAL_BITS >> E2M1_DROPPED_BITS) - 2
_F32_MANTISSA_BITS = jnp.finfo(jnp.float32).nmant
_QUARTER_BITS = _f32_bits(0.25)
_TWO_POW_23 = np.float32(1 << _F32_MANTISSA_BITS)


def e2m1_clamped_bits(y: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
  """(min(|y|, 6) as float32 bits, uint32, NaN -> 6; y's sign as the code's bit 3, 0 for NaN): what both roundings
  to E2M1 codes start from. One integer min saturates and catches NaN (its bits lie above 6's)."""
  bits = jax.lax.bitcast_convert_type(jnp.asarray(y, jnp.float32), jnp.uint32)
  magnitude = bits & np.uint32(0x7FFFFFFF)
  sign = (bits >> 31) * (magnitude <= _INF_BITS).astype(jnp.uint32)  # a NaN codes +6, as the kernels' cvt gives
  return jnp.minimum(magnitude, _E2M1_MAX_BITS), sign << 3


def e2m1_result(magnitude: jnp.ndarray, sign: jnp.ndarray, kept: jnp.ndarray, halves: jnp.ndarray, as_codes: bool
                ) -> jnp.ndarray:
  """A rounding to E2M1 put together from its two ranges, on the bits: `kept`, the rounded magnitude's float32 bits
  >> 22 where the magnitude is at least 1 (E2M1's normal range, where it keeps one of float32's mantissa bits, so
  those bits count the codes 2..7: E2M1_CODE_OFFSET), and `halves`, the rounded magnitude in units of 0.5 below 1
  (uint32: 0, 1 or 2, which are also its codes); `magnitude` and `sign` as `e2m1_clamped_bits` gives them. With
  `as_codes` the E2M1 bit patterns (uint8, low nibble), else the rounded values (float32). Both roundings
  (nearest-even here, stochastic in rounding.py) and both forms share it, so the codes are the values' float4 cast by
  construction. No step converts between integers and floats: a GPU runs conversions (and rounding to an integral
  float) at a fraction of its integer and float32 rate, in passes bound by their instructions (docs/prediction.md)."""
  normal = magnitude >= E2M1_MIN_NORMAL_BITS
  if as_codes:
    return (jnp.where(normal, kept - np.uint32(E2M1_CODE_OFFSET), halves) | sign).astype(jnp.uint8)
  # 0.5 and 1.0 are 2**-1 and 2**0: `halves` counts up the exponent field from 2**-2's.
  small = jnp.where(halves == 0, halves, (halves << _F32_MANTISSA_BITS) + _QUARTER_BITS)  # 0 itself: no constant
  value = jnp.where(normal, kept << E2M1_DROPPED_BITS, small) | (sign << 28)  # the code's bit 3 to float32's bit 31
  return jax.lax.bitcast_convert_type(value, jnp.float32)


def _nearest(y: jnp.ndarray, as_codes: bool) -> jnp.ndarray:
  magnitude, sign = e2m1_clamped_bits(y)
  # From 1 up: 2**21 - 1 plus the kept bit rounds the dropped 22 bits half to even (a carry moves into the exponent,
  # onto the next binade's first point, 2 or 4, which both grids share). Below 1: 2|y| rounded half to even, exact,
  # by one float32 add of 2**23 (where float32's step is 1, the add itself rounds half to even), read off the bits.
  biased = jax.lax.bitcast_convert_type(magnitude, jnp.float32) * np.float32(2.0) + _TWO_POW_23
  kept = (magnitude + np.uint32((1 << (E2M1_DROPPED_BITS - 1)) - 1)
          + ((magnitude >> E2M1_DROPPED_BITS) & np.uint32(1))) >> E2M1_DROPPED_BITS
  halves = jax.lax.bitcast_convert_type(biased, jnp.uint32) - _f32_bits(_TWO_POW_23)
  return e2m1_result(magnitude, sign, kept, halves, as_codes)


def round_to_e2m1_grid(y: jnp.ndarray) -> jnp.ndarray:
  """float32 -> the nearest E2M1 value (ties to the even code), saturating at +-6, as float32 values.

  This is the kernels' cvt.rn.satfinite.e2m1x2 computed on y's bits (`e2m1_result`): NaN becomes +6 (a plain cast
  would give -0), signed zero is kept (a small negative value becomes -0). Casting the result to float4_e2m1fn is
  exact. Why on the bits: a GPU runs the quantizer's element passes bound by their instructions (docs/prediction.md).
  """
  return _nearest(y, as_codes=False)


def e2m1_codes(y: jnp.ndarray) -> jnp.ndarray:
  """float32 -> E2M1 bit patterns (uint8, low nibble): nearest value, ties to the even code, saturating at +-6.

  Equal to `round_to_e2m1_grid(y).astype(E2M1)` bit for bit (NaN -> +6, signed zero kept), without making the value.
  Why: XLA:CPU converts to float4 one scalar at a time, and on a GPU the quantizer's element passes are bound by their
  instructions (docs/prediction.md); this is about 20 integer and float operations an element where rounding on the
  grid and then coding the result took about 37.
  """
  return _nearest(y, as_codes=True)


def pack_e2m1(codes: jnp.ndarray, materialize: bool = True) -> jnp.ndarray:
  """E2M1 bit patterns (uint8, last axis even) -> float4_e2m1fn of the same shape, by packing and bitcasting.

  Two codes per byte, the first of each pair in the low nibble: the order in which XLA bitcasts a uint8 into
  two float4 values. This writes the float4 array without XLA:CPU's scalar float4 conversion. The codes are
  materialized first (optimization_barrier): fused into the pairing's strided reads, XLA:CPU's loop over the
  codes' arithmetic stops vectorizing (measured at 2048x2048 f32: 87 ms fused, 20 ms split; the cast: 71 ms).
  `materialize=False` packs in the codes' own pass on a GPU: what a GPU wants (XLA:GPU fuses the pairing into the
  kernel that makes the codes, which then write 4 bits an element instead of 8 and read them back); the CPU
  materializes them either way (`materialized_on_cpu`: a 1x16 quantize_codes of 2048^2 took 17 ms unsplit, 3 split).
  """
  codes = jax.lax.optimization_barrier(codes) if materialize else materialized_on_cpu(codes)
  pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
  packed = pairs[..., 0] | (pairs[..., 1] << 4)
  return jax.lax.bitcast_convert_type(packed, E2M1).reshape(codes.shape)
