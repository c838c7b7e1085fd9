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
