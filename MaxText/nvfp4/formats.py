# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""NVFP4 format facts and the two saturating roundings every quantizer path shares.

Every number here is a fact of the format or of TransformerEngine's kernels (docs/numerics.md#the-format, #quantize);
no other module of the package writes one of them as a literal.
"""

import jax
import jax.numpy as jnp
import numpy as np

#: Elements per scaling block, along the block axis (1D: 1x16; 2D: 16x16 tiles).
BLOCK_SIZE = 16

#: Largest FP4 E2M1 magnitude: 0b0111 = 1.5 * 2**2.
E2M1_MAX = np.float32(6.0)

#: Largest FP8 E4M3 (fn: no inf) magnitude: 0b0_1111_110 = 1.75 * 2**8. 0b0_1111_111 is NaN.
E4M3_MAX = np.float32(448.0)

#: E2M1_MAX * E4M3_MAX = 2688: the tensor scale maps the global amax onto the largest value a block scale
#: times an element can reach, so S_enc = 2688 / amax and dequantization multiplies by amax / 2688.
TENSOR_SCALE_RANGE = np.float32(E2M1_MAX * E4M3_MAX)

#: 1/6 rounded to float32 (0x3E2AAAAB). The kernels multiply by this constant instead of dividing by 6;
#: (bamax / 6) * S_enc differs from bamax * (S_enc * f32(1/6)) in about 0.2% of blocks.
ONE_SIXTH = np.float32(1.0) / E2M1_MAX

#: float32's largest finite value: the kernels clamp scale products with fminf(., FLT_MAX).
FLT_MAX = np.float32(np.finfo(np.float32).max)

#: The eight E2M1 magnitudes, {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)

#: Storage dtypes.
E2M1 = jnp.float4_e2m1fn
E4M3 = jnp.float8_e4m3fn


def next_multiple(value: int, multiple: int = BLOCK_SIZE) -> int:
  """The smallest multiple of `multiple` (default: the NVFP4 block) that is >= value: padding to whole blocks, and
  the nearest fitting size an error message suggests."""
  return -(-value // multiple) * multiple


def fmin_flt_max(v: jnp.ndarray) -> jnp.ndarray:
  """CUDA's fminf(v, FLT_MAX): clamps +inf to FLT_MAX and, like fminf, turns NaN into FLT_MAX.

  The NaN behaviour is why a NaN block yields the largest block scale (448) in TE's kernels instead of a
  NaN scale, which e4m3fn could store but no GEMM could use.
  """
  return jnp.where(jnp.isnan(v), FLT_MAX, jnp.minimum(v, FLT_MAX))


def to_e4m3_satfinite(v: jnp.ndarray) -> jnp.ndarray:
  """float32 -> float8_e4m3fn, round-to-nearest-even, saturating at 448, subnormals kept.

  The clamp comes first because XLA's and ml_dtypes' conversion maps values above 464 to NaN (the
  kernels' cvt.rn.satfinite saturates). Callers pass non-negative, non-NaN values.
  """
  return jnp.minimum(v, E4M3_MAX).astype(E4M3)


def e2m1_grid_step(a: jnp.ndarray) -> jnp.ndarray:
  """Spacing of the E2M1 grid at magnitude a: 0.5 below 2, 1 in [2, 4), 2 from 4 on (float32)."""
  return jnp.where(a >= 4.0, np.float32(2.0), jnp.where(a >= 2.0, np.float32(1.0), np.float32(0.5)))


def round_to_e2m1_grid(y: jnp.ndarray) -> jnp.ndarray:
  """float32 -> the nearest E2M1 value (ties to the even code), saturating at +-6, as float32 values.

  This is the kernels' cvt.rn.satfinite.e2m1x2 computed arithmetically: NaN becomes +6 (a plain cast would
  give -0), signed zero is kept (a small negative value becomes -0). Casting the result to float4_e2m1fn is
  exact.

  Round-half-even of y / step in units of the grid step of y's binade (0.5 below 2, 1 in [2, 4), 2 from 4)
  lands on the even E2M1 code at every tie, because within each binade even multiples of the step are the
  even codes. Carries into the next binade land on its first point (2 or 4), which both grids share.
  """
  a = jnp.minimum(jnp.abs(y), E2M1_MAX)
  step = e2m1_grid_step(a)
  q = jnp.round(a / step) * step  # jnp.round: half to even
  return jnp.where(jnp.isnan(y), E2M1_MAX, jnp.copysign(q, y))


#: Rounding boundaries of the E2M1 magnitudes, in code order, with the side a tie goes to: a magnitude a gets
#: code k = the number of boundaries it passes, where it passes (t, "le") when a > t and (t, "lt") when a >= t.
#: Ties go to the even code: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
_E2M1_BOUNDARIES = ((0.25, "le"), (0.75, "lt"), (1.25, "le"), (1.75, "lt"), (2.5, "le"), (3.5, "lt"), (5.0, "le"))


def e2m1_codes(y: jnp.ndarray) -> jnp.ndarray:
  """float32 -> E2M1 bit patterns (uint8, low nibble): nearest value, ties to the even code, saturating at +-6.

  Equal to `round_to_e2m1_grid(y).astype(E2M1)` bit for bit (NaN -> +6, signed zero kept) at a fraction of the
  cost: XLA:CPU converts to float4 one scalar at a time, while these are 7 vectorized compares. Each compare is
  written negated (not a <= t) so that NaN, which fails every compare, passes every boundary and gets code 7.
  """
  a = jnp.abs(y)
  code = jnp.zeros(y.shape, jnp.uint8)
  for t, side in _E2M1_BOUNDARIES:
    stays = (a <= np.float32(t)) if side == "le" else (a < np.float32(t))
    code = code + jnp.logical_not(stays).astype(jnp.uint8)
  negative = jnp.signbit(y) & jnp.logical_not(jnp.isnan(y))
  return code | (negative.astype(jnp.uint8) << 3)


def pack_e2m1(codes: jnp.ndarray) -> jnp.ndarray:
  """E2M1 bit patterns (uint8, last axis even) -> float4_e2m1fn of the same shape, by packing and bitcasting.

  Two codes per byte, the first of each pair in the low nibble: the order in which XLA bitcasts a uint8 into
  two float4 values. This writes the float4 array without XLA:CPU's scalar float4 conversion. The codes are
  materialized first (optimization_barrier): fused into the pairing's strided reads, XLA:CPU's loop over the
  codes' arithmetic stops vectorizing (measured at 2048x2048 f32: 87 ms fused, 20 ms split; the cast: 71 ms).
  """
  codes = jax.lax.optimization_barrier(codes)
  pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
  packed = pairs[..., 0] | (pairs[..., 1] << 4)
  return jax.lax.bitcast_convert_type(packed, E2M1).reshape(codes.shape)
