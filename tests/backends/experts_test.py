# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Each backend's routed-expert GEMMs (MaxText.backends.table.expert_gemms), without maxtext: the fused backend's
multiply each expert's codes and scales in a block-scaled GEMM batched over the experts, and give the emulated
backend's products bit for bit (XLA:CPU's scaled_matmul is a dequantize + dot that accumulates in the same order)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.backends.experts import (
  EXPERT_DIMS,
  EXPERT_GEMMS,
  JAX_RAGGED_DOT,
  TE_MISSING,
  ExpertCall,
  expert_call,
  measured_einsum,
)
from MaxText.backends.pipeline import Stages
from MaxText.backends.table import expert_gemms, expert_plan
from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.nvfp4.stats import WGRAD_STAT_NAMES, weight_gradient_stats
from MaxText.precision.modes import Backend
from MaxText.precision.policy import Precision
from MaxText.precision.taps import STATISTICS

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


@pytest.mark.parametrize("transposed", [False, True])
def test_bf16_experts_measured_keep_maxtexts_gemm_and_report_each_expert_s_zero_shares(transposed):
  """BF16 experts whose weight gradients the statistics measure (nvfp4_mlp_precision=bf16): maxtext's own
  ragged_dot on the stack ExpertCall.measured_weight hands back, its outputs and gradients bit for bit, and per
  expert the shares of its dW that are zero; the expert with no token: every entry and every channel (1, 1); dY's
  zero output channels 0-7: those 8 of the 64 channels of every other expert."""
  x, w, dy = _operands()
  dy = dy.at[:, :8].set(0)
  measure = STATISTICS.measure_of(GemmRecipe(), None)
  state = Stages(all_bf16=None, forward_bf16=None, guard=False, taps=(), gradients=((measure.gradient, jnp.bool_(True)),))
  sink = jnp.full((len(EXPERT_GEMMS), 3, 1, len(WGRAD_STAT_NAMES)), 7.0, jnp.float32)
  orient = (lambda a: jnp.swapaxes(a, 1, 2)) if transposed else (lambda a: a)

  def measured(x, w, sink):
    call = ExpertCall(None, GemmRecipe(), None, state, (sink,))
    call.gemms_run = 1  # wi_0 went before: this GEMM is wi_1, the layer's second slot
    return JAX_RAGGED_DOT(x, orient(call.measured_weight(orient(w), transposed=transposed)), _SIZES,
                          preferred_element_type=jnp.float32)

  y, pullback = jax.vjp(measured, x, w, sink)
  dx, dw, rows = pullback(dy.astype(jnp.float32))
  plain_y, plain = jax.vjp(lambda x, w: JAX_RAGGED_DOT(x, w, _SIZES, preferred_element_type=jnp.float32), x, w)
  for got, want in ((y, plain_y), (dx, plain(dy.astype(jnp.float32))[0]), (dw, plain(dy.astype(jnp.float32))[1])):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  rows = np.asarray(rows)
  np.testing.assert_array_equal(rows[[0, 2]], 0.0)  # the slots of GEMMs this call did not run: no cotangent
  for e in range(3):
    np.testing.assert_array_equal(rows[1, e, 0], np.asarray(weight_gradient_stats(dw[e])))
  np.testing.assert_array_equal(rows[1, 1, 0], [1.0, 1.0])
  assert rows[1, 0, 0, 1] == 0.125 and rows[1, 2, 0, 1] == 0.125


def test_bf16_expert_einsum_measured_is_maxtexts_einsum():
  """sparse_matmul=false with measured BF16 experts: quant.einsum's expert einsum is jnp.einsum on the measured stack
  (its value and gradients bit for bit), the routing einsums jnp.einsum itself; each expert's row its dW's shares."""
  x = jax.random.normal(jax.random.key(1), (2, 16, 32), jnp.float32)
  w = jax.random.normal(jax.random.key(2), (3, 32, 48), jnp.float32)
  measure = STATISTICS.measure_of(GemmRecipe(), None)
  state = Stages(all_bf16=None, forward_bf16=None, guard=False, taps=(), gradients=((measure.gradient, jnp.bool_(True)),))
  assert measured_einsum(("activation_batch", None, None)) is jnp.einsum
  einsum = measured_einsum(("exp", "embed_moe", "mlp_moe"))

  def measured(x, w, sink):
    with expert_call(ExpertCall(None, GemmRecipe(), None, state, (sink,))):
      return einsum("BSM,EMH -> BSEH", x, w, precision=None)

  sink = jnp.zeros((len(EXPERT_GEMMS), 3, 1, len(WGRAD_STAT_NAMES)), jnp.float32)
  y, pullback = jax.vjp(measured, x, w, sink)
  dy = jax.random.normal(jax.random.key(3), y.shape, jnp.float32).at[:, :, 2].set(0)  # expert 2: no gradient
  dx, dw, rows = pullback(dy)
  plain_y, plain = jax.vjp(lambda x, w: jnp.einsum("BSM,EMH -> BSEH", x, w), x, w)
  for got, want in ((y, plain_y), (dx, plain(dy)[0]), (dw, plain(dy)[1])):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  rows = np.asarray(rows)[0, :, 0]
  np.testing.assert_array_equal(rows, np.stack([np.asarray(weight_gradient_stats(dw[e])) for e in range(3)]))
  np.testing.assert_array_equal(rows[2], [1.0, 1.0])
