# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The fused backend's GEMM (block_gemm=scaled_matmul_gemm): codes and block scales into `jax.nn.scaled_matmul`,
against the emulated backend's dot on dequantized operands (block_gemm=None), which tests/nvfp4/gemm_test.py holds against
the f32 reference. The quantization is shared (MaxText.nvfp4.block_scaled._rounded); what may differ is only the order
of the f32 accumulation, and on XLA:CPU that is the same: measured bit for bit, and asserted so."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.nvfp4.block_scaled import quantize_block_scaled, quantize_codes
from MaxText.nvfp4.gemm import GemmRecipe, nvfp4_dot_general, scaled_matmul_gemm

_KEY = jax.random.key(7)
#: A fused gate/up kernel (embed, 2, mlp) as DenseGeneral passes it: N is both activations.
_DIMS = (((2,), (0,)), ((), ()))
_RECIPES = {"recipe": GemmRecipe(), "1d_no_rht_nearest": GemmRecipe(weight_2d=False, rht=False,
                                                                     stochastic_rounding=False)}


def _operands(seed: int = 0):
  kx, kw, kd = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(kx, (2, 48, 64), jnp.float32).astype(jnp.bfloat16)
  w = jax.random.normal(kw, (64, 2, 32), jnp.float32) * 0.1
  dy = jax.random.normal(kd, (2, 48, 2, 32), jnp.float32).astype(jnp.bfloat16)
  return x, w, dy


@functools.partial(jax.jit, static_argnums=(3, 4))
def _vjp(x, w, dy, recipe, block_gemm):
  y, pullback = jax.vjp(lambda x, w: nvfp4_dot_general(x, w, _DIMS, key=_KEY, recipe=recipe, block_gemm=block_gemm),
                        x, w)
  return (y, *pullback(dy))


def _bits(a: jax.Array) -> np.ndarray:
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


@pytest.mark.parametrize("recipe", list(_RECIPES))
def test_the_block_scaled_gemm_equals_the_emulated_gemm(recipe):
  x, w, dy = _operands()
  emulated = _vjp(x, w, dy, _RECIPES[recipe], None)
  fused = _vjp(x, w, dy, _RECIPES[recipe], scaled_matmul_gemm)
  for name, a, b in zip(("y", "dx", "dW"), emulated, fused):
    assert a.dtype == b.dtype and np.array_equal(_bits(a), _bits(b)), name


@functools.partial(jax.jit, static_argnames=("scaling", "rht", "axis"))
def _both(x, key, scaling, rht, axis):
  sr = key is not None
  codes = quantize_codes(x, scaling, rht=rht, stochastic_rounding=sr, key=key, axis=axis)
  values, amax = quantize_block_scaled(x, scaling, rht=rht, stochastic_rounding=sr, key=key, axis=axis)
  return codes, values, amax


@pytest.mark.parametrize("scaling,rht,sr,axis", [("1d", False, False, 1), ("1d", True, True, 0), ("2d", False, False, 1),
                                                 ("1d", False, True, 1)])
def test_codes_times_scales_are_the_emulated_operand(scaling, rht, sr, axis):
  """Each layout the GEMM reads (contracting the blocked axis, K last) holds the emulated operand's values; the
  amax is the same. Codes are float4 and scales float8: no dequantized copy is kept."""
  x = jax.random.normal(jax.random.key(3), (64, 32), jnp.float32).astype(jnp.bfloat16)
  codes, values, amax = _both(x, _KEY if sr else None, scaling, rht, axis)
  assert codes.codes.dtype == jnp.float4_e2m1fn and codes.scales.dtype == jnp.float8_e4m3fn
  assert np.array_equal(np.asarray(codes.amax), np.asarray(amax))
  for contract in ((0, 1) if scaling == "2d" else (axis,)):
    c, s = codes.contracting(contract)
    rebuilt = (c.astype(jnp.float32).reshape(c.shape[0], -1, 16) * s.astype(jnp.float32)[..., None]).reshape(c.shape)
    want = values.astype(jnp.float32) if contract == 1 else values.astype(jnp.float32).T
    assert np.array_equal(np.asarray(rebuilt), np.asarray(want)), contract


@pytest.mark.parametrize("operand", ["x", "w", "dy"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_nonfinite_operand_is_nonfinite_in_every_gemm_it_enters(operand, bad):
  """float4 holds no NaN: a block holding a NaN or an Inf gets a NaN block scale instead, so y, dx and dW are
  non-finite exactly where the emulated backend's are."""
  x, w, dy = _operands(1)
  x, w, dy = (t.at[(0,) * t.ndim].set(bad) if name == operand else t for name, t in (("x", x), ("w", w), ("dy", dy)))
  emulated = _vjp(x, w, dy, _RECIPES["recipe"], None)
  fused = _vjp(x, w, dy, _RECIPES["recipe"], scaled_matmul_gemm)
  hit = 0
  for name, a, b in zip(("y", "dx", "dW"), emulated, fused):
    finite_a, finite_b = np.isfinite(np.asarray(a, np.float32)), np.isfinite(np.asarray(b, np.float32))
    assert np.array_equal(finite_a, finite_b), name
    assert np.array_equal(np.asarray(a, np.float32)[finite_a], np.asarray(b, np.float32)[finite_b]), name
    hit += int((~finite_b).sum())
  assert hit > 0
