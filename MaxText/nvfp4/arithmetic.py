# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Exact float32 arithmetic on every backend, and the platform choices it takes: correctly rounded division, rounding
to a narrower float that a GPU compiler cannot drop, widening on the bits, and the helpers that keep XLA's fusion from
changing what the quantizer computes (docs/numerics.md#on-a-gpu).

Why apart from the format (MaxText.nvfp4.formats): nothing here is a fact of NVFP4; it is how float32 arithmetic is
made to mean the same on XLA:CPU and XLA:GPU, which any block format's quantizer needs.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: float32's largest finite value: the kernels clamp scale products with fminf(., FLT_MAX).
FLT_MAX = np.float32(np.finfo(np.float32).max)


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


def materialized_on_cpu(v: jnp.ndarray) -> jnp.ndarray:
  """v, written out before what reads it on XLA:CPU (an optimization_barrier there) and unchanged elsewhere.

  Why: XLA:CPU fuses what a loop reads into the loop, and two things then slow it several times over: a per-block
  computation is run once per element of its block (the E4M3 scale's conversion is software there), and a strided
  read (the codes' pairing) stops the loop's arithmetic from vectorizing. XLA:GPU fuses the same way and wants it:
  per-block work is cheap beside another kernel and another read (docs/prediction.md)."""
  return jax.lax.platform_dependent(v, cpu=jax.lax.optimization_barrier, default=lambda v: v)
