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

from MaxText.nvfp4 import arithmetic
from MaxText.nvfp4.formats import BLOCK_SIZE

#: TE's fixed random signs (not re-drawn per step, shared by all layers).
RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)


def rht_matrix(signs: np.ndarray = RHT_SIGNS) -> np.ndarray:
  """R = diag(signs) @ H16 / 4 as float32 (TE's signs by default); entries are exactly +-0.25."""
  h16 = scipy.linalg.hadamard(BLOCK_SIZE).astype(np.float32)
  return (np.asarray(signs, np.float32)[:, None] * h16) / np.float32(4.0)


def _apply_runs(x: jax.Array, matrix: np.ndarray) -> jax.Array:
  """Every 16-element run along the last axis times `matrix`, in float32 at full precision (`inverse_rht`'s
  dequantization: an approximation of x whatever order the dot sums in)."""
  runs = x.astype(jnp.float32).reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
  y = jnp.einsum("...i,ij->...j", runs, jnp.asarray(matrix, jnp.float32), precision=jax.lax.Precision.HIGHEST)
  return y.reshape(x.shape)


def _two_sum(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(s, e) with s = fl(a + b) and s + e = a + b exactly (Knuth's TwoSum: six additions, no branch, no
  multiplication for a compiler to contract into an FMA)."""
  s = a + b
  b_part = s - a
  return s, (a - (s - b_part)) + (b - b_part)


def rht_sums(x: jax.Array, axis: int = -1, signs: np.ndarray = RHT_SIGNS) -> jax.Array:
  """The RHT's float32 sums before their bf16 rounding: each output's 16 exact products (x times +-1/4) summed and
  rounded to float32 once, f32(exact sum), in no platform's order (docs/numerics.md#random-hadamard-transform).

  Why not a dot: the f32 sum of 16 products rounds when a run's values span more than about 2**12, and its bf16
  rounding then depends on the order of the additions, which XLA:CPU's dot, XLA:GPU's and TE's tensor cores each
  choose; our operands would depend on the platform. Here the emulator fixes the value: a fast Walsh-Hadamard
  transform (four butterfly stages of sums and differences, the Sylvester H16 being H2 x H2 x H2 x H2) whose every
  addition also yields its exact rounding error (`_two_sum`). The transform is linear, so the errors, carried through
  the later stages in a second float32, add up to exactly what the plain butterflies lost: the exact sum is
  hi + lo, and one last addition rounds it to float32 once. lo is exact whenever a run's largest nonzero magnitude
  is less than 2**33 times its smallest (its terms are multiples of the smallest product's ulp, below 2**24 of them)
  and its smallest is at least 2**-117 (the errors stay normal floats, which XLA:CPU does not flush to zero); tested
  against rational arithmetic in hadamard_test.py. Beyond that the value is still this fixed sequence of float32
  operations, the same on every platform, and within the bound every order keeps (audit.ORDER_BOUND). Where every
  order's sum is exact (the common case) it is their common value, what a dot gives. A run with an infinity or a
  NaN (or a sum past float32's range) keeps the plain butterflies' +-inf or NaN, as any order of the sum gives.

  Runs along an inner axis are transformed in place, never transposing x (the wgrad operands x^T and dY^T are
  rotated along M, axis 0 of x and dY): x is seen as (P, 16, Q), and the butterflies combine its 16 slices
  elementwise, one fusion on every backend: about 30 float32 operations an element, where a dot ran on the tensor
  cores (its cost on CPU and in the fused backend's prediction: docs/numerics.md#random-hadamard-transform).
  """
  axis %= x.ndim
  p = int(np.prod(x.shape[:axis], dtype=np.int64)) * (x.shape[axis] // BLOCK_SIZE)
  # arithmetic.widen: the bf16 values themselves, where a cast would let XLA:GPU hand over a float32 producer's unrounded
  # values (docs/numerics.md#on-a-gpu); TE's RHT kernel reads the bf16 tensor.
  runs = arithmetic.widen(x).reshape(p, BLOCK_SIZE, int(np.prod(x.shape[axis + 1:], dtype=np.int64)))
  # x_i s_i / 4 is exact (a power-of-two scale; float32 reaches bf16's smallest subnormal / 4), so R's scale and
  # signs are applied before the sums and H16's +-1 entries are the butterflies' sums and differences.
  # The constants are anchored to x (arithmetic.anchored): a scalar broadcast against the operand would otherwise be made
  # once per constant outside a scanned layer loop, operand-sized.
  scale = arithmetic.anchored(np.asarray(signs, np.float32) / np.float32(4), x)
  zero = arithmetic.anchored(np.float32(0), x)
  hi = [runs[:, i] * scale[i] for i in range(BLOCK_SIZE)]
  lo: list[jax.Array] | None = None
  half = BLOCK_SIZE // 2
  while half >= 1:
    new_hi, new_lo = list(hi), list(hi)
    for start in range(0, BLOCK_SIZE, 2 * half):
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
  return jnp.stack(sums, axis=1).reshape(x.shape)


def rht(x: jax.Array, axis: int = -1, signs: np.ndarray = RHT_SIGNS) -> jax.Array:
  """Forward RHT along `axis`, as TE's wgrad operands see it: bf16(f32(exact sum)) of each output (`rht_sums`).

  Args:
    x: float array whose `axis` is a multiple of 16 (checked by the caller).
    axis: the axis the 16-element runs lie along; rht(x, 0) == rht(x.T).T for a matrix.
    signs: the sign vector (TE's; another one only to model a faulty transform, MaxText.selfcheck).

  Returns:
    bfloat16 array of x's shape (round-to-nearest-even of the float32 sums; an exact-zero sum is +0, as in TE).
  """
  return rht_sums(x, axis, signs).astype(jnp.bfloat16)


def inverse_rht(y: jax.Array) -> jax.Array:
  """Undoes `rht` up to its bf16 rounding, in f32: x_run = y_run @ R.T (R is orthogonal)."""
  return _apply_runs(y.astype(jnp.float32), rht_matrix().T)
