# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The NVFP4 GEMM: forward and both gradients against an f32 reference built from quantize/dequantize."""

import functools
import re

import jax
import jax.extend  # noqa: F401  (jax.extend.core.Jaxpr, for walking jaxprs)
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.nvfp4.gemm import MATMUL_DIMS, QUANTIZATION_NAME, GemmRecipe, nvfp4_dot_general
from tests.nvfp4.helpers import dequantized

_KEY = jax.random.key(42)


def _operands(m=64, k=96, n=48, seed=0):
  kx, kw, kd = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
  w = jax.random.normal(kw, (k, n), jnp.float32) * 0.2
  dy = jax.random.normal(kd, (m, n), jnp.float32).astype(jnp.bfloat16)
  return x, w, dy


@functools.partial(jax.jit, static_argnums=3)
def _vjp(x, w, dy, recipe):
  """y, dx and dW of one GEMM, compiled once per shape and recipe (op by op, each of the quantizer's hundred or so
  operations would compile a program of its own: most of this file's time)."""
  y, pullback = jax.vjp(lambda x, w: nvfp4_dot_general(x, w, MATMUL_DIMS, key=_KEY, recipe=recipe), x, w)
  return (y, *pullback(dy))


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("recipe", [GemmRecipe(), GemmRecipe(rht=False), GemmRecipe(stochastic_rounding=False),
                                    GemmRecipe(weight_2d=False)], ids=["te_nvfp4", "no_rht", "no_sr", "w1d"])
def test_matches_quantize_dequantize_reference(recipe):
  """Each GEMM equals the f32 product of the dequantized operands of the spec's table, to f32 rounding."""
  x, w, dy = _operands()
  y, dx, dw = _vjp(x, w, dy, recipe)
  w_scaling = "2d" if recipe.weight_2d else "1d"
  sr = recipe.stochastic_rounding
  k_dgrad, k_wgrad = jax.random.split(_KEY) if sr else (None, None)

  with jax.default_matmul_precision("highest"):  # float32 references: a GPU's default f32 matmul is TF32
    y_ref = dequantized(x) @ dequantized(w.T, scaling=w_scaling).T
    dx_ref = (dequantized(dy, stochastic_rounding=sr, key=k_dgrad)
              @ (dequantized(w.T, scaling=w_scaling).T if recipe.weight_2d else dequantized(w)).T)
    dw_ref = (dequantized(x.T, rht=recipe.rht)
              @ dequantized(dy.T, rht=recipe.rht, stochastic_rounding=sr, key=k_wgrad).T)

  assert y.dtype == jnp.bfloat16 and dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(y_ref.astype(jnp.bfloat16), np.float32),
                             rtol=1e-2, atol=1e-2)  # one bf16 rounding apart at most
  np.testing.assert_allclose(np.asarray(dx, np.float32), np.asarray(dx_ref.astype(jnp.bfloat16), np.float32),
                             rtol=1e-2, atol=1e-2)
  # With RHT, dequantize inverts the transform on each operand; R R^T = I makes the products equal up to the
  # f32 rounding of the inverse transforms.
  np.testing.assert_allclose(np.asarray(dw), np.asarray(dw_ref), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("rht", [True, False])
def test_sanity_bounds_against_bf16(rht):
  """NVFP4 results stay within the error E2M1 implies of the exact products (and are not garbage)."""
  x, w, dy = _operands(128, 256, 128, seed=1)
  y, dx, dw = _vjp(x, w, dy, GemmRecipe(rht=rht))
  xf, wf, dyf = (a.astype(jnp.float32) for a in (x, w, dy))
  assert _rel(y, xf @ wf) < 0.2
  assert _rel(dx, dyf @ wf.T) < 0.25
  assert _rel(dw, xf.T @ dyf) < 0.25


def test_rht_cancels_in_the_weight_gradient():
  """The GEMM never inverts the RHT, yet dW approximates x^T dY as well as without RHT: R R^T = I cancels."""
  x, w, dy = _operands(256, 64, 64, seed=2)
  x = x.at[::37, :].multiply(30)  # token outliers
  exact = x.astype(jnp.float32).T @ dy.astype(jnp.float32)
  errs = {rht: _rel(_vjp(x, w, dy, GemmRecipe(rht=rht, stochastic_rounding=False))[2], exact) for rht in (True, False)}
  assert errs[True] < 0.2 and errs[True] < errs[False] * 1.5, errs


def test_stochastic_rounding_is_deterministic_per_key_and_unbiased_over_keys():
  x, w, dy = _operands(32, 32, 32, seed=3)
  f = jax.jit(lambda k: jax.vjp(lambda w: nvfp4_dot_general(x, w, MATMUL_DIMS, key=k), w)[1](dy)[0])
  np.testing.assert_array_equal(np.asarray(f(jax.random.key(1))), np.asarray(f(jax.random.key(1))))
  assert not np.array_equal(np.asarray(f(jax.random.key(1))), np.asarray(f(jax.random.key(2))))
  mean = np.mean([np.asarray(f(k)) for k in jax.random.split(jax.random.key(0), 64)], axis=0)
  nearest = np.asarray(jax.jit(lambda w: jax.vjp(lambda w: nvfp4_dot_general(
      x, w, MATMUL_DIMS, key=None, recipe=GemmRecipe(stochastic_rounding=False)), w)[1](dy)[0])(w))
  exact = np.asarray(dequantized(x.T, rht=True).T.T @ dy.astype(jnp.float32))
  assert _rel(mean, exact) < _rel(nearest, exact)


@pytest.mark.parametrize("lhs_shape,rhs_shape,dims", [
    ((2, 16, 64), (64, 96), (((2,), (0,)), ((), ()))),  # wi: (batch, seq, embed) x (embed, mlp)
    ((2, 16, 64), (64, 2, 48), (((2,), (0,)), ((), ()))),  # fused wi: (embed, num_activations, mlp)
    ((2, 16, 4, 16), (4, 16, 64), (((2, 3), (0, 1)), ((), ()))),  # attention out: (heads, kv, embed)
])
def test_maxtext_dimension_numbers(lhs_shape, rhs_shape, dims):
  x = jax.random.normal(jax.random.key(0), lhs_shape, jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), rhs_shape, jnp.float32)
  y = jax.jit(lambda x, w: nvfp4_dot_general(x, w, dims, key=_KEY))(x, w)
  ref = jax.lax.dot_general(x.astype(jnp.float32), w, dims, precision=jax.lax.Precision.HIGHEST)  # not TF32 on a GPU
  assert y.shape == ref.shape and y.dtype == x.dtype
  assert _rel(y, ref) < 0.2
  dx, dw = jax.jit(jax.grad(lambda x, w: nvfp4_dot_general(x, w, dims, key=_KEY).astype(jnp.float32).sum(),
                            (0, 1)))(x, w)
  assert dx.shape == x.shape and dw.shape == w.shape and dw.dtype == jnp.float32
  dx_ref, dw_ref = jax.grad(lambda x, w: jax.lax.dot_general(x.astype(jnp.float32), w, dims,
                                                             precision=jax.lax.Precision.HIGHEST).sum(), (0, 1))(x, w)
  assert _rel(dx, dx_ref) < 0.2 and _rel(dw, dw_ref) < 0.25


def _equations(jaxpr, skip=()):
  """Every equation of a jaxpr, recursing into sub-jaxprs (pjit, custom_vjp, ...) except those of primitives named in
  `skip`."""
  for eqn in jaxpr.eqns:
    yield eqn
    if eqn.primitive.name in skip:
      continue
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        inner = getattr(sub, "jaxpr", None)
        if isinstance(inner, jax.extend.core.Jaxpr):
          yield from _equations(inner, skip)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          yield from _equations(sub, skip)


def test_jaxpr_three_gemms_on_fp4_operands_and_named_residuals():
  """fprop + dgrad + wgrad = 3 dot_generals (no hidden high-precision GEMM), operands quantized to e2m1 x e4m3.

  No operand is transposed before it is quantized: x^T and dY^T of wgrad are quantized in place along M.
  """
  x, w, dy = _operands(32, 32, 32)
  gemm = lambda x, w: nvfp4_dot_general(x, w, MATMUL_DIMS, key=_KEY)  # noqa: E731
  jaxpr = jax.make_jaxpr(lambda x, w: jax.vjp(gemm, x, w)[1](dy))(x, w)
  text = str(jaxpr)
  dots = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
  # The RHT of a wgrad operand multiplies its runs by the 16x16 matrix (hadamard.rht_sums: a dot where every order's
  # sum is exact, butterflies of adds elsewhere); every other dot is a GEMM.
  gemms = [e for e in dots if all(v.aval.shape[-2:] != (16, 16) for v in e.invars)]
  assert len(gemms) == 3, [e.invars[1].aval.shape for e in dots]
  # Block-scaled operands in bf16 (exact), accumulated in f32.
  assert all(v.aval.dtype == jnp.bfloat16 for e in gemms for v in e.invars), [e.invars for e in gemms]
  assert all(e.params["preferred_element_type"] == jnp.float32 for e in gemms)
  assert len(dots) - len(gemms) == 4  # x^T and dY^T, each rotated by one dot on each side of its platform choice
  # The one transpose is after quantization: the wgrad dot's lhs, the quantized x^T values written out K-last for
  # XLA:CPU's fast dot (gemm._transposed, a platform_dependent branch, i.e. a cond over the platform index).
  assert not [e for e in _equations(jaxpr.jaxpr, skip=("cond",)) if e.primitive.name == "transpose"]
  laid_out = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "cond"
              and any(i.primitive.name == "transpose" for b in e.params["branches"] for i in _equations(b.jaxpr))]
  assert [[v.aval.shape for v in e.invars[1:]] for e in laid_out] == [[x.shape]]
  assert "float8_e4m3fn" in text and "round" in text  # e4m3 block scales; e2m1 values rounded on the f32 grid
  fwd = str(jax.make_jaxpr(lambda x, w: jax.vjp(lambda x, w: nvfp4_dot_general(x, w, MATMUL_DIMS, key=_KEY), x, w)[0])(x, w))
  assert f"name={QUANTIZATION_NAME}" in fwd


@pytest.mark.parametrize("recipe", [GemmRecipe(), GemmRecipe(weight_2d=False)], ids=["w2d", "w1d"])
def test_the_output_alone_is_the_training_forward_without_the_backwards_operands(recipe):
  """Called where nothing is differentiated (maxtext builds its model several times, each calling every GEMM), the
  GEMM gives the training forward's output bit for bit, and quantizes only what fprop reads: x along K and W's
  fprop copy. Neither x^T with its Hadamard transform nor W's dgrad copy along N (1D weights) is traced."""
  x, w, _ = _operands()
  gemm = lambda x, w: nvfp4_dot_general(x, w, MATMUL_DIMS, key=_KEY, recipe=recipe)  # noqa: E731
  trained = jax.jit(lambda x, w: jax.vjp(gemm, x, w)[0])(x, w)
  np.testing.assert_array_equal(np.asarray(jax.jit(gemm)(x, w), np.float32), np.asarray(trained, np.float32))
  alone = jax.make_jaxpr(gemm)(x, w).jaxpr
  dots = [e for e in _equations(alone) if e.primitive.name == "dot_general"]
  assert len(dots) == 1, [e.invars[1].aval.shape for e in dots]  # the fprop GEMM; no RHT of x^T
  assert str(alone).count("reduce_max") < str(jax.make_jaxpr(lambda x, w: jax.vjp(gemm, x, w)[0])(x, w)).count(
      "reduce_max")  # fewer block amaxes: fewer operands quantized


def test_remat_policy_saves_quantized_residuals():
  """Under jax.checkpoint with save_only_these_names('quantization'), the backward pass re-quantizes less."""
  x, w, dy = _operands(32, 32, 32)

  def loss(x, w, policy):
    f = jax.checkpoint(lambda x, w: nvfp4_dot_general(x, w, MATMUL_DIMS, key=_KEY), policy=policy)
    return jnp.vdot(f(x, w).astype(jnp.float32), dy.astype(jnp.float32))

  counts = {}
  for name, policy in (("save", jax.checkpoint_policies.save_only_these_names(QUANTIZATION_NAME)),
                       ("none", jax.checkpoint_policies.nothing_saveable)):
    counts[name] = str(jax.make_jaxpr(jax.grad(lambda x, w: loss(x, w, policy), (0, 1)))(x, w)).count("reduce_max")
  assert counts["save"] < counts["none"], counts
  g_save = jax.jit(jax.grad(lambda w: loss(x, w, jax.checkpoint_policies.save_only_these_names(QUANTIZATION_NAME))))(w)
  g_none = jax.jit(jax.grad(lambda w: loss(x, w, jax.checkpoint_policies.nothing_saveable)))(w)
  np.testing.assert_array_equal(np.asarray(g_save), np.asarray(g_none))


def test_errors():
  x = jnp.ones((16, 40), jnp.bfloat16)
  with pytest.raises(ValueError, match="K \\(contracting\\) = 40"):
    nvfp4_dot_general(x, jnp.ones((40, 16)), MATMUL_DIMS, key=_KEY)
  with pytest.raises(NotImplementedError, match="batch dimensions"):
    nvfp4_dot_general(jnp.ones((2, 16, 32)), jnp.ones((2, 32, 16)), (((2,), (1,)), ((0,), (0,))), key=_KEY)
  with pytest.raises(ValueError, match="needs a PRNG key"):
    nvfp4_dot_general(jnp.ones((16, 32)), jnp.ones((32, 16)), MATMUL_DIMS, key=None)


# ----------------------------------------------------------------------------- NaN / Inf reach the outputs


@pytest.mark.parametrize("recipe", [GemmRecipe(), GemmRecipe(rht=False, weight_2d=False)], ids=["te_nvfp4", "w1d"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("where", ["x", "w", "dy"])
def test_non_finite_operand_gives_non_finite_outputs(recipe, bad, where):
  """As in a BF16 GEMM, a NaN/Inf in x, W or dY makes every GEMM that reads it non-finite, so NaN checks fire.

  x feeds fprop (y) and wgrad (dW); W feeds fprop and dgrad (dx); dY feeds dgrad and wgrad. Without the GEMM
  operand's NaN blocks, a NaN would be quantized to a finite +6 * 448 (TE's kernels' encoding) and vanish.
  """
  x, w, dy = (np.array(a, np.float32) for a in _operands(64, 96, 48, seed=4))
  {"x": x, "w": w, "dy": dy}[where][17, 33] = bad
  x, dy = jnp.asarray(x, jnp.bfloat16), jnp.asarray(dy, jnp.bfloat16)
  y, dx, dw = _vjp(x, jnp.asarray(w), dy, recipe)
  reads = {"x": (y, dw), "w": (y, dx), "dy": (dx, dw)}[where]
  for out in reads:
    assert not np.all(np.isfinite(np.asarray(out, np.float32)))
  if where == "x":
    assert not np.any(np.isfinite(np.asarray(y, np.float32)[17]))  # the row that read it, as in bf16
  clean = {"x": dx, "w": dw, "dy": y}[where]  # the one output that never reads the bad operand
  assert np.all(np.isfinite(np.asarray(clean, np.float32)))


def test_stochastic_rounding_decides_each_block_of_dy_on_its_own():
  """One key, 32 identical rows of dY (each row its own dgrad blocks): the rounding differs from row to row, so the
  rows of dx = SR(dY) . W^T differ (not one rounding pattern repeated per block position)."""
  x = jnp.ones((32, 64), jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (64, 48), jnp.float32)
  dy = jnp.broadcast_to(jnp.linspace(0.3, 5.7, 48, dtype=jnp.float32), (32, 48)).astype(jnp.bfloat16)
  dx = jax.jit(lambda x, w, dy: jax.vjp(lambda a, b: nvfp4_dot_general(a, b, MATMUL_DIMS, key=jax.random.key(5),
                                                                      recipe=GemmRecipe()), x, w)[1](dy)[0])(x, w, dy)
  assert len({tuple(r) for r in np.asarray(dx, np.float32)}) > 16


def test_on_the_cpu_every_gemm_runs_in_xla_cpus_bf16_library_dot():
  """The emulated backend's speed on a CPU (how users without Blackwell study convergence): XLA:CPU hands a bf16 dot to
  its fast library kernel (YNNPACK) only when the lhs contracts its last axis in memory. The wgrad GEMM x^T . dY
  contracts axis 0 of both; `gemm._transposed` writes x^T out so that it too runs there, where it used to be converted
  to f32 for a dot twice as slow. Read off the compiled program: each dot sits in a YNNPACK fusion."""
  x, w, dy = _operands(64, 96, 48)
  gemm = lambda x, w: nvfp4_dot_general(x, w, MATMUL_DIMS, key=_KEY, recipe=GemmRecipe(rht=False))  # noqa: E731
  text = jax.jit(lambda x, w: jax.vjp(gemm, x, w)[1](dy)).lower(x, w).compile().as_text()
  computations = re.split(r"\n(?=\S)", text)
  with_dots = {c.split()[0] for c in computations if " dot(" in c}
  in_library = set(re.findall(r"calls=(%[\w.-]+), [^\n]*\"__ynn_fusion\"", text))
  assert len(with_dots) == 2 and with_dots <= in_library, (with_dots, in_library)  # dgrad and wgrad
