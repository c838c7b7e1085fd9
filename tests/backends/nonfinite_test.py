# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""A NaN or Inf never becomes a finite number in an NVFP4 GEMM, seen through maxtext's own DenseGeneral.

TE's quantizer kernels turn a NaN block into scale 448 and element +6 (docs/numerics.md#special-values): trained on,
that would hide a diverging run from maxtext's NaN checks. These tests put a NaN/Inf into the input, the kernel,
and the output gradient of a real maxtext DenseGeneral holding our quant object (the MLP up-projection axes) and
check that the forward output, the input gradient and the kernel gradient are non-finite, as in BF16.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from maxtext.layers import linears

from MaxText.integration.quant import Nvfp4Quantization
from MaxText.precision.modes import Backend
from tests.helpers import settings


def _layer() -> linears.DenseGeneral:
  quant = Nvfp4Quantization(settings=settings(), backend=Backend.EMULATED)
  return linears.DenseGeneral(in_features_shape=64, out_features_shape=128, kernel_axes=("embed", "mlp"),
                              quant=quant, dtype=jnp.bfloat16, rngs=nnx.Rngs(params=0, dropout=1, aqt=2))


@functools.cache
def _compiled():
  """(graphdef, params, rest, jitted forward+vjp): one layer and one compilation shared by every test."""
  graphdef, params, rest = nnx.split(_layer(), nnx.Param, ...)

  @jax.jit
  def run(x, params, rest, dy):
    def f(x, params):
      return nnx.merge(graphdef, params, rest, copy=True)(x)

    y, vjp = jax.vjp(f, x, params)
    dx, dparams = vjp(dy)
    return y, dx, dparams["kernel"].get_value()

  return params, rest, run


def _forward_and_grads(x: jax.Array, kernel_poison: float | None, dy_poison: float | None):
  params, rest, run = _compiled()
  if kernel_poison is not None:
    params = jax.tree.map(lambda v: v, params)  # a copy: the shared params stay clean
    params["kernel"].set_value(params["kernel"].get_value().at[3, 5].set(kernel_poison))
  dy = jnp.ones((32, 128), jnp.bfloat16)
  if dy_poison is not None:
    dy = dy.at[0, 7].set(dy_poison)
  return run(x, params, rest, dy)


def _x(poison: float | None = None) -> jax.Array:
  x = jax.random.normal(jax.random.key(0), (32, 64), jnp.float32)
  if poison is not None:
    x = x.at[2, 9].set(poison)
  return x.astype(jnp.bfloat16)


def _finite(a: jax.Array) -> bool:
  return bool(np.isfinite(np.asarray(a, np.float32)).all())


def test_finite_inputs_stay_finite() -> None:
  y, dx, dw = _forward_and_grads(_x(), None, None)
  assert _finite(y) and _finite(dx) and _finite(dw)


@pytest.mark.parametrize("poison", [np.nan, np.inf], ids=["nan", "inf"])
def test_nonfinite_input_reaches_output_and_gradients(poison) -> None:
  y, dx, dw = _forward_and_grads(_x(poison), None, None)
  assert not _finite(y) and not _finite(dw)


@pytest.mark.parametrize("poison", [np.nan, np.inf], ids=["nan", "inf"])
def test_nonfinite_kernel_reaches_output_and_input_gradient(poison) -> None:
  y, dx, _ = _forward_and_grads(_x(), poison, None)
  assert not _finite(y) and not _finite(dx)


@pytest.mark.parametrize("poison", [np.nan, np.inf], ids=["nan", "inf"])
def test_nonfinite_output_gradient_reaches_both_gradients(poison) -> None:
  y, dx, dw = _forward_and_grads(_x(), None, poison)
  assert _finite(y) and not _finite(dx) and not _finite(dw)
