# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The emulated backend's core GEMM in the pipeline: the forward-only switch on its own VJP parts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.backends.emulated import core, unquantized
from MaxText.backends.stages import forward_switch
from MaxText.nvfp4.gemm import GemmRecipe, nvfp4_dot_general

_KEY = jax.random.key(7)


def _bits(a: jax.Array) -> np.ndarray:
  return np.asarray(a).view(np.uint16 if a.dtype == jnp.bfloat16 else np.uint32)


@pytest.mark.parametrize("rhs_dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("recipe", [GemmRecipe(), GemmRecipe(rht=False, weight_2d=False)], ids=["te_nvfp4", "w1d"])
def test_forward_switch_on_the_emulated_core(rhs_dtype, recipe):
  """A traced flag, compiled once: true gives the unquantized forward bit for bit, and dgrad and wgrad are the NVFP4
  GEMM's bit for bit whichever forward ran; false is nvfp4_dot_general itself."""
  dims = (((2,), (0,)), ((), ()))
  x = jax.random.normal(jax.random.key(0), (2, 32, 64), jnp.bfloat16)
  w = (jax.random.normal(jax.random.key(1), (64, 2, 48), jnp.float32) * 0.2).astype(rhs_dtype)
  dy = jax.random.normal(jax.random.key(2), (2, 32, 2, 48), jnp.bfloat16)
  traces = []

  @jax.jit
  def run(x, w, dy, flag):
    traces.append(1)
    gemm = forward_switch(core(x, w, dims, recipe), unquantized(dims), flag)
    y, pullback = jax.vjp(lambda x, w: gemm(x, w, _KEY), x, w)
    return (y, *pullback(dy))

  def today(x, w, dy):
    y, pullback = jax.vjp(lambda x, w: nvfp4_dot_general(x, w, dims, key=_KEY, recipe=recipe), x, w)
    return (y, *pullback(dy))

  on, off = run(x, w, dy, jnp.bool_(True)), run(x, w, dy, jnp.bool_(False))
  assert len(traces) == 1
  ref = jax.jit(today)(x, w, dy)
  want = jax.lax.dot_general(x, w, dims).astype(x.dtype)
  assert on[0].dtype == x.dtype and on[0].shape == want.shape
  np.testing.assert_array_equal(_bits(on[0]), _bits(want))
  assert not np.array_equal(_bits(off[0]), _bits(on[0]))  # the NVFP4 forward really differs
  for got_off, expected in zip(off, ref):
    np.testing.assert_array_equal(_bits(got_off), _bits(expected))
  for got_on, expected in zip(on[1:], ref[1:]):  # dx, dW: NVFP4, whichever forward ran
    np.testing.assert_array_equal(_bits(got_on), _bits(expected))


def test_after_the_switch_only_the_bf16_forward_gemm_runs():
  """The emulated core's forward output in training (the VJP's forward, what a train step runs) comes from its own
  VJP parts under the switch's `lax.cond`: the NVFP4 fprop (x quantized along K, and its GEMM) sits in the branch
  not taken, so one forward GEMM runs per step."""
  dims = (((1,), (0,)), ((), ()))
  x = jax.ShapeDtypeStruct((64, 128), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((128, 32), jnp.bfloat16)

  def forward(x, w, flag):
    gemm = forward_switch(core(x, w, dims, GemmRecipe()), unquantized(dims), flag)
    return jax.vjp(lambda x, w: gemm(x, w, _KEY), x, w)[0]

  traced = jax.make_jaxpr(forward)(x, w, jax.ShapeDtypeStruct((), jnp.bool_))

  def dots(jaxpr):  # the dot_generals `jaxpr` runs at its level: its own and those of the jitted functions it calls
    inlined = (dots(e.params["jaxpr"].jaxpr) if e.primitive.name in ("jit", "pjit") else [e] for e in jaxpr.eqns)
    return [e for group in inlined for e in group if e.primitive.name == "dot_general"]

  switches = [e for e in traced.jaxpr.eqns if e.primitive.name == "cond"
              and any(dots(b.jaxpr) for b in e.params["branches"])]
  assert len(switches) == 1  # the forward GEMMs: one per branch, the NVFP4 one (and its x quantization) inside
  assert [len(dots(b.jaxpr)) for b in switches[0].params["branches"]] == [1, 1]
  assert dots(traced.jaxpr) == []  # no forward GEMM outside the switch (the RHT of x^T is butterflies, not a dot)
