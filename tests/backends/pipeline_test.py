# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The pipeline's taps in the emulated GEMM module: per-GEMM operand statistics and the audit, out as a gradient of
their variables, the GEMM's own gradients unchanged."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.backends import flags, stages
from MaxText.backends.emulated import MeasuredDotGeneral, Nvfp4DotGeneral
from MaxText.backends.pipeline import OVERWRITE_COLLECTION as STATS_COLLECTION
from MaxText.nvfp4 import audit
from MaxText.nvfp4.gemm import GemmRecipe, as_matrices, nvfp4_dot_general
from MaxText.nvfp4.operands import GEMM_OPERANDS
from MaxText.nvfp4.stats import STAT_NAMES, WGRAD_STAT_NAMES, weight_gradient_stats
from MaxText.precision.policy import Precision
from MaxText.precision.taps import AUDIT, STATISTICS
from MaxText.selfcheck.candidates import FAULTS, Emulator
from tests.backends.helpers import gemm_program
from tests.helpers import settings
from tests.nvfp4 import reference

# DenseGeneral's MLP up-projection layout: x (batch, seq, embed) . W (embed, mlp).
_DIMS = (((2,), (0,)), ((), ()))


def _operands():
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(k1, (2, 16, 64), jnp.bfloat16)
  w = jax.random.normal(k2, (64, 48), jnp.float32) * 0.1
  dy = jax.random.normal(k3, (2, 16, 48), jnp.bfloat16)
  return x, w, dy


@functools.cache
def _gemm(interval: int) -> tuple[dict, Callable]:
  """One GEMM module with statistics every `interval` steps as one program (tests/backends/helpers.py), the statistics
  variable its sink: the step is a traced argument, as maxtext's is in training."""
  x, w, _ = _operands()
  return gemm_program(Nvfp4DotGeneral(settings=settings(stats_interval=interval)), x, w, _DIMS,
                      sink=(STATS_COLLECTION, STATISTICS.variable))


def _run(interval: int, step: int, sink_value: float = 0.0):
  """y, dx, dW and the statistics variable's gradient of one GEMM call at `step`."""
  variables, run = _gemm(interval)
  sink = variables.get(STATS_COLLECTION, {}).get(STATISTICS.variable)
  sink = None if sink is None else jnp.full_like(sink, sink_value)
  x, w, dy = _operands()
  y, (dx, dw, dsink) = run(variables, jnp.int32(step), x, w, dy, sink)
  return y, dx, dw, dsink


def test_statistics_change_no_output_and_no_gradient():
  y0, dx0, dw0, none = _run(0, step=0)
  assert none is None  # interval 0: no variable at all
  for step in (0, 1):
    y, dx, dw, _ = _run(2, step=step)
    for a, b in ((y, y0), (dx, dx0), (dw, dw0)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_statistics_step_reports_every_operand_as_the_oracle_measures_it():
  """fprop x (along K), W (16x16 tiles), dgrad dY (along N), wgrad x^T and dY^T (along M, RHT): the oracle's
  statistics of each, computed independently from tests/nvfp4/reference.py."""
  x, w, dy = _operands()
  *_, stats = _run(2, step=4)
  x2 = np.asarray(x).reshape(-1, 64)
  dy2 = np.asarray(dy).reshape(-1, 48)
  want = {
      "fprop_x": reference.statistics(x2, "1d"),
      "fprop_w": reference.statistics(np.asarray(w), "2d"),
      "dgrad_dy": reference.statistics(dy2, "1d"),
      "wgrad_x": reference.statistics(x2.T.copy(), "1d", rht=True),
      "wgrad_dy": reference.statistics(dy2.T.copy(), "1d", rht=True),
  }
  got = np.asarray(stats)
  assert got.shape == (len(GEMM_OPERANDS), len(STAT_NAMES))
  for i, operand in enumerate(GEMM_OPERANDS):
    for j, stat in enumerate(STAT_NAMES):
      assert got[i, j] == pytest.approx(want[operand][stat], rel=1e-5, abs=1e-6), (operand, stat)
  assert np.all(got[:, STAT_NAMES.index("underflow")] > 0)  # Gaussian blocks: some small values always flush


def test_other_steps_keep_the_previous_statistics_and_compute_none():
  *_, stats = _run(2, step=3, sink_value=7.0)
  np.testing.assert_array_equal(np.asarray(stats), 7.0)


def _audit_module(step: int, interval: int, previous: float) -> np.ndarray:
  """The emulated module's audit variable's gradient after one GEMM call at `step`."""
  x, w, dy = _operands()
  module = Nvfp4DotGeneral(settings=settings(audit_interval=interval))
  rngs = {"params": jax.random.key(1), "dropout": jax.random.key(2)}
  variables = jax.jit(lambda rngs, x, w: module.init(rngs, x, w, _DIMS))(rngs, x, w)
  sink = jnp.full_like(variables[STATS_COLLECTION][AUDIT.variable], previous)

  def apply(x, w, sink):
    with flags.step_scope(jnp.int32(step)):
      return module.apply({**variables, STATS_COLLECTION: {AUDIT.variable: sink}}, x, w, _DIMS, rngs=rngs,
                          mutable=["aqt"])[0]

  return np.asarray(jax.jit(lambda x, w, sink: jax.vjp(apply, x, w, sink)[1](dy)[2])(x, w, sink))


def _audit_tap(candidate) -> np.ndarray:
  """The audit tap (taps.AUDIT's measure) around the emulated GEMM with `candidate` as the backend's quantizer: the
  audit array its sink's gradient carries on an audit step."""
  x, w, dy = _operands()
  recipe = GemmRecipe()
  measure = AUDIT.measure_of(recipe, candidate)

  def loss(sink):
    gemm = stages.tap(lambda a, b, key: nvfp4_dot_general(a, b, _DIMS, key=key, recipe=recipe),
                      measure, lambda a, b: as_matrices(a, b, _DIMS), sink,
                      jnp.bool_(True))
    return jnp.sum(gemm(x, w, jax.random.key(3)).astype(jnp.float32) * dy.astype(jnp.float32))

  return np.asarray(jax.jit(jax.grad(loss))(measure.empty()))


def test_the_audit_of_the_emulated_backend_finds_nothing_and_a_faulty_quantizer_is_found():
  clean = _audit_module(step=0, interval=1, previous=0.0)
  assert clean.shape == (len(GEMM_OPERANDS), len(audit.COLUMNS)) and not clean.any()
  np.testing.assert_array_equal(_audit_module(step=1, interval=2, previous=5.0), 5.0)  # not an audit step: kept
  assert not _audit_tap(audit.emulated).any()
  fault = FAULTS["code-round"]
  faulty = _audit_tap(lambda t, op: Emulator(fault).quantize(t, op, jax.random.key(0)))
  row = GEMM_OPERANDS.index(fault.operand)
  assert faulty[row, audit.COLUMNS.index("codes")] > 0 and faulty[row, audit.COLUMNS.index("scales")] == 0
  assert not np.delete(faulty, row, axis=0).any()  # only the faulty operand's row


def _dy_with_zero_channels() -> jax.Array:
  """dY whose output channels 0-7 are zero: the weight gradient's columns 0-7 are zero in NVFP4 and in BF16 alike."""
  return _operands()[2].at[..., :8].set(0)


@pytest.mark.parametrize("bf16", [False, True], ids=["nvfp4", "bf16_mlp"])
def test_statistics_step_reports_the_shares_of_the_weight_gradient_that_are_zero(bf16):
  """The weight-gradient row (Tap.gradient, its own variable): the shares of the GEMM's own dW (the one the run
  returns) that are exactly zero, entries and output channels. For an NVFP4 GEMM and for a BF16 MLP GEMM of a run
  with nvfp4_mlp_precision=bf16 (MeasuredDotGeneral), whose outputs and gradients are lax.dot_general's, bit for
  bit; other steps keep the previous row."""
  x, w, _ = _operands()
  dy = _dy_with_zero_channels()
  if bf16:
    module = MeasuredDotGeneral(settings=settings(mlp=Precision.BF16, stats_interval=2))
    dy = dy.astype(jnp.float32)  # lax.dot_general of bf16 x and float32 W is float32
  else:
    module = Nvfp4DotGeneral(settings=settings(stats_interval=2))
  variables, run = gemm_program(module, x, w, _DIMS, sink=(STATS_COLLECTION, STATISTICS.gradient_variable))
  previous = jnp.full_like(variables[STATS_COLLECTION][STATISTICS.gradient_variable], 7.0)
  assert previous.shape == (1, len(WGRAD_STAT_NAMES))
  y, (dx, dw, row) = run(variables, jnp.int32(4), x, w, dy, previous)
  want = np.asarray(weight_gradient_stats(dw))[None]
  np.testing.assert_array_equal(np.asarray(row), want)
  assert want[0, 1] >= 8 / 48 and want[0, 0] >= 8 / 48
  if bf16:
    plain_y, vjp = jax.vjp(lambda a, b: jax.lax.dot_general(a, b, _DIMS), x, w)
    for got, expected in ((y, plain_y), (dx, vjp(dy)[0]), (dw, vjp(dy)[1])):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    np.testing.assert_array_equal(want, np.full((1, 2), 8 / 48, np.float32))  # Gaussian products: no other zero
  _, (_, _, kept) = run(variables, jnp.int32(3), x, w, dy, previous)
  np.testing.assert_array_equal(np.asarray(kept), 7.0)
