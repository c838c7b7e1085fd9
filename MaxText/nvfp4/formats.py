# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The block format (`BlockFormat`, its NVFP4 entry), E2M1 encoding and decoding, and the two saturating roundings
every quantizer path shares.

Every number here is a fact of the format or of TransformerEngine's kernels (docs/numerics.md#the-format, #quantize),
written once: the NVFP4 object holds the format's (block size, element grid, scale type and maximum), the module
names below read them off it, and no other module of MaxText writes one of them as a literal.
"""

import dataclasses
import enum
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


class ScaleRule(str, enum.Enum):
  """How a block's scale is made from the block's amax, the one step where block formats differ most.

  RN_SATFINITE (NVFP4, TE's kernels): s = cvt.rn.satfinite(min(bamax * (S_enc * f32(1 / element_max)), FLT_MAX)) in
  the scale dtype, round-to-nearest-even, saturating at scale_max, subnormals kept. A power-of-two rule (MX formats'
  E8M0 scales, floor or ceil of log2) would be another member, with its own branch in `BlockFormat.round_scale`.
  """

  RN_SATFINITE = "rn.satfinite"


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockFormat:
  """A block-scaled format: element grid, block size, block-scale type and rule, and the FP32 tensor scale.

  Why one object: these numbers are one fact each, and the recipe (MaxText.nvfp4.gemm.GemmRecipe) carries the
  format it quantizes to, so a new format or scaling variant is a new instance, not a parallel package. Frozen and
  hashable (no arrays in its fields): it rides in the recipe, a static argument of jit and custom_vjp.
  """

  name: str
  element_dtype: Any  # the storage dtype of an element (jnp.float4_e2m1fn)
  element_magnitudes: tuple[float, ...]  # the non-negative element values, ascending, in code order (codes 0..7)
  block_size: int  # elements per block along the block axis (1D: 1 x block_size; 2D: block_size x block_size tiles)
  scale_dtype: Any  # the storage dtype of a block scale (jnp.float8_e4m3fn)
  scale_max: np.floating  # the largest block scale, in the tensor scale's dtype; the rule saturates there
  scale_rule: ScaleRule
  tensor_scale_dtype: Any = np.float32  # the per-tensor scale S_enc = tensor_scale_range / amax

  @property
  def element_max(self) -> np.floating:
    """The largest element magnitude, in the tensor scale's dtype."""
    return self.tensor_scale_dtype(self.element_magnitudes[-1])

  @property
  def tensor_scale_range(self) -> np.floating:
    """element_max * scale_max: the tensor scale maps the global amax onto the largest value a block scale times an
    element can reach, so S_enc = range / amax and dequantization multiplies by amax / range."""
    return self.tensor_scale_dtype(self.element_max * self.scale_max)

  @property
  def one_over_element_max(self) -> np.floating:
    """1 / element_max rounded to the tensor scale's dtype. The kernels multiply by this constant instead of
    dividing by element_max; (bamax / 6) * S_enc differs from bamax * (S_enc * f32(1/6)) in about 0.2% of blocks."""
    return self.tensor_scale_dtype(1.0) / self.element_max

  @property
  def scale_min_normal(self) -> np.floating:
    """The smallest normal block scale: a scale below it (or 0) has lost precision to the subnormal range."""
    return self.tensor_scale_dtype(jnp.finfo(self.scale_dtype).smallest_normal)

  def round_scale(self, v: jax.Array) -> jax.Array:
    """float32 -> the scale dtype by `scale_rule` (callers pass non-negative, non-NaN values)."""
    if self.scale_rule is ScaleRule.RN_SATFINITE:
      # The clamp comes first because XLA's and ml_dtypes' conversion maps values above the format's largest
      # rounding boundary to NaN (464 for E4M3; the kernels' cvt.rn.satfinite saturates). The rounding is
      # explicit (round_to): consumers widen the scale again, and XLA's GPU compiler drops a narrow-and-widen pair.
      return round_to(jnp.minimum(v, self.scale_max), self.scale_dtype).astype(self.scale_dtype)
    raise NotImplementedError(f"{self.name}: scale rule {self.scale_rule} has no implementation")


#: NVFP4 (docs/numerics.md#the-format): E2M1 elements {0, 0.5, 1, 1.5, 2, 3, 4, 6} (6 = 0b0111 = 1.5 * 2**2), 16
#: per block, one E4M3 (fn: no inf) scale per block, at most 448 (0b0_1111_110 = 1.75 * 2**8; 0b0_1111_111 is NaN),
#: and an FP32 tensor scale S_enc = 6 * 448 / amax = 2688 / amax.
NVFP4 = BlockFormat(name="nvfp4", element_dtype=jnp.float4_e2m1fn,
                    element_magnitudes=(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0), block_size=16,
                    scale_dtype=jnp.float8_e4m3fn, scale_max=np.float32(448.0), scale_rule=ScaleRule.RN_SATFINITE)

# The default format's facts by name, for the code that takes no recipe: the quantizer's kernels below are NVFP4's
# (E2M1 elements, E4M3 scales). Each is read off NVFP4, never written again.

#: Elements per scaling block, along the block axis (1D: 1x16; 2D: 16x16 tiles).
BLOCK_SIZE = NVFP4.block_size

#: Largest FP4 E2M1 magnitude (6).
E2M1_MAX = NVFP4.element_max

#: Largest FP8 E4M3 magnitude (448).
E4M3_MAX = NVFP4.scale_max

#: E2M1_MAX * E4M3_MAX = 2688 (BlockFormat.tensor_scale_range).
TENSOR_SCALE_RANGE = NVFP4.tensor_scale_range

#: 1/6 rounded to float32 (0x3E2AAAAB; BlockFormat.one_over_element_max).
ONE_SIXTH = NVFP4.one_over_element_max

#: float32's largest finite value: the kernels clamp scale products with fminf(., FLT_MAX).
FLT_MAX = np.float32(np.finfo(np.float32).max)

#: The eight E2M1 magnitudes, {0, 0.5, 1, 1.5, 2, 3, 4, 6}, indexed by code (sign bit clear).
E2M1_MAGNITUDES = np.array(NVFP4.element_magnitudes, np.float32)

#: Storage dtypes.
E2M1 = NVFP4.element_dtype
E4M3 = NVFP4.scale_dtype


def next_multiple(value: int, multiple: int = BLOCK_SIZE) -> int:
  """The smallest multiple of `multiple` (default: the NVFP4 block) that is >= value: padding to whole blocks, and
  the nearest fitting size an error message suggests."""
  return -(-value // multiple) * multiple


#: The unsigned integer type of each float width in bytes: what a float's bits are read as (bitcast_convert_type).
UINT_OF_WIDTH = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def anchored(value: Any, like: jnp.ndarray) -> jnp.ndarray:
  """`value` (a constant, or an array) with `like`'s first element made one of its inputs: that element's bits and-ed
  with 0, or-ed into value's bits. The same value bit for bit (NaN and -0 included), but data to JAX.

  Why: under scan_layers, JAX's partial evaluation of the layer loop (for the gradient) computes everything that
  depends on no loop input once, outside the loop, and passes it in. A full-size `jnp.where(p, 2.0, ...)` branch, a
  `zeros`, an `iota` or a constant broadcast against an operand in the quantizer then becomes an array of the
  operand's size per constant, made before the loop and read by every layer (measured on the 8B recipe for 4 x GB300,
  fused backend: about 10 GB per GPU). An anchored scalar, broadcast, stays in the layer's own kernels, where XLA
  folds the `& 0` away and a broadcast costs nothing. Anchor a constant before it is broadcast, never after.
  """
  value = jnp.asarray(value)
  if like.size == 0:
    return value
  first = like.reshape(-1)[0]
  if not jnp.issubdtype(first.dtype, jnp.integer):
    first = jax.lax.bitcast_convert_type(first, UINT_OF_WIDTH[first.dtype.itemsize])
  uint = UINT_OF_WIDTH[value.dtype.itemsize]
  zero = (first & first.dtype.type(0)).astype(uint)
  return jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(value, uint) | zero, value.dtype)


def copysign(magnitude: jnp.ndarray, sign: jnp.ndarray) -> jnp.ndarray:
  """`jnp.copysign` for float32, on the bits: |magnitude| with `sign`'s sign bit (a NaN's too), bit for bit the same.
  Why: jnp.copysign lowers to an abs, a negate, a sign test and a select per element; this is two ands and an or,
  in the quantizer's element passes, which a GPU runs bound by their instructions (docs/prediction.md)."""
  m = jax.lax.bitcast_convert_type(jnp.asarray(magnitude, jnp.float32), jnp.uint32) & np.uint32(0x7FFFFFFF)
  s = jax.lax.bitcast_convert_type(jnp.asarray(sign, jnp.float32), jnp.uint32) & np.uint32(0x80000000)
  return jax.lax.bitcast_convert_type(m | s, jnp.float32)


def fmin_flt_max(v: jnp.ndarray) -> jnp.ndarray:
  """CUDA's fminf(v, FLT_MAX): clamps +inf to FLT_MAX and, like fminf, turns NaN into FLT_MAX.

  The NaN behaviour is why a NaN block yields the largest block scale (448) in TE's kernels instead of a
  NaN scale, which e4m3fn could store but no GEMM could use.
  """
  return jnp.where(jnp.isnan(v), anchored(FLT_MAX, v), jnp.minimum(v, FLT_MAX))


def round_to(v: jnp.ndarray, dtype: Any) -> jnp.ndarray:
  """float32 `v` rounded to the nearest value of the narrower float `dtype` (ties to even, subnormals kept), as
  float32: what `v.astype(dtype).astype(jnp.float32)` means, for finite values within dtype's range (callers clamp).

  Why not that pair of casts: XLA's GPU compiler removes a narrowing cast followed by the widening one (its
  xla_allow_excess_precision, on by default), so on a GPU the value keeps float32's precision: block scales that
  are no E4M3 values, and bf16 operands with float32 bits. XLA:CPU keeps the pair, so no CPU run shows it
  (docs/numerics.md#on-a-gpu). A reduce-precision op is kept by every backend; it flushes the format's subnormals
  to zero, so those are rounded here on their uniform grid (a power-of-two step: exact in float32).
  """
  info = jnp.finfo(dtype)
  if info.nexp >= 8:  # bfloat16: float32's exponent range, one reduce-precision is the whole rounding
    return jax.lax.reduce_precision(v, int(info.nexp), int(info.nmant))
  # One more exponent bit: E4M3 and E2M1 (fn: no infinity) use the top exponent for finite values.
  normal = jax.lax.reduce_precision(v, int(info.nexp) + 1, int(info.nmant))
  step = np.float32(info.smallest_subnormal)
  subnormal = jnp.round(v * (np.float32(1.0) / step)) * step
  return jnp.where(jnp.abs(v) < np.float32(info.smallest_normal), subnormal, normal)


@jax.jit
def divide(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """a / b in float32, correctly rounded (IEEE round-to-nearest-even) on every backend.

  Why not `a / b`: XLA's GPU compiler emits a fast division that can miss the correctly rounded quotient by an ulp,
  where TE's kernels divide exactly; one ulp in S_enc or in a block's encode scale moves E4M3 scales and E2M1 ties
  (docs/numerics.md#on-a-gpu). XLA:CPU divides exactly, so there `a / b` is kept (no cost to the CPU emulation);
  elsewhere `_divide_exactly` runs.
  """
  a = anchored(jnp.asarray(a, jnp.float32), jnp.asarray(b))  # a constant over an operand (1 / s): see `anchored`
  b = anchored(jnp.asarray(b, jnp.float32), a)
  a, b = jnp.broadcast_arrays(a, b)
  return jax.lax.platform_dependent(a, b, cpu=jnp.divide, default=_divide_exactly)


def _divide_exactly(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """a / b correctly rounded whatever the division instruction: the float quotient of the two 24-bit significands
  (each exact in float32) is only an estimate Q0 of the result's significand Q, within three units for a division
  two ulps off; Q = Q0 + d, d the integer nearest (A * 2**k - Q0 * B) / B (ties to the even Q), the remainder
  computed exactly in integers (12-bit limbs). Zero, infinite, NaN or subnormal operands, and quotients
  outside float32's normal range (an amax below 3e-35), take `a / b`. `divide` passes float32 arrays of one shape."""
  abits = jax.lax.bitcast_convert_type(a, jnp.uint32)
  bbits = jax.lax.bitcast_convert_type(b, jnp.uint32)
  ea = ((abits >> 23) & 0xFF).astype(jnp.int32)
  eb = ((bbits >> 23) & 0xFF).astype(jnp.int32)
  ma = ((abits & np.uint32(0x7FFFFF)) | np.uint32(0x800000)).astype(jnp.int32)  # A, B in [2**23, 2**24)
  mb = ((bbits & np.uint32(0x7FFFFF)) | np.uint32(0x800000)).astype(jnp.int32)
  below = ma < mb  # A / B in (0.5, 1): the significand takes one more bit, the exponent one less
  exponent = ea - eb + 127 - below.astype(jnp.int32)  # the quotient's biased exponent
  below_01 = below.astype(jnp.int32)  # arithmetic on the flag, not where(below, constants): see `anchored`
  k = 23 + below_01  # Q = RN(A * 2**k / B) lies in [2**23, 2**24]
  estimate = ma.astype(jnp.float32) / mb.astype(jnp.float32) * (np.float32(2.0**23) * (1 + below_01).astype(jnp.float32))
  q0 = jnp.round(estimate).astype(jnp.int32)
  # A * 2**k in base 2**24 (two limbs; the high one is A >> (24 - k)), and Q0 * B likewise, from 12-bit
  # halves whose products are below 2**24: the difference of the two is small (at most 3.5 B), so int32 holds it.
  a_hi = ma >> (24 - k)
  a_lo = (ma << k) & 0xFFFFFF
  bh, bl = mb >> 12, mb & 0xFFF
  qh, ql = q0 >> 12, q0 & 0xFFF
  mid = qh * bl + ql * bh
  lo = ql * bl + ((mid & 0xFFF) << 12)
  hi = qh * bh + (mid >> 12) + (lo >> 24)
  rem = (a_hi - hi) * (1 << 24) + (a_lo - (lo & 0xFFFFFF))  # A * 2**k - Q0 * B, exactly
  # Q = Q0 + d, d the integer nearest rem / B (|d| <= 3): floor((2 rem + B) / 2B) rounds halves up; a tie goes to
  # the even Q.
  d = jnp.floor_divide(2 * rem + mb, 2 * mb)
  tie = jax.lax.rem(2 * rem + mb, 2 * mb) == 0  # zero iff the floored remainder is; jnp.remainder broadcasts a 1
  best = q0 + d - (tie & (((q0 + d) & 1) == 1)).astype(jnp.int32)
  # Q == 2**24 (a carry) is the next binade's 2**23: adding it to the exponent field does exactly that.
  bits = (exponent.astype(jnp.uint32) << 23) + (best.astype(jnp.uint32) - np.uint32(0x800000))
  bits = bits | ((abits ^ bbits) & np.uint32(0x80000000))
  regular = (ea > 0) & (ea < 255) & (eb > 0) & (eb < 255) & (exponent >= 1) & (exponent <= 253)
  return jnp.where(regular, jax.lax.bitcast_convert_type(bits, jnp.float32), a / b)


def widen(x: jnp.ndarray) -> jnp.ndarray:
  """x as float32, exactly the value x's own dtype holds: the input a kernel reads is a real bf16 tensor, while XLA's
  GPU compiler would hand a float32 producer's unrounded values through a cast to bf16 and back. bfloat16 widens on
  its bits (shifted into float32's upper half: two integer operations an element, where a reduce-precision after the
  cast is several, and a GPU runs the quantizer's passes bound by their instructions); float16 through `round_to`."""
  if x.dtype == jnp.bfloat16:
    wide = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32) << 16
    return jax.lax.bitcast_convert_type(wide, jnp.float32)
  x32 = x.astype(jnp.float32)
  return x32 if x.dtype == jnp.float32 else round_to(x32, x.dtype)


def to_e4m3_satfinite(v: jnp.ndarray) -> jnp.ndarray:
  """float32 -> float8_e4m3fn, round-to-nearest-even, saturating at 448, subnormals kept: NVFP4's scale rule
  (BlockFormat.round_scale). Callers pass non-negative, non-NaN values."""
  return NVFP4.round_scale(v)


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


def materialized_on_cpu(v: jnp.ndarray) -> jnp.ndarray:
  """v, written out before what reads it on XLA:CPU (an optimization_barrier there) and unchanged elsewhere.

  Why: XLA:CPU fuses what a loop reads into the loop, and two things then slow it several times over: a per-block
  computation is run once per element of its block (the E4M3 scale's conversion is software there), and a strided
  read (the codes' pairing) stops the loop's arithmetic from vectorizing. XLA:GPU fuses the same way and wants it:
  per-block work is cheap beside another kernel and another read (docs/prediction.md)."""
  return jax.lax.platform_dependent(v, cpu=jax.lax.optimization_barrier, default=lambda v: v)


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
