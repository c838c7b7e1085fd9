# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The Random Hadamard Transform (RHT) TE applies to the wgrad GEMM's inputs (docs/numerics.md#random-hadamard-transform).

R = diag(s) @ H16 / 4, with H16 the 16x16 Sylvester Hadamard matrix and s TE's fixed sign vector, so every
entry of R is exactly +-0.25 and R is orthogonal (R @ R.T = I). TE applies y = x_run @ R to each run of
16 elements along the GEMM's contracting axis, accumulates in f32 and rounds the result to bf16. Because
both wgrad operands get the same R along the contracting axis, (x R)^T (dY R) = x^T dY: the transform
spreads outliers across the block without changing the product.
"""

import enum

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from MaxText.nvfp4 import arithmetic


class Order(enum.StrEnum):
  """How the RHT's 16 float32 products of each output are added (docs/numerics.md#random-hadamard-transform)."""

  EXACT = "exact"
  """f32(exact sum) on every platform: the emulator's value, bit for bit the same everywhere (`rht_sums`)."""
  PLATFORM = "platform"
  """The fastest order per platform: off CPU the four butterfly stages summed plainly (`_butterfly_sums`, one fixed
  pairwise order, fused into the quantizer's kernels), as TE's tensor cores sum in an order of theirs: exact where
  every order is (`_every_order_exact`, the common case), another order's rounding elsewhere, within the interval
  MaxText.nvfp4.audit.rht_interval bounds. On CPU the exact value, so that every CPU test sees the emulator's. What
  the fused backend runs on a GPU: no check, no conditional, no dot."""


#: The transform's length: 16 by the recipe (TE's 16-point RHT), not by the block format's block size, so that a
#: format with 32-element blocks (MXFP4) keeps the recipe's transform instead of changing it silently.
RHT_SIZE = 16

#: TE's fixed random signs (not re-drawn per step, shared by all layers).
RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)


def rht_matrix(signs: np.ndarray = RHT_SIGNS) -> np.ndarray:
  """R = diag(signs) @ H16 / 4 as float32 (TE's signs by default); entries are exactly +-0.25."""
  h16 = scipy.linalg.hadamard(RHT_SIZE).astype(np.float32)
  return (np.asarray(signs, np.float32)[:, None] * h16) / np.float32(4.0)


def _apply_runs(x: jax.Array, matrix: np.ndarray) -> jax.Array:
  """Every 16-element run along the last axis times `matrix`, in float32 at full precision (`inverse_rht`'s
  dequantization: an approximation of x whatever order the dot sums in)."""
  runs = x.astype(jnp.float32).reshape(*x.shape[:-1], x.shape[-1] // RHT_SIZE, RHT_SIZE)
  y = jnp.einsum("...i,ij->...j", runs, jnp.asarray(matrix, jnp.float32), precision=jax.lax.Precision.HIGHEST)
  return y.reshape(x.shape)


def _two_sum(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(s, e) with s = fl(a + b) and s + e = a + b exactly (Knuth's TwoSum: six additions, no branch, no
  multiplication for a compiler to contract into an FMA)."""
  s = a + b
  b_part = s - a
  return s, (a - (s - b_part)) + (b - b_part)


#: How many failing runs (`_every_order_exact`) the exact path takes in one gather beside the dot, as a fraction of a
#: tensor's runs (JAX's shapes are static); past it, the exact path runs over the whole tensor instead of the dot, as
#: it then costs less than the dot and the gathers. Normal bf16 data fails on 0.47% of its runs, Laplace data on
#: 0.95% (2048 x 2048, along either axis): the dot. The wgrad operands of configs/bench_mlp.yml's MLP fail on 0.1-0.7%
#: (its 512-wide ones: the dot) and 4-17% (its 2048-wide ones, the gated activation and its gradient, many values near
#: zero beside larger ones: the whole tensor).
CAPACITY_FRACTION = 1 / 32

#: The least capacity, so that a small tensor's failing runs fit (a tensor of fewer runs gathers them all).
MIN_CAPACITY = 64

#: The widest significand (stored bits) `_every_order_exact` is tried for: bf16 and float16. A float32 run's 24-bit
#: values pass it only where one term holds the whole sum, so float32 input (not TE's case: its RHT kernel reads bf16)
#: takes the exact path throughout.
_CHECKED_BITS = 10

#: The named scope (metadata only) of the exact path over the whole tensor, the branch that runs only where more runs
#: fail the check than the gather holds: a reader of the compiled program (the pre-flight's kernel count, which counts
#: both branches of a conditional) can tell it apart.
EXACT_FALLBACK_SCOPE = "nvfp4_rht_exact_fallback"


def rht_sums(x: jax.Array, axis: int = -1, signs: np.ndarray = RHT_SIGNS, *, capacity: int | None = None) -> jax.Array:
  """The RHT's float32 sums before their bf16 rounding: each output's 16 exact products (x times +-1/4) summed and
  rounded to float32 once, f32(exact sum), in no platform's order (docs/numerics.md#random-hadamard-transform).

  Why not a dot alone: the f32 sum of 16 products rounds when a run's values span more than about 2**12, and its
  bf16 rounding then depends on the order of the additions, which XLA:CPU's dot, XLA:GPU's and TE's tensor cores
  each choose; our operands would depend on the platform. Where a run's products are multiples of one power of two
  q and their magnitudes sum to at most 2**24 q, every partial sum of every order is a multiple of q below 2**24 q,
  a float32: every order's sum is the exact sum. `_every_order_exact` checks that for each run, and there a float32
  dot (`_dot_sums`) is the value. The runs that fail it take `_exact_sums`, gathered (at most `capacity` of them: JAX's
  shapes are static) and scattered back; where more fail, `_exact_sums` runs over the whole tensor instead of the dot.

  Args:
    x: float array whose `axis` is a multiple of 16.
    axis: the axis the 16-element runs lie along, transformed in place (x seen as (P, 16, Q)), never transposed.
    signs: the sign vector.
    capacity: how many failing runs the gather takes (default: CAPACITY_FRACTION of the runs, at least MIN_CAPACITY).

  Returns:
    float32 array of x's shape; an exact-zero sum is +0.
  """
  return _transform(x, axis, signs, jnp.float32, capacity)


def _transform(x: jax.Array, axis: int, signs: np.ndarray, dtype: jnp.dtype, capacity: int | None) -> jax.Array:
  """`rht_sums` rounded to `dtype` (float32: unchanged; bf16: `rht`), each path's sums rounded before they are merged,
  so that no float32 copy of the tensor outlives the dot."""
  axis %= x.ndim
  p = int(np.prod(x.shape[:axis], dtype=np.int64)) * (x.shape[axis] // RHT_SIZE)
  q = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
  runs = x.reshape(p, RHT_SIZE, q)
  bits = int(jnp.finfo(x.dtype).nmant)
  if bits > _CHECKED_BITS or x.size == 0:
    return _exact_sums(runs, signs).astype(dtype).reshape(x.shape)
  n_runs = p * q
  capacity = min(n_runs, max(MIN_CAPACITY, int(n_runs * CAPACITY_FRACTION)) if capacity is None else capacity)
  failing = ~_every_order_exact(runs, bits).reshape(-1)
  few = _in_every_member(jnp.sum(failing.astype(jnp.int32)) <= capacity)

  def dot_path(runs: jax.Array) -> jax.Array:
    y = _dot_sums(runs, signs, dtype)
    index = jnp.nonzero(failing, size=capacity, fill_value=n_runs)[0]  # past the end: dropped by the scatter
    run, column = index // q, index % q
    gathered = runs.at[run, :, column].get(mode="clip")  # (capacity, 16)
    return y.at[run, :, column].set(_exact_sums(gathered[..., None], signs)[..., 0].astype(dtype), mode="drop")

  def exact_path(runs: jax.Array) -> jax.Array:
    with jax.named_scope(EXACT_FALLBACK_SCOPE):
      return _exact_sums(runs, signs).astype(dtype)

  # One branch runs: the dot with the failing runs gathered, where they fit; else the exact path over the whole
  # tensor, which then costs less than the dot and the gathers.
  y = jax.lax.cond(few, dot_path, exact_path, runs)
  return y.reshape(x.shape)


@jax.custom_batching.custom_vmap
def _in_every_member(flag: jax.Array) -> jax.Array:
  """The boolean scalar `flag`; under jax.vmap, whether it holds for every member, one unmapped scalar.

  Why: a lax.cond whose predicate is mapped runs both branches for every member (the expert GEMMs' RHT, mapped over
  the experts by MaxText.nvfp4.grouped, would run the dot and the exact path over every expert's whole tensor). With
  one predicate for all, the cond runs one branch over all members, and either branch is each member's value."""
  return flag


@_in_every_member.def_vmap
def _in_every_member_vmap(axis_size: int, in_batched: list[bool], flag: jax.Array) -> tuple[jax.Array, bool]:
  del axis_size
  return (jnp.all(flag) if in_batched[0] else flag), False


def _every_order_exact(runs: jax.Array, bits: int) -> jax.Array:
  """(P, Q) booleans: True where every float32 summation order of each output's 16 products is exact, with every
  product and partial sum a normal float or zero. `runs` (P, 16, Q) holds values of `bits` stored significand bits.

  A nonzero value of biased exponent e is a multiple of 2**(e - 127 - bits), so with e_min the run's least nonzero
  exponent every product (times +-1/4) is a multiple of q = 2**(e_min - 129 - bits); the magnitudes sum to less than
  16 x 2**(e_max - 126), e_max the run's greatest exponent, a quarter of it for the products. Every partial sum of
  every order is then k q with |k| below 2**(e_max - e_min + 5 + bits), within float32's 24 bits when
  e_max - e_min <= 19 - bits (12 binades for bf16). With e_min >= bits + 3, q >= 2**-126: every nonzero product and
  partial sum is a normal float (the product x / 4 exact; XLA:CPU flushes subnormals to zero, a GPU does not). With
  e_max <= 250 no sum nears float32's range. A run with an infinity or a NaN (exponent 255) fails; an all-zero run
  passes (its sums are zeros)."""
  magnitude = jax.lax.bitcast_convert_type(arithmetic.widen(runs), jnp.uint32) & np.uint32(0x7FFFFFFF)
  # The least nonzero magnitude, on the bits: zero wraps to the largest uint32 under `- 1`, so it never is the least
  # (an all-zero run gets exponent 511); a power of two's exponent drops by one, which only makes the test stricter.
  greatest, least = jax.lax.reduce((magnitude, magnitude - np.uint32(1)), (np.uint32(0), np.uint32(0xFFFFFFFF)),
                                   lambda a, b: (jnp.maximum(a[0], b[0]), jnp.minimum(a[1], b[1])), (1,))
  e_max, e_min = (greatest >> 23).astype(jnp.int32), (least >> 23).astype(jnp.int32)
  return (e_max - e_min <= 19 - bits) & (e_min >= bits + 3) & (e_max <= 250)


def _dot_sums(runs: jax.Array, signs: np.ndarray, dtype: jnp.dtype = jnp.float32) -> jax.Array:
  """Every run of `runs` (P, 16, Q) times R as a dot accumulated in float32 (HIGHEST: no TF32 on a GPU), rounded once
  to `dtype`, exact zeros +0: the RHT's value where `_every_order_exact` holds, whatever order the platform sums in.

  On XLA:CPU, which keeps every cast, the dot reads a bf16 x itself (its products are exact) and writes `dtype`
  directly: its accumulator is float32 and starts at +0, rounded to the output type once (hadamard_test.py's
  test_equals_the_f32_dense_product_bit_for_bit and test_an_exact_zero_sum_is_positive_zero; so too with its library
  dots off), so no float32 copy of the tensor is written out and read back. Elsewhere x is widened on its bits
  (arithmetic.widen: XLA:GPU may hand a float32 producer's unrounded values through a cast to bf16 and back,
  docs/numerics.md#on-a-gpu), the float32 sums' zeros are written +0 (as in TE's MMA, whose accumulator starts at +0;
  a select, where XLA may fold away a `y + 0`), then rounded to `dtype`."""
  matrix = rht_matrix(signs)

  def dot(runs: jax.Array, out: jnp.dtype) -> jax.Array:
    # Anchored (arithmetic.anchored): a broadcast constant would be made outside a scanned layer loop.
    if runs.shape[2] == 1:  # runs along the last axis: one (P, 16) x (16, 16) product
      m = arithmetic.anchored(matrix.astype(runs.dtype), runs)
      return jnp.dot(runs[..., 0], m, precision=jax.lax.Precision.HIGHEST, preferred_element_type=out)[..., None]
    # R^T times each (16, Q) slice from the left, a batched dot: XLA:CPU's fast path, where an einsum contracting the
    # middle axis transposes.
    left = jnp.broadcast_to(arithmetic.anchored(matrix.T.astype(runs.dtype), runs),
                            (runs.shape[0], RHT_SIZE, RHT_SIZE))
    return jax.lax.dot_general(left, runs, (((2,), (1,)), ((0,), (0,))), precision=jax.lax.Precision.HIGHEST,
                               preferred_element_type=out)

  def widened(runs: jax.Array) -> jax.Array:
    y = dot(arithmetic.widen(runs), jnp.float32)
    return jnp.where(y == 0, arithmetic.anchored(np.float32(0), runs), y).astype(dtype)

  if runs.dtype != jnp.bfloat16:
    return widened(runs)
  return jax.lax.platform_dependent(runs, cpu=lambda r: dot(r, dtype), default=widened)


def _exact_sums(runs: jax.Array, signs: np.ndarray) -> jax.Array:
  """f32(exact sum) of every output of every run (P, 16, Q), whatever the run's span: a fast Walsh-Hadamard
  transform (four butterfly stages of sums and differences, the Sylvester H16 being H2 x H2 x H2 x H2) whose every
  addition also yields its exact rounding error (`_two_sum`). The transform is linear, so the errors, carried through
  the later stages in a second float32, add up to exactly what the plain butterflies lost: the exact sum is
  hi + lo, and one last addition rounds it to float32 once. lo is exact whenever a run's largest nonzero magnitude
  is less than 2**33 times its smallest (its terms are multiples of the smallest product's ulp, below 2**24 of them)
  and its smallest is at least 2**-117 (the errors stay normal floats, which XLA:CPU does not flush to zero); tested
  against rational arithmetic in hadamard_test.py. Beyond that the value is still this fixed sequence of float32
  operations, the same on every platform, and within the bound every order keeps (audit.ORDER_BOUND). A run with an
  infinity or a NaN (or a sum past float32's range) keeps the plain butterflies' +-inf or NaN, as any order of the
  sum gives. The butterflies combine the run's 16 slices elementwise, one fusion on every backend: about 30 float32
  operations an element."""
  # x_i s_i / 4 is exact (a power-of-two scale; float32 reaches bf16's smallest subnormal / 4), so R's scale and
  # signs are applied before the sums and H16's +-1 entries are the butterflies' sums and differences.
  # The constants are anchored to x (arithmetic.anchored): a scalar broadcast against the operand would otherwise be made
  # once per constant outside a scanned layer loop, operand-sized.
  runs = arithmetic.widen(runs)
  scale = arithmetic.anchored(np.asarray(signs, np.float32) / np.float32(4), runs)
  zero = arithmetic.anchored(np.float32(0), runs)
  hi = [runs[:, i] * scale[i] for i in range(RHT_SIZE)]
  lo: list[jax.Array] | None = None
  half = RHT_SIZE // 2
  while half >= 1:
    new_hi, new_lo = list(hi), list(hi)
    for start in range(0, RHT_SIZE, 2 * half):
      for i in range(start, start + half):
        j = i + half
        new_hi[i], new_lo[i] = _two_sum(hi[i], hi[j])
        new_hi[j], new_lo[j] = _two_sum(hi[i], -hi[j])
        if lo is not None:
          new_lo[i], new_lo[j] = (lo[i] + lo[j]) + new_lo[i], (lo[i] - lo[j]) + new_lo[j]
    hi, lo = new_hi, new_lo
    half //= 2
  # An exact-zero sum is +0, as in TE's MMA, whose accumulator starts at +0 (+0 + -0 = +0): -0 + -0 gives -0, so
  # zeros are written as +0 (a select: XLA may fold away an `h + 0`).
  sums = [jnp.where(jnp.isfinite(h), jnp.where(h + e == 0, zero, h + e), h) for h, e in zip(hi, lo)]
  return jnp.stack(sums, axis=1)


def _butterfly_sums(runs: jax.Array, signs: np.ndarray, dtype: jnp.dtype = jnp.bfloat16) -> jax.Array:
  """Every run of `runs` (P, 16, Q) times R in float32 by the four butterfly stages of `_exact_sums` without their
  rounding errors, exact zeros +0, rounded once to `dtype`: the sum in one fixed pairwise order, which is exact where
  `_every_order_exact` holds and another order's rounding elsewhere (within audit.ORDER_BOUND). Elementwise over the
  run's 16 slices, so XLA fuses it into the quantizer's kernels instead of launching a dot that writes the transformed
  tensor out: what Order.PLATFORM runs off CPU."""
  runs = arithmetic.widen(runs)
  scale = arithmetic.anchored(np.asarray(signs, np.float32) / np.float32(4), runs)
  zero = arithmetic.anchored(np.float32(0), runs)
  sums = [runs[:, i] * scale[i] for i in range(RHT_SIZE)]
  half = RHT_SIZE // 2
  while half >= 1:
    new = list(sums)
    for start in range(0, RHT_SIZE, 2 * half):
      for i in range(start, start + half):
        new[i], new[i + half] = sums[i] + sums[i + half], sums[i] - sums[i + half]
    sums, half = new, half // 2
  return jnp.stack([jnp.where(s == 0, zero, s) for s in sums], axis=1).astype(dtype)


def rht(x: jax.Array, axis: int = -1, signs: np.ndarray = RHT_SIGNS, *, capacity: int | None = None,
        order: Order = Order.EXACT) -> jax.Array:
  """Forward RHT along `axis`, as TE's wgrad operands see it: bf16(f32(exact sum)) of each output (`rht_sums`), or
  with `order=Order.PLATFORM` off CPU the bf16 of the butterflies' float32 sum (`_butterfly_sums`).

  Args:
    x: float array whose `axis` is a multiple of 16 (checked by the caller).
    axis: the axis the 16-element runs lie along; rht(x, 0) == rht(x.T).T for a matrix.
    signs: the sign vector (TE's; another one only to model a faulty transform, MaxText.selfcheck).
    capacity: as for `rht_sums` (a test's knob; the value does not depend on it).
    order: `Order`.

  Returns:
    bfloat16 array of x's shape (round-to-nearest-even of the float32 sums; an exact-zero sum is +0, as in TE).
  """
  if order is Order.EXACT:
    return _transform(x, axis, signs, jnp.bfloat16, capacity)
  axis %= x.ndim
  runs = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)) * (x.shape[axis] // RHT_SIZE), RHT_SIZE, -1)
  y = jax.lax.platform_dependent(runs, cpu=lambda r: _transform(r, 1, signs, jnp.bfloat16, capacity),
                                 default=lambda r: _butterfly_sums(r, signs))
  return y.reshape(x.shape)


def inverse_rht(y: jax.Array) -> jax.Array:
  """Undoes `rht` up to its bf16 rounding, in f32: x_run = y_run @ R.T (R is orthogonal)."""
  return _apply_runs(y.astype(jnp.float32), rht_matrix().T)
