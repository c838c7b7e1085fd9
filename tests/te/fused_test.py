# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The fused backend's Blackwell GEMM (MaxText.backends.te_gemm) run on CPU: TE's `gemm` on our quantized operands,
through TE's own JAX path (`NVTE_JAX_CUSTOM_CALLS=GemmPrimitive=false`: the same Python code, layouts and scale
handling, with the cuBLASLt call replaced by TE's dequantize + dot), equals `jax.nn.scaled_matmul` on them, so the
fused backend's numbers do not depend on which of the two multiplies (compiled for Blackwell: compile_test.py)."""

from __future__ import annotations

import functools

import pytest

from MaxText.nvfp4.gemm import GemmRecipe

_RECIPES = {"recipe": GemmRecipe(), "1d_no_rht_nearest": GemmRecipe(weight_2d=False, rht=False,
                                                                     stochastic_rounding=False)}


@pytest.mark.parametrize("recipe", list(_RECIPES))
def test_tes_gemm_on_our_operands_equals_scaled_matmul(te, monkeypatch, recipe):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  from MaxText.backends.te_gemm import te_block_scaled_gemm  # pylint: disable=import-outside-toplevel
  from MaxText.nvfp4.gemm import nvfp4_dot_general, scaled_matmul_gemm  # pylint: disable=import-outside-toplevel

  del te
  monkeypatch.setenv("NVTE_JAX_CUSTOM_CALLS", "GemmPrimitive=false")  # read by TE at each call
  kx, kw, kd, key = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(kx, (2, 64, 128), jnp.bfloat16)
  w = jax.random.normal(kw, (128, 256), jnp.float32) * 0.1
  dy = jax.random.normal(kd, (2, 64, 256), jnp.bfloat16)
  dims = (((2,), (0,)), ((), ()))

  @functools.partial(jax.jit, static_argnums=0)
  def vjp(gemm, x, w, dy):
    y, pullback = jax.vjp(lambda x, w: nvfp4_dot_general(x, w, dims, key=key, recipe=_RECIPES[recipe],
                                                         block_gemm=gemm), x, w)
    return (y, *pullback(dy))

  for name, a, b in zip(("y", "dx", "dW"), vjp(scaled_matmul_gemm, x, w, dy), vjp(te_block_scaled_gemm, x, w, dy)):
    assert a.dtype == b.dtype and np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32)), name


def test_tes_gemm_mapped_over_experts_equals_the_batched_scaled_matmul(te, monkeypatch):
  """The fused backend's routed experts (MaxText.backends.experts): each expert's GEMM under jax.vmap. TE's
  GemmPrimitive refuses batching, so te_block_scaled_gemm runs one TE GEMM per expert; the products, with each expert's
  own amaxes, equal jax.nn.scaled_matmul batched over the experts, in fprop, dgrad and wgrad, on the grouped layout."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  from MaxText.backends.te_gemm import te_block_scaled_gemm  # pylint: disable=import-outside-toplevel
  from MaxText.nvfp4.gemm import MATMUL_DIMS, nvfp4_dot_general, scaled_matmul_gemm  # pylint: disable=C0415
  from MaxText.nvfp4.grouped import grouped_matmul  # pylint: disable=import-outside-toplevel

  del te
  monkeypatch.setenv("NVTE_JAX_CUSTOM_CALLS", "GemmPrimitive=false")
  kx, kw, kd, key = jax.random.split(jax.random.key(1), 4)
  x = jax.random.normal(kx, (64, 128), jnp.bfloat16)
  w = jax.random.normal(kw, (3, 128, 128), jnp.float32) * 0.1
  dy = jax.random.normal(kd, (64, 128), jnp.bfloat16)
  sizes = jnp.array([20, 0, 40], jnp.int32)  # an expert with no tokens, and 4 padding rows

  @functools.partial(jax.jit, static_argnums=0)
  def vjp(block_gemm, x, w, dy):
    def expert(x_e, w_e, key_e, extra_e):
      del extra_e
      return nvfp4_dot_general(x_e, w_e, MATMUL_DIMS, key=key_e, recipe=GemmRecipe(), block_gemm=block_gemm)

    y, pullback = jax.vjp(lambda x, w: grouped_matmul(x, w, sizes, key=key, gemm=expert), x, w)
    return (y, *pullback(dy))

  for name, a, b in zip(("y", "dx", "dW"), vjp(scaled_matmul_gemm, x, w, dy), vjp(te_block_scaled_gemm, x, w, dy)):
    assert a.dtype == b.dtype and np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32)), name
