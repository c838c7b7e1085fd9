# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The RHT: TE's matrix, orthogonality, the butterfly equals the dense product, and it cancels in x^T dY."""

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
  """rht along axis 0 == rht of the transpose, bit for bit, down to the f32 sums before the bf16 rounding.

  The values span 2**-10 .. 2**20 with random signs, so most 16-term f32 sums round and their result depends on
  the order of accumulation: the in-place form must add in the same order as the last-axis form.
  """
  rng = np.random.default_rng(0)
  x = np.exp2(rng.uniform(-10, 20, (96, 48))) * rng.choice([-1, 1], (96, 48))
  x = jnp.asarray(x.astype(np.float32), dtype)
  r = hadamard.rht_matrix()
  got = np.asarray(jax.jit(lambda x: hadamard._apply_runs(x, r, 0))(x))  # pylint: disable=protected-access
  want = np.asarray(jax.jit(lambda x: hadamard._apply_runs(x.T, r).T)(x))  # pylint: disable=protected-access
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  np.testing.assert_array_equal(np.asarray(hadamard.rht(x, 0)).view(np.uint16),
                                np.asarray(hadamard.rht(x.T).T).view(np.uint16))
  x3 = x.reshape(2, 48, 48)
  got3 = np.asarray(hadamard.rht(x3, 1))  # eagerly, and with a batch axis in front
  want3 = np.asarray(jnp.swapaxes(hadamard.rht(jnp.swapaxes(x3, 1, 2)), 1, 2))
  np.testing.assert_array_equal(got3.view(np.uint16), want3.view(np.uint16))
