# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The RHT: TE's matrix, orthogonality, each output the exact sum rounded to f32 then bf16 (no platform's summation
order), and it cancels in x^T dY."""

import fractions

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import scipy.linalg

from MaxText.nvfp4 import hadamard
from tests.helpers import EXACT_RUN_BINADES, examples


def test_matrix_is_te_signs_times_sylvester_over_four():
  r = hadamard.rht_matrix()
  assert set(np.unique(r)) == {-0.25, 0.25}
  np.testing.assert_array_equal(r @ r.T, np.eye(16, dtype=np.float32))
  np.testing.assert_array_equal(r * 4, np.diag(hadamard.RHT_SIGNS) @ scipy.linalg.hadamard(16))


@pytest.mark.parametrize("axis", [0, 1])
def test_an_exact_zero_sum_is_positive_zero(axis):
  """TE's MMA writes an exact-zero sum as +0 whatever the signs of its zero terms. The hardest case: every product
  x_i * R_ij is -0 (x_i = -0 where R_ij > 0, +0 where R_ij < 0), for each output j of a run in turn."""
  r = hadamard.rht_matrix()
  runs = np.where(r.T > 0, -0.0, 0.0).astype(ml_dtypes.bfloat16)  # row j: the zeros whose products with R[:, j] are -0
  x = runs.reshape(1, 256) if axis == 1 else np.ascontiguousarray(runs.T)  # axis 0: run j is column j
  y = np.asarray(jax.jit(lambda x: hadamard.rht(x, axis))(x)).astype(np.float32)
  assert not np.signbit(y).any()
  assert not np.any(y)


def test_equals_the_f32_dense_product_bit_for_bit():
  x = np.asarray(jax.random.normal(jax.random.key(0), (64, 256), jnp.bfloat16))
  dense = (x.astype(np.float32).reshape(64, 16, 16) @ hadamard.rht_matrix()).reshape(64, 256)
  got = np.asarray(jax.jit(hadamard.rht)(x))
  np.testing.assert_array_equal(got.view(np.uint16), dense.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_round_trip_restores_input():
  x = jax.random.normal(jax.random.key(1), (8, 64), jnp.float32)
  back = hadamard.inverse_rht(hadamard.rht(x))
  np.testing.assert_allclose(np.asarray(back), np.asarray(x), atol=0.02)  # bf16 rounding of the RHT only


def test_cancels_in_the_weight_gradient_product():
  """(x R)^T (dY R) along the token axis M equals x^T dY: both operands rotated along M."""
  kx, kd = jax.random.split(jax.random.key(2))
  x = jax.random.normal(kx, (64, 32), jnp.float32)  # M x K
  dy = jax.random.normal(kd, (64, 48), jnp.float32)  # M x N
  xr = hadamard.rht(x.T).astype(jnp.float32)  # K x M, runs along M
  dyr = hadamard.rht(dy.T).astype(jnp.float32)  # N x M
  np.testing.assert_allclose(np.asarray(xr @ dyr.T), np.asarray(x.T @ dy), rtol=0.02, atol=0.2)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_in_place_along_axis_0_equals_the_transposed_rht(dtype):
  """rht along axis 0 == rht of the transpose, bit for bit, down to the f32 sums before the bf16 rounding, on values
  spanning 2**-10 .. 2**20 with random signs (most of their f32 sums round)."""
  rng = np.random.default_rng(0)
  x = np.exp2(rng.uniform(-10, 20, (96, 48))) * rng.choice([-1, 1], (96, 48))
  x = jnp.asarray(x.astype(np.float32), dtype)
  got = np.asarray(jax.jit(lambda x: hadamard.rht_sums(x, 0))(x))
  want = np.asarray(jax.jit(lambda x: hadamard.rht_sums(x.T).T)(x))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  np.testing.assert_array_equal(np.asarray(hadamard.rht(x, 0)).view(np.uint16),
                                np.asarray(hadamard.rht(x.T).T).view(np.uint16))
  x3 = x.reshape(2, 48, 48)
  got3 = np.asarray(hadamard.rht(x3, 1))  # eagerly, and with a batch axis in front
  want3 = np.asarray(jnp.swapaxes(hadamard.rht(jnp.swapaxes(x3, 1, 2)), 1, 2))
  np.testing.assert_array_equal(got3.view(np.uint16), want3.view(np.uint16))


def _f32_of(v: fractions.Fraction) -> np.float32:
  """The float32 nearest the rational v (ties to even; subnormals included), by exact arithmetic."""
  if v == 0:
    return np.float32(0.0)
  a = abs(v)
  exponent = a.numerator.bit_length() - a.denominator.bit_length()
  exponent -= fractions.Fraction(2) ** exponent > a  # now 2**exponent <= a < 2**(exponent + 1)
  unit = fractions.Fraction(2) ** (max(exponent, -126) - 23)
  return np.float32((1 if v > 0 else -1) * float(round(a / unit) * unit))  # round(): half to even


def _exact_rht_sums(runs: np.ndarray) -> np.ndarray:
  """f32(exact sum) of each output of each run of 16 (the rows of `runs`), in rational arithmetic."""
  columns = [[fractions.Fraction(float(v)) for v in column] for column in hadamard.rht_matrix().T]
  out = np.empty(runs.shape, np.float32)
  for n, run in enumerate(runs.astype(np.float32)):
    terms = [fractions.Fraction(float(v)) for v in run]
    out[n] = [_f32_of(sum((t * m for t, m in zip(terms, column)), fractions.Fraction(0))) for column in columns]
  return out


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(seed=st.integers(0, 2**32 - 1), span=st.integers(0, 32), lowest=st.integers(-116, 90),
                  zeros=st.floats(0, 0.5))
def test_is_the_exact_sum_rounded_to_f32_then_bf16(seed, span, lowest, zeros):
  """Each output is bf16(f32(exact sum of its 16 products)) for runs whose nonzero values span up to 2**33 and stay
  above 2**-117 (the range hadamard.rht_sums proves), wherever some order's f32 sum would round: no platform's
  summation order decides our operands."""
  rng = np.random.default_rng(seed)
  x = rng.choice([-1, 1], (8, 16)) * rng.uniform(1, 2, (8, 16)) * np.exp2(lowest + rng.integers(0, span + 1, (8, 16)))
  x = np.where(rng.uniform(size=x.shape) < zeros, 0.0, x).astype(ml_dtypes.bfloat16)
  want = _exact_rht_sums(x)
  np.testing.assert_array_equal(np.asarray(hadamard.rht_sums(jnp.asarray(x))).view(np.uint32), want.view(np.uint32))
  np.testing.assert_array_equal(np.asarray(hadamard.rht(jnp.asarray(x))).view(np.uint16),
                                want.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_where_a_dot_rounds_by_its_order_ours_is_exact():
  """The self-check's tiny_blocks case (16-token runs holding values of 1e-8..1e-5 beside values near 1): XLA:CPU's
  dot and the exact sums differ on some outputs, and ours are the exact ones. Fails if rht_sums goes back to a dot."""
  rng = np.random.default_rng(3)
  tiny = np.where(rng.uniform(size=(64, 16)) < 0.5, 10.0 ** rng.uniform(-8, -5, (64, 16)), 1.0)
  x = (rng.standard_normal((64, 16)) * tiny).astype(ml_dtypes.bfloat16)
  dot = np.asarray(jnp.einsum("ni,ij->nj", jnp.asarray(x), jnp.asarray(hadamard.rht_matrix(), jnp.bfloat16),
                              preferred_element_type=jnp.float32))
  want = _exact_rht_sums(x)
  assert (dot.view(np.uint32) != want.view(np.uint32)).any()
  np.testing.assert_array_equal(np.asarray(hadamard.rht_sums(jnp.asarray(x))).view(np.uint32), want.view(np.uint32))


def test_a_nonfinite_run_gives_what_every_order_gives():
  """An inf in a run: every output +-inf, by its product's sign; +inf and -inf in one run: NaN where they add, and
  where they cancel by the signs; a NaN: all NaN. The exact path's own error terms (inf - inf) do not leak."""
  runs = np.zeros((3, 16), np.float32)
  runs[0, 3] = np.inf
  runs[1, 0], runs[1, 1] = np.inf, -np.inf
  runs[2, 5] = np.nan
  got = np.asarray(hadamard.rht_sums(jnp.asarray(runs, jnp.bfloat16)))
  with np.errstate(invalid="ignore"):
    want = runs @ hadamard.rht_matrix()  # NumPy's order: for these sums every order agrees
  np.testing.assert_array_equal(got, want)


def _runs_of(x: np.ndarray, axis: int) -> np.ndarray:
  """x's 16-element runs along `axis` as rows (n, 16), in the order of (P, 16, Q) runs."""
  moved = np.moveaxis(np.asarray(x), axis, -1)
  return moved.reshape(-1, 16)


def _exact_path(x: jax.Array, axis: int) -> np.ndarray:
  """The exact path alone over the whole tensor (hadamard._exact_sums), as x's shape: what every run must get."""
  axis %= x.ndim
  p = int(np.prod(x.shape[:axis], dtype=np.int64)) * (x.shape[axis] // 16)
  runs = jnp.asarray(x).reshape(p, 16, int(np.prod(x.shape[axis + 1:], dtype=np.int64)))
  return np.asarray(jax.jit(lambda r: hadamard._exact_sums(r, hadamard.RHT_SIGNS))(runs)).reshape(x.shape)


def _mixed_runs(seed: int, shape: tuple[int, ...], lowest: int, span: int, zeros: float, specials: float,
                crowded: float = 0.0) -> np.ndarray:
  """bf16 values: magnitudes 1..2 times 2**(lowest .. lowest + span) with random signs, a fraction `crowded` of them
  near the top (1.5..2 times 2**(lowest + span): runs whose magnitudes sum near the check's bound), a fraction
  `zeros` +0 or -0, a fraction `specials` +-inf or NaN; with lowest near -133, bf16 subnormals and values below the
  check's 2**-117."""
  rng = np.random.default_rng(seed)
  exponent = np.where(rng.uniform(size=shape) < crowded, span, rng.integers(0, span + 1, shape))
  significand = np.where(exponent == span, rng.uniform(1.5, 2, shape), rng.uniform(1, 2, shape))
  x = rng.choice([-1.0, 1.0], shape) * significand * np.exp2(lowest + exponent)
  x = np.where(rng.uniform(size=shape) < zeros, rng.choice([-0.0, 0.0], shape), x)
  x = np.where(rng.uniform(size=shape) < specials, rng.choice([np.inf, -np.inf, np.nan], shape), x)
  with np.errstate(over="ignore"):  # past bf16's range: infinities too
    return x.astype(ml_dtypes.bfloat16)


#: A run whose products for output 0 (x_i s_i / 4) are [2**24, 2**16, -384, 129, 129, 129] x 2**-40, the rest zero:
#: its exact sum 2**24 + 2**16 + 3 needs 25 bits; summed left to right in float32 it is 2**24 + 2**16, right to left
#: 2**24 + 2**16 + 4, and their bf16 roundings differ too.
_WIDE_RUN = (np.array([2.0**24, 2.0**16, -384, 129, 129, 129] + [0] * 10) * 4 * hadamard.RHT_SIGNS * 2.0**-40)


@hypothesis.settings(max_examples=examples(80), deadline=None)
@hypothesis.given(seed=st.integers(0, 2**32 - 1), lowest=st.integers(-140, 110), span=st.integers(0, 40),
                  zeros=st.floats(0, 0.6), specials=st.sampled_from([0.0, 0.0, 0.01, 0.05]), crowded=st.floats(0, 1),
                  capacity=st.integers(0, 12), axis=st.sampled_from([0, 1]))
@hypothesis.example(seed=0, lowest=-2, span=0, zeros=0.0, specials=0.0, crowded=0.0, capacity=1, axis=1)  # _WIDE_RUN
def test_the_dot_path_equals_the_exact_path_bit_for_bit(seed, lowest, span, zeros, specials, crowded, capacity, axis):
  """rht_sums and rht, whichever path each run takes (the dot where every order's sum is exact, the gathered exact
  path, or the exact path over the whole tensor where more runs fail than `capacity`), equal the exact path over the
  whole tensor bit for bit: wide spans, zeros and -0, infinities and NaN, bf16 subnormals and runs below 2**-117."""
  shape = (48, 4) if axis == 0 else (4, 48)  # 12 runs of 16, along M in place (P, 16, Q) or along the last axis
  x = _mixed_runs(seed, shape, lowest, span, zeros, specials, crowded)
  if axis == 1 and seed == 0 and span == 0:
    x[0, :16] = _WIDE_RUN
  x = jnp.asarray(x)
  want = _exact_path(x, axis)
  got = np.asarray(jax.jit(lambda x: hadamard.rht_sums(x, axis, capacity=capacity))(x))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  bf16 = np.asarray(jax.jit(lambda x: hadamard.rht(x, axis, capacity=capacity))(x))
  np.testing.assert_array_equal(bf16.view(np.uint16), want.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_a_run_some_order_rounds_takes_the_exact_path():
  """_WIDE_RUN fails the check, and its output 0 is the exact sum rounded once (2**24 + 2**16 + 4, not the
  left-to-right 2**24 + 2**16), in float32 and in bf16."""
  run = _WIDE_RUN.astype(ml_dtypes.bfloat16)
  np.testing.assert_array_equal(run.astype(np.float64), _WIDE_RUN)  # bf16 values
  runs = jnp.asarray(np.stack([run, np.ones(16, ml_dtypes.bfloat16)]))
  assert np.asarray(hadamard._every_order_exact(runs.reshape(2, 16, 1), 7)).ravel().tolist() == [False, True]
  got = np.asarray(hadamard.rht_sums(runs))
  want = _exact_rht_sums(np.asarray(runs))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  assert got[0, 0] == np.float32((2.0**24 + 2.0**16 + 4) * 2.0**-40)
  left_to_right = np.float32(0)
  for t in (run.astype(np.float32) * hadamard.rht_matrix()[:, 0]):
    left_to_right = np.float32(left_to_right + t)
  assert left_to_right == np.float32((2.0**24 + 2.0**16) * 2.0**-40)
  assert np.asarray(hadamard.rht(runs))[0, 0] != left_to_right.astype(ml_dtypes.bfloat16)


@hypothesis.settings(max_examples=examples(60), deadline=None)
@hypothesis.given(seed=st.integers(0, 2**32 - 1), lowest=st.integers(-120, 100), span=st.integers(0, 16),
                  zeros=st.floats(0, 0.5), crowded=st.floats(0, 1))
@hypothesis.example(seed=0, lowest=0, span=13, zeros=0.0, crowded=0.5)  # runs one binade past the bound, crowded
def test_the_check_passes_only_runs_every_order_sums_exactly(seed, lowest, span, zeros, crowded):
  """Where _every_order_exact passes a run, the premise of its proof holds, exactly: the products are multiples of one
  q >= 2**-126 (a quarter of the least nonzero term's bf16 ulp) whose magnitudes sum to at most 2**24 q, so every
  order's partial sums are float32 values; its float32 sums left to right, right to left and pairwise, and the dot,
  are each output's exact sum. And it passes every run whose nonzero terms lie within EXACT_RUN_BINADES of each other
  and at or above 2**-117, so the dot is what most runs take."""
  x = _mixed_runs(seed, (32, 16), lowest, span, zeros, 0.0, crowded)
  runs = jnp.asarray(x).reshape(32, 16, 1)
  passed = np.asarray(hadamard._every_order_exact(runs, 7)).ravel()
  magnitude = np.abs(x.astype(np.float64))  # float64 holds every sum below exactly
  nonzero = magnitude > 0
  exponent = np.floor(np.log2(np.where(nonzero, magnitude, 1)))
  q = np.where(nonzero, np.exp2(exponent - 7) / 4, np.inf).min(-1)
  premise = ~nonzero.any(-1) | ((magnitude.sum(-1) / 4 <= 2.0**24 * q) & (q >= 2.0**-126))
  assert premise[passed].all(), np.flatnonzero(passed & ~premise)
  want = _exact_rht_sums(x)[passed]
  products = x.astype(np.float32)[passed][:, :, None] * hadamard.rht_matrix()[None]  # (n, 16 terms, 16 outputs)
  for order in (products, products[:, ::-1]):
    total = np.zeros(want.shape, np.float32)
    for i in range(16):
      total = (total + order[:, i]).astype(np.float32)
    np.testing.assert_array_equal(np.where(total == 0, 0, total).view(np.uint32), want.view(np.uint32))
  pairs = products
  while pairs.shape[1] > 1:
    pairs = (pairs[:, 0::2] + pairs[:, 1::2]).astype(np.float32)
  np.testing.assert_array_equal(np.where(pairs[:, 0] == 0, 0, pairs[:, 0]).view(np.uint32), want.view(np.uint32))
  dot = np.asarray(hadamard._dot_sums(runs, hadamard.RHT_SIGNS))[:, :, 0][passed]
  np.testing.assert_array_equal(dot.view(np.uint32), want.view(np.uint32))
  top = np.where(nonzero, exponent, -np.inf).max(-1)
  # The check reads the least nonzero magnitude one float32 ulp down: a power of two counts a binade lower.
  least = np.nextafter(np.where(nonzero, magnitude, np.inf).min(-1).astype(np.float32), np.float32(0))
  bottom = np.floor(np.log2(np.where(nonzero.any(-1), least, 1).astype(np.float64)))  # float32's log2 rounds
  close = ~nonzero.any(-1) | ((top - bottom <= EXACT_RUN_BINADES) & (bottom >= -117) & (top <= 123))
  np.testing.assert_array_equal(passed, close)


@pytest.mark.parametrize("axis", [0, 1])
def test_more_failing_runs_than_the_capacity_is_still_exact(axis):
  """A tensor of 2048 runs of which most fail the check, past the default capacity (64): the exact path runs over the
  whole tensor, and every output is still the exact path's. Under jax.vmap, where only one of two tensors has too
  many failing runs (the exact path for both), or neither has (the dot for both), each equals its own transform."""
  shape = (64, 512) if axis == 0 else (512, 64)
  wide = jnp.asarray(_mixed_runs(5, shape, -30, 30, 0.1, 0.0))
  failing = np.sum(~np.asarray(hadamard._every_order_exact(
      wide.reshape(4, 16, 512) if axis == 0 else wide.reshape(-1, 16, 1), 7)))
  assert failing > max(hadamard.MIN_CAPACITY, 2048 * hadamard.CAPACITY_FRACTION)  # the default capacity
  got = np.asarray(jax.jit(lambda x: hadamard.rht_sums(x, axis))(wide))
  want = _exact_path(wide, axis)
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  calm = jnp.asarray(_mixed_runs(6, shape, -3, 6, 0.1, 0.0))
  calm_too = _mixed_runs(7, shape, -3, 6, 0.1, 0.0)
  first = (0, slice(0, 30)) if axis == 0 else (slice(0, 30), 0)  # an element of each of 30 runs
  calm_too[first] *= 2.0**-20  # 30 failing runs, within the capacity
  calm_too = jnp.asarray(calm_too)
  assert 0 < np.sum(~np.asarray(hadamard._every_order_exact(calm_too.reshape(-1, 16, 1), 7))) <= 64
  mapped = jax.jit(jax.vmap(lambda x: hadamard.rht(x, axis)))
  for pair in ((calm, wide), (calm, calm_too)):  # one branch for both: the exact path, then the dot
    for one, tensor in zip(np.asarray(mapped(jnp.stack(pair))), pair):
      want = _exact_path(tensor, axis).astype(ml_dtypes.bfloat16)
      np.testing.assert_array_equal(one.view(np.uint16), want.view(np.uint16))


@hypothesis.settings(max_examples=examples(60), deadline=None)
@hypothesis.given(seed=st.integers(0, 2**32 - 1), lowest=st.integers(-100, 80), span=st.integers(0, 40),
                  zeros=st.floats(0, 0.6), crowded=st.floats(0, 1))
@hypothesis.example(seed=0, lowest=-2, span=0, zeros=0.0, crowded=0.0)  # _WIDE_RUN in the first run
@hypothesis.example(seed=0, lowest=80, span=40, zeros=0.0, crowded=1.0)  # sums near float32's largest
def test_the_butterflies_are_exact_where_every_order_is_and_within_the_bound_elsewhere(seed, lowest, span, zeros,
                                                                                      crowded):
  """_butterfly_sums (Order.PLATFORM off CPU, the fused backend's RHT): the exact sum's bf16 on every output of a run
  `_every_order_exact` passes, and elsewhere a float32 sum in some order: within 2 gamma_15 of the sum of the
  products' magnitudes around the exact sum (Higham's bound, which every order keeps), then rounded to bf16. Values
  up to 2**121 (a partial sum past float32's range is infinite in some orders and not in others)."""
  x = _mixed_runs(seed, (48, 4), lowest, span, zeros, 0.0, crowded)
  if seed == 0 and span == 0:
    x[:16, 0] = _WIDE_RUN
  runs = jnp.asarray(x).reshape(3, 16, 4)
  got = np.asarray(jax.jit(lambda r: hadamard._butterfly_sums(r, hadamard.RHT_SIGNS, jnp.float32))(runs))
  want = np.asarray(jax.jit(lambda r: hadamard._exact_sums(r, hadamard.RHT_SIGNS))(runs))
  passes = np.asarray(jax.jit(lambda r: hadamard._every_order_exact(r, 7))(runs))[:, None, :]
  np.testing.assert_array_equal(np.where(passes, got, 0).view(np.uint32), np.where(passes, want, 0).view(np.uint32))
  terms = np.asarray(runs, np.float64) * hadamard.RHT_SIGNS[None, :, None] / 4
  matrix = scipy.linalg.hadamard(16).astype(np.float64)
  exact = np.einsum("pic,ij->pjc", terms, matrix)
  magnitudes = np.einsum("pic,ij->pjc", np.abs(terms), np.abs(matrix))
  u = 2.0**-24
  assert np.all(np.abs(got - exact) <= 2 * (15 * u / (1 - 15 * u)) * magnitudes)
  bf16 = np.asarray(jax.jit(lambda r: hadamard._butterfly_sums(r, hadamard.RHT_SIGNS))(runs))
  np.testing.assert_array_equal(bf16.view(np.uint16), got.astype(ml_dtypes.bfloat16).view(np.uint16))
