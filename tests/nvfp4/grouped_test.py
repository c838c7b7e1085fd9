# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""NVFP4 expert GEMMs: forward and both gradients against an f32 reference built from quantize/dequantize per
expert (uneven groups, an expert with zero tokens, padding rows), for the grouped and the batched layouts."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.nvfp4.grouped import batched_expert_matmul, grouped_matmul
from tests.nvfp4.helpers import dequantized

K, N = 32, 48
#: Uneven groups, expert 2 empty, 13 padding rows at the end (as maxtext pads the sorted tokens to its tile).
GROUPS = (21, 40, 0, 6)
ROWS = sum(GROUPS) + 13
_KEY = jax.random.key(7)


def _operands(seed=0, rows=ROWS, experts=len(GROUPS)):
  kx, kw, kd = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(kx, (rows, K), jnp.float32).astype(jnp.bfloat16)
  # Expert scales differ by 2e7: one amax over the stack would flush expert 0 (E4M3 scales span 448 to 2**-9).
  w = jax.random.normal(kw, (experts, K, N), jnp.float32) * jnp.array([1e-7, 1.0, 0.5, 2.0][:experts])[:, None, None]
  dy = jax.random.normal(kd, (rows, N), jnp.float32).astype(jnp.bfloat16)
  return x, w, dy


def _pad16(a):
  """Zero rows up to a multiple of 16: the per-expert padding that keeps wgrad blocks inside one expert."""
  return jnp.pad(a, ((0, -a.shape[0] % 16), (0, 0)))


def _reference(x, w, dy, groups, rht):
  """Per expert: the dense recipe from quantize/dequantize (nearest rounding), products in f32 at full precision."""
  hi = jax.lax.Precision.HIGHEST
  ys, dxs, dws, start = [], [], [], 0
  for e, m in enumerate(groups):
    if m == 0:
      dws.append(jnp.zeros((K, N)))
      continue
    xe, dye = x[start:start + m], dy[start:start + m]
    wq = dequantized(w[e], scaling="2d")  # 16x16 tiles, the same weight in fprop and dgrad
    ys.append(jnp.dot(dequantized(xe), wq, precision=hi))
    dxs.append(jnp.dot(dequantized(dye), wq.T, precision=hi))
    xt = dequantized(jnp.asarray(_pad16(xe).T), rht=rht)  # (K, m16) along the expert's tokens, zero-padded
    dyt = dequantized(jnp.asarray(_pad16(dye).T), rht=rht)  # (N, m16)
    dws.append(jnp.dot(xt, dyt.T, precision=hi))
    start += m
  pad = x.shape[0] - start  # rows past every group: output and gradient 0
  y = jnp.concatenate([*ys, jnp.zeros((pad, N))])
  dx = jnp.concatenate([*dxs, jnp.zeros((pad, K))])
  return y, dx, jnp.stack(dws)


def _vjp(fn, x, w, dy):
  y, pullback = jax.vjp(fn, x, w)
  return (y, *pullback(dy))


def _close(got, want, tol=2e-5):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want)) + 1e-30, np.max(np.abs(got - want))


@pytest.mark.parametrize("rht", [True, False], ids=["te_nvfp4", "no_rht"])
def test_grouped_matches_per_expert_reference(rht):
  x, w, dy = _operands()
  recipe = GemmRecipe(rht=rht, stochastic_rounding=False)
  sizes = jnp.array(GROUPS, jnp.int32)
  y, dx, dw = jax.jit(lambda x, w, dy: _vjp(lambda x, w: grouped_matmul(x, w, sizes, key=None, recipe=recipe),
                                             x, w, dy))(x, w, dy)
  y_ref, dx_ref, dw_ref = _reference(x, w, dy, GROUPS, rht)
  assert y.dtype == jnp.bfloat16 and dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
  _close(y.astype(jnp.float32), y_ref, tol=4e-3)  # y and dx are rounded to bf16 (x's dtype), as TE outputs are
  _close(dx.astype(jnp.float32), dx_ref, tol=4e-3)
  for e in range(len(GROUPS)):  # per expert, so the small expert 0 is checked at its own scale
    _close(dw[e], dw_ref[e]) if GROUPS[e] else np.testing.assert_array_equal(dw[e], 0)
  assert not np.any(np.asarray(y[sum(GROUPS):], np.float32)) and not np.any(np.asarray(dx[sum(GROUPS):], np.float32))


def test_per_expert_amax_keeps_a_small_expert_resolved():
  """One amax over the whole E x K x N stack would flush expert 0 (2e7x smaller than expert 3): relative error 1.0
  (measured) instead of NVFP4's usual ~0.14 for random data."""
  x, w, _ = _operands()
  sizes = jnp.array(GROUPS, jnp.int32)
  y = jax.jit(lambda x, w: grouped_matmul(x, w, sizes, key=None, recipe=GemmRecipe(stochastic_rounding=False)))(x, w)
  exact = np.asarray(jnp.dot(x[:21].astype(jnp.float32), w[0], precision=jax.lax.Precision.HIGHEST))
  rel = np.linalg.norm(np.asarray(y[:21], np.float32) - exact) / np.linalg.norm(exact)
  assert rel < 0.2, rel


def test_batched_shared_and_per_expert_tokens_match_reference():
  """sparse_matmul=false layouts: x shared by all experts (dropless einsum) and x per expert (capacity slots)."""
  x, w, dy = _operands(rows=32)
  recipe = GemmRecipe(stochastic_rounding=False)
  dy_e = jnp.stack([dy * (e + 1) for e in range(w.shape[0])])
  batched = jax.jit(lambda x, w, dy: _vjp(lambda x, w: batched_expert_matmul(x, w, key=None, recipe=recipe), x, w, dy))
  y, dx, dw = batched(x, w, dy_e)
  for e in range(w.shape[0]):
    y_ref, dx_ref, dw_ref = _reference(x, w[e:e + 1], dy_e[e], (32,), rht=True)
    _close(y[e].astype(jnp.float32), y_ref, tol=4e-3)
    _close(dw[e], dw_ref[0])
  # dx of a shared x sums every expert's dgrad.
  dx_sum = sum(_reference(x, w[e:e + 1], dy_e[e], (32,), rht=True)[1] for e in range(w.shape[0]))
  _close(dx.astype(jnp.float32), dx_sum, tol=4e-3)
  xs = jnp.stack([x, -x, 2 * x, x[::-1]])  # per-expert slots
  y, _, dw = batched(xs, w, dy_e)
  for e in range(w.shape[0]):
    y_ref, _, dw_ref = _reference(xs[e], w[e:e + 1], dy_e[e], (32,), rht=True)
    _close(y[e].astype(jnp.float32), y_ref, tol=4e-3)
    _close(dw[e], dw_ref[0])


def test_stochastic_rounding_only_in_backward_and_unbiased():
  x, w, dy = _operands()
  sizes = jnp.array(GROUPS, jnp.int32)

  @jax.jit
  def run(key):
    return _vjp(lambda x, w: grouped_matmul(x, w, sizes, key=key, recipe=GemmRecipe()), x, w, dy)

  y0, dx0, dw0 = run(jax.random.key(0))
  y1, dx1, dw1 = run(jax.random.key(1))
  np.testing.assert_array_equal(y0, y1)  # fprop: nearest-even only
  assert not np.array_equal(dx0, dx1) and not np.array_equal(dw0, dw1)
  # E[SR(dY)] = dY: the mean dgrad over keys approaches dY . Wq^T far closer than nearest rounding of dY does.
  mean_dx = np.mean([np.asarray(run(jax.random.key(s))[1], np.float64) for s in range(32)], axis=0)
  nearest = np.asarray(jax.jit(lambda x, w, dy: _vjp(lambda x, w: grouped_matmul(
      x, w, sizes, key=None, recipe=GemmRecipe(stochastic_rounding=False)), x, w, dy))(x, w, dy)[1], np.float64)
  rows = slice(0, 21)  # expert 0
  exact_dy = np.asarray(jnp.dot(dy[rows].astype(jnp.float32), dequantized(w[0], scaling="2d").T,
                                precision=jax.lax.Precision.HIGHEST), np.float64)
  err_sr = np.linalg.norm(mean_dx[rows] - exact_dy)
  err_nearest = np.linalg.norm(nearest[rows] - exact_dy)
  assert err_sr < 0.5 * err_nearest, (err_sr, err_nearest)


def test_group_sizes_must_match_experts():
  x, w, _ = _operands()
  with pytest.raises(ValueError, match="group_sizes"):
    grouped_matmul(x, w, jnp.array([1, 2], jnp.int32), key=None)


def test_stochastic_rounding_decides_each_expert_and_each_block_on_its_own():
  """One key: two experts with the same weights fed the same tokens and output gradients round dY differently
  (keys split per expert), and so do identical rows within one expert (bits per element): their dgrads differ."""
  rows, experts = 32, 2
  w = jnp.broadcast_to(jax.random.normal(jax.random.key(1), (1, K, N), jnp.float32), (experts, K, N))
  x = jnp.ones((rows, K), jnp.bfloat16)
  dy = jnp.broadcast_to(jnp.linspace(0.3, 5.7, N, dtype=jnp.float32), (rows, N)).astype(jnp.bfloat16)
  sizes = jnp.array([rows // 2, rows // 2], jnp.int32)  # rows 0-15 to expert 0, rows 16-31 to expert 1
  gemm = lambda x, w: grouped_matmul(x, w, sizes, key=_KEY, recipe=GemmRecipe(rht=False))  # noqa: E731
  _, dx, _ = jax.jit(lambda x, w, dy: _vjp(gemm, x, w, dy))(x, w, dy)
  dx = np.asarray(dx, np.float32)
  assert not np.array_equal(dx[:16], dx[16:])  # expert 0 vs expert 1, the same inputs
  assert len({tuple(r) for r in dx[:16]}) > 8  # identical rows of one expert
