# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""The pipeline's stages on plain JAX GEMMs (each wraps any differentiable gemm(x, w, extra)): the non-finite guard
and the forward-only switch.

Why here and not only in tests/te: their logic (which operand poisons which output; which forward and which
gradients after the switch) runs on CPU with real numbers; the TE group checks that the same ops sit beside TE's
kernels in the lowered train step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.backends.stages import GUARD_SCOPE, Core, forward_switch, guard


def _gemm(x, w, extra):
  del extra
  return x @ w


@jax.custom_vjp
def _swallowing_gemm(x, w, extra):
  """A GEMM that, like TE's NVFP4 quantizer (its amax ignores NaN), turns non-finite operands into finite ones in
  fprop, dgrad and wgrad: every output is finite whatever the inputs, so only the guard can make them NaN."""
  del extra
  return jnp.nan_to_num(x) @ jnp.nan_to_num(w)


def _swallowing_fwd(x, w, extra):
  return _swallowing_gemm(x, w, extra), (jnp.nan_to_num(x), jnp.nan_to_num(w))


def _swallowing_bwd(residuals, dy):
  x, w = residuals
  dy = jnp.nan_to_num(dy)
  return dy @ w.T, x.T @ dy, None


_swallowing_gemm.defvjp(_swallowing_fwd, _swallowing_bwd)


def _outputs(x, w, dy, gemm=_gemm):
  guarded = guard(gemm)
  y, pullback = jax.vjp(lambda a, b: guarded(a, b, None), x, w)
  dx, dw = pullback(dy)
  return {"y": bool(jnp.all(jnp.isfinite(y))), "dx": bool(jnp.all(jnp.isfinite(dx))),
          "dw": bool(jnp.all(jnp.isfinite(dw)))}


@pytest.mark.parametrize(
    "bad, finite",
    [
        (None, {"y": True, "dx": True, "dw": True}),
        ("x", {"y": False, "dx": True, "dw": False}),  # x feeds fprop and wgrad
        ("w", {"y": False, "dx": False, "dw": True}),  # W feeds fprop and dgrad
        ("dy", {"y": True, "dx": False, "dw": False}),  # dY feeds dgrad and wgrad
    ],
)
@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("gemm", [_gemm, _swallowing_gemm], ids=["plain", "swallowing"])
def test_a_nonfinite_operand_poisons_exactly_the_gemms_it_feeds(bad, finite, value, gemm):
  """With a GEMM that would hide the NaN itself (swallowing), each output is poisoned by the guard alone: y on x or
  W, dx on dY or W, dW on x or dY."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((32, 64)).astype(np.float32)
  w = rng.standard_normal((64, 16)).astype(np.float32)
  dy = rng.standard_normal((32, 16)).astype(np.float32)
  arrays = {"x": x, "w": w, "dy": dy}
  if bad:
    arrays[bad][3, 5] = value  # one element
  assert _outputs(**{k: jnp.asarray(v) for k, v in arrays.items()}, gemm=gemm) == finite


def test_guard_leaves_finite_results_unchanged():
  x = jnp.arange(12.0).reshape(3, 4)
  w = jnp.ones((4, 2))
  y, pullback = jax.vjp(lambda a, b: guard(_gemm)(a, b, None), x, w)
  dx, dw = pullback(jnp.ones((3, 2)))
  np.testing.assert_array_equal(y, x @ w)
  np.testing.assert_array_equal(dx, jnp.ones((3, 2)) @ w.T)
  np.testing.assert_array_equal(dw, x.T @ jnp.ones((3, 2)))


@jax.custom_vjp
def _marked_gemm(x, w, extra):
  """A stand-in for TE's NVFP4 GEMM whose outputs say where they came from: y = 2 x W, dx = 3 dY W^T, dW = 5 x^T dY."""
  del extra
  return 2.0 * (x @ w)


def _marked_fwd(x, w, extra):
  return _marked_gemm(x, w, extra), (x, w)


def _marked_bwd(residuals, dy):
  x, w = residuals
  return 3.0 * (dy @ w.T), 5.0 * (x.T @ dy), None


_marked_gemm.defvjp(_marked_fwd, _marked_bwd)


@pytest.mark.parametrize("switched", [False, True])
def test_forward_switch_changes_the_forward_output_only(switched):
  """nvfp4_bf16_forward_from_step on the TE backend: from the switch step the forward output is the BF16 GEMM's, while
  dgrad and wgrad stay the NVFP4 GEMM's own (its pullback, on its own quantized operands); before it, all NVFP4."""
  rng = np.random.default_rng(1)
  x, w, dy = (jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((8, 16), (16, 4), (8, 4)))
  gemm = forward_switch(Core.from_vjp(_marked_gemm), lambda a, b: a @ b, jnp.asarray(switched))
  y, pullback = jax.jit(lambda a, b: jax.vjp(lambda p, q: gemm(p, q, None), a, b))(x, w)
  dx, dw = pullback(dy)
  np.testing.assert_allclose(y, (1.0 if switched else 2.0) * (x @ w), rtol=1e-6)
  np.testing.assert_allclose(dx, 3.0 * (dy @ w.T), rtol=1e-6)
  np.testing.assert_allclose(dw, 5.0 * (x.T @ dy), rtol=1e-6)


def _guarded_step(x, w, dy):
  """y, dx, dW of the guarded plain GEMM, as one program."""
  y, pullback = jax.vjp(lambda a, b: guard(_gemm)(a, b, None), x, w)
  return (y, *pullback(dy))


def test_the_guard_s_own_operations_run_under_its_named_scope_and_the_gemm_s_do_not(monkeypatch):
  """The pre-flight attributes kernels by name stack (MaxText.preflight.origins): the guard's max|.| checks and
  poisoning products, forward and backward, carry GUARD_SCOPE; the GEMMs it wraps do not. The scope is metadata: with
  jax.named_scope made a no-op the program (without its debug info) and its results are the same, bit for bit."""
  import contextlib  # pylint: disable=import-outside-toplevel
  import re  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(2)
  x, w, dy = (jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((8, 16), (16, 4), (8, 4)))
  x = x.at[1, 2].set(jnp.nan)  # the poison path too
  lowered = jax.jit(_guarded_step).lower(x, w, dy)
  names = re.findall(r'op_name="([^"]*)"', lowered.compile().as_text())
  guard_ops = [n for n in names if re.search(rf"[/(]{GUARD_SCOPE}[/)]", n)]  # jvp(nvfp4_guard)/... outermost
  assert any("reduce_max" in n for n in guard_ops) and any("mul" in n for n in guard_ops)
  assert any("transpose(" in n for n in guard_ops)  # the backward's checks and poison
  assert not [n for n in guard_ops if "dot_general" in n] and [n for n in names if "dot_general" in n]
  scoped = jax.jit(_guarded_step)(x, w, dy)
  monkeypatch.setattr(jax, "named_scope", lambda name: contextlib.nullcontext())
  unscoped = jax.jit(lambda *args: _guarded_step(*args))  # a new function: not jit's cached trace of the scoped one
  unscoped_lowered = unscoped.lower(x, w, dy)
  assert GUARD_SCOPE not in unscoped_lowered.compile().as_text()
  assert unscoped_lowered.as_text(debug_info=False).replace("jit__lambda", "jit__guarded_step") == lowered.as_text(
      debug_info=False)
  for a, b in zip(scoped, unscoped(x, w, dy)):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
