# Copyright 2026 The NVFP4-for-MaxText Authors. Licensed under the Apache License, Version 2.0.
"""The Random Hadamard Transform (RHT) TE applies to the weight-gradient GEMM's inputs (NVFP4_SPEC.md §4).

R = diag(s) @ H16 / 4, with H16 the 16x16 Sylvester Hadamard matrix and s TE's fixed sign vector, so every
entry of R is exactly +-0.25 and R is orthogonal (R @ R.T = I). TE applies y = x_run @ R to each run of
16 elements along the GEMM's contracting axis, accumulates in f32 and rounds the result to bf16. Because
both wgrad operands get the same R along the contracting axis, (x R)^T (dY R) = x^T dY: the transform
spreads outliers across the block without changing the product.
"""

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from MaxText.nvfp4.formats import BLOCK_SIZE

#: TE's fixed random signs (not re-drawn per step, shared by all layers).
RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)


def rht_matrix() -> np.ndarray:
  """R = diag(RHT_SIGNS) @ H16 / 4 as float32; entries are exactly +-0.25."""
  h16 = scipy.linalg.hadamard(BLOCK_SIZE).astype(np.float32)
  return (RHT_SIGNS[:, None] * h16) / np.float32(4.0)


def _walsh_hadamard_16(runs: jax.Array) -> jax.Array:
  """H16 @ v for every 16-vector v on the last axis, as 4 butterfly stages (64 adds instead of 256 MACs).

  H16 is the Sylvester matrix, H[i, j] = (-1)^popcount(i & j), a tensor product of four 2x2 [[1, 1],
  [1, -1]] factors, one per bit of the index: each stage combines the pairs that differ in one bit.
  """
  lead = runs.shape[:-1]
  v = runs.reshape(*lead, 2, 2, 2, 2)
  for axis in range(-4, 0):
    lo, hi = jnp.split(v, 2, axis=axis)
    v = jnp.concatenate([lo + hi, lo - hi], axis=axis)
  return v.reshape(*lead, BLOCK_SIZE)


def _runs(x: jax.Array) -> jax.Array:
  return x.astype(jnp.float32).reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)


def rht(x: jax.Array) -> jax.Array:
  """Forward RHT along the last axis, as TE's wgrad operands see it: f32 accumulation, bf16 result.

  y_run = x_run @ R = (H16 @ (s * x_run)) / 4 (H16 is symmetric); the division by 4 is exact.

  Args:
    x: float array whose last axis is a multiple of 16 (checked by the caller).

  Returns:
    bfloat16 array of x's shape (round-to-nearest-even of the f32 result).
  """
  y = _walsh_hadamard_16(_runs(x) * RHT_SIGNS) * np.float32(0.25)
  # An exact-zero sum is +0 in TE's MMA (its accumulator starts at +0 and +0 + -0 = +0), whatever the
  # signs of the zero terms; the butterfly's order could leave -0.
  y = jnp.where(y == 0, np.float32(0.0), y)
  return y.reshape(x.shape).astype(jnp.bfloat16)


def inverse_rht(y: jax.Array) -> jax.Array:
  """Undoes `rht` up to its bf16 rounding, in f32: x_run = y_run @ R.T = s * (H16 @ y_run) / 4."""
  return (_walsh_hadamard_16(_runs(y)) * np.float32(0.25) * RHT_SIGNS).reshape(y.shape)
