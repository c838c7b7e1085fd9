# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Each backend's routed-expert GEMMs (MaxText.backends.table.expert_gemms), without maxtext: the fused backend's
multiply each expert's codes and scales in a block-scaled GEMM batched over the experts, and give the emulated
backend's products bit for bit (XLA:CPU's scaled_matmul is a dequantize + dot that accumulates in the same order)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.backends.experts import EXPERT_DIMS, TE_MISSING
from MaxText.backends.table import expert_gemms, expert_plan
from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.precision.modes import Backend
from MaxText.precision.policy import Precision

_KEY = jax.random.key(3)
_SIZES = jnp.array([20, 0, 40], jnp.int32)  # an expert with no tokens, and 4 padding rows of 64


def _operands():
  kx, kw, kd = jax.random.split(jax.random.key(0), 3)
  return (jax.random.normal(kx, (64, 128), jnp.bfloat16), jax.random.normal(kw, (3, 128, 64), jnp.float32) * 0.1,
          jax.random.normal(kd, (64, 64), jnp.bfloat16))


def _grouped_vjp(backend: Backend):
  gemms, recipe = expert_gemms(backend), GemmRecipe()

  def expert(x_e, w_e, key_e, extra_e):
    del extra_e
    return gemms.core(x_e, w_e, EXPERT_DIMS, recipe).call(x_e, w_e, key_e)

  def vjp(x, w, dy):
    y, pullback = jax.vjp(lambda x, w: gemms.grouped(x, w, _SIZES, key=_KEY, recipe=recipe, gemm=expert), x, w)
    return (y, *pullback(dy))

  return vjp


def test_fused_experts_multiply_codes_in_block_scaled_gemms_batched_over_the_experts():
  jaxpr = str(jax.make_jaxpr(_grouped_vjp(Backend.FUSED))(*_operands()))
  # fprop, dgrad and wgrad: one block-scaled GEMM each, batched over the 3 experts (the dequantized dot would be a
  # dot_general instead).
  outputs = re.findall(r":f32\[([\d,]+)\] = scaled_matmul_wrapper", jaxpr)
  assert sorted(outputs) == ["3,128,64", "3,64,128", "3,64,64"], outputs


def test_fused_experts_equal_the_emulated_experts_bit_for_bit():
  operands = _operands()
  fused = jax.jit(_grouped_vjp(Backend.FUSED))(*operands)
  emulated = jax.jit(_grouped_vjp(Backend.EMULATED))(*operands)
  for name, a, b in zip(("y", "dx", "dW"), fused, emulated):
    assert a.dtype == b.dtype and np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32)), name


@pytest.mark.parametrize("backend,words", [(Backend.FUSED, "jax.nn.scaled_matmul mapped over the experts (fused)"),
                                           (Backend.EMULATED, "grouped emulation"), (Backend.TE, TE_MISSING)])
def test_the_plan_names_each_backends_expert_gemms(backend, words):
  assert words in expert_plan(Precision.NVFP4, backend)[1]
