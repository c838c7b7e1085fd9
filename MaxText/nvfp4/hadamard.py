# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The Random Hadamard Transform (RHT) TE applies to the wgrad GEMM's inputs (docs/numerics.md#random-hadamard-transform).

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

from MaxText.nvfp4 import formats
from MaxText.nvfp4.formats import BLOCK_SIZE

#: TE's fixed random signs (not re-drawn per step, shared by all layers).
RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)


def rht_matrix(signs: np.ndarray = RHT_SIGNS) -> np.ndarray:
  """R = diag(signs) @ H16 / 4 as float32 (TE's signs by default); entries are exactly +-0.25."""
  h16 = scipy.linalg.hadamard(BLOCK_SIZE).astype(np.float32)
  return (np.asarray(signs, np.float32)[:, None] * h16) / np.float32(4.0)


def _apply_runs(x: jax.Array, matrix: np.ndarray, axis: int = -1, out_dtype: jnp.dtype = jnp.float32) -> jax.Array:
  """Every 16-element run along `axis` times `matrix` (entries +-0.25), accumulated in f32, written as `out_dtype`.

  bf16 input multiplies a bf16 copy of the matrix (exact: +-0.25) with f32 accumulation, as TE's bf16 tensor
  core MMA does and about 2x cheaper on CPU than an f32 product; other input is widened and multiplied in f32
  at full precision. The products are exact either way, only the f32 sums round.

  Runs along an inner axis are transformed in place, never transposing x (the GEMM's wgrad operands x^T and
  dY^T are rotated along M, axis 0 of x and dY): x becomes (B, 16, Q) and each of the B runs-of-rows is
  multiplied by matrix^T from the left, a batched dot_general. That form, unlike an einsum contracting the
  middle axis, keeps XLA:CPU on its fast dot path (2048x2048 bf16: 8 ms vs 82 ms) and runs outside jit too.
  It sums in the same order as the last-axis form for bf16 input (tested bit for bit on f32 sums that round; other
  implementations, TE's MMA or NumPy's BLAS, may differ in the last bit where a sum rounds: docs/numerics.md);
  XLA:CPU's f32 HIGHEST batched dot does not, so f32 input (not a TE case: its RHT kernel takes bf16) is moved
  to the last axis and back.
  """
  axis %= x.ndim
  bf16 = x.dtype == jnp.bfloat16
  if not bf16 and axis != x.ndim - 1:
    return jnp.moveaxis(_apply_runs(jnp.moveaxis(x, axis, -1), matrix), -1, axis)
  kwargs = {} if bf16 else {"precision": jax.lax.Precision.HIGHEST}
  m = jnp.asarray(matrix, jnp.bfloat16 if bf16 else jnp.float32)
  x = x if bf16 else x.astype(jnp.float32)
  if axis == x.ndim - 1:
    runs = x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    y = jnp.einsum("...i,ij->...j", runs, m, preferred_element_type=out_dtype, **kwargs)
    return y.reshape(x.shape)
  runs = x.reshape(-1, BLOCK_SIZE, int(np.prod(x.shape[axis + 1:])))  # (B, 16, Q)
  # (B, j, i); anchored to x (formats.anchored): a broadcast of a constant would be made outside a scanned layer loop
  left = jnp.broadcast_to(formats.anchored(np.asarray(matrix.T, m.dtype), x), (runs.shape[0], BLOCK_SIZE, BLOCK_SIZE))
  y = jax.lax.dot_general(left, runs, (((2,), (1,)), ((0,), (0,))), preferred_element_type=out_dtype, **kwargs)
  return y.reshape(x.shape)


def rht(x: jax.Array, axis: int = -1, signs: np.ndarray = RHT_SIGNS) -> jax.Array:
  """Forward RHT along `axis`, as TE's wgrad operands see it: f32 accumulation, bf16 result.

  Args:
    x: float array whose `axis` is a multiple of 16 (checked by the caller).
    axis: the axis the 16-element runs lie along; rht(x, 0) == rht(x.T).T for a matrix.
    signs: the sign vector (TE's; another one only to model a faulty transform, MaxText.selfcheck).

  Returns:
    bfloat16 array of x's shape (round-to-nearest-even of the f32 result).
  """
  matrix = rht_matrix(signs)
  # bf16 input (TE's case): the dot writes bf16 itself, rounding its f32 sums once (a GPU GEMM's epilogue), so no f32
  # copy of the operand is written out and read back. Other input: the f32 sums, rounded to bf16 afterwards.
  # An exact-zero sum is +0, as in TE's MMA (its accumulator starts at +0, and +0 + -0 = +0), whatever the signs of
  # the zero terms: a dot's accumulation starts at +0 too, on every backend, so no pass of its own restores the sign.
  return (_apply_runs(x, matrix, axis, jnp.bfloat16) if x.dtype == jnp.bfloat16
          else _apply_runs(x, matrix, axis).astype(jnp.bfloat16))


def rht_sums(x: jax.Array, axis: int = -1, signs: np.ndarray = RHT_SIGNS) -> jax.Array:
  """The RHT's float32 sums before their bf16 rounding (`rht` rounds these): one summation order of 16 exact
  products, XLA's dot's on this platform."""
  return _apply_runs(x, rht_matrix(signs), axis)


def inverse_rht(y: jax.Array) -> jax.Array:
  """Undoes `rht` up to its bf16 rounding, in f32: x_run = y_run @ R.T (R is orthogonal)."""
  return _apply_runs(y.astype(jnp.float32), rht_matrix().T)
