# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The self-check can fail: each fault injected into the emulator's quantization fails exactly its operand's check,
and the emulator without a fault passes every check (it is the bit-exact reference)."""

from __future__ import annotations

import jax
import pytest

from MaxText.nvfp4 import audit, operands
from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.selfcheck import checks, tensors
from MaxText.selfcheck.candidates import FAULTS, Emulator, OrderVariant

_SHAPES = [checks.Shape(64, 32, 64, ("mlp/wi_0",))]


def _failed(candidate, recipe=GemmRecipe()) -> dict[str, str]:
  return {r.subject: r.detail for r in checks.quantization(candidate, _SHAPES, recipe, draws=8) if not r.ok}


def test_the_emulator_passes_its_own_checks():
  assert _failed(Emulator()) == {}
  assert _failed(Emulator(), GemmRecipe(rht=False, stochastic_rounding=False, weight_2d=False)) == {}


@pytest.mark.parametrize("name", list(FAULTS))
def test_each_fault_fails_its_operand_only(name):
  fault = FAULTS[name]
  failed = _failed(Emulator(fault))
  assert list(failed) == [fault.operand], failed
  if fault.name.startswith("sr-bias"):
    assert "z = +" in failed[fault.operand]  # biased up, outside the 99.9% interval
  else:
    assert "first:" in failed[fault.operand] and "ours" in failed[fault.operand]


def _row(candidate, operand: str) -> checks.Result:
  return next(r for r in checks.quantization(candidate, _SHAPES, GemmRecipe(), draws=8) if r.subject == operand)


def test_an_amax_one_ulp_up_fails_on_the_amax_alone():
  """The self-check compares the candidate's amax with ours, bit for bit: one float32 ulp up fails every case, even
  where the codes and scales it gives equal ours."""
  row = _row(Emulator(FAULTS["amax-ulp"]), "fprop_x")
  assert not row.ok and row.values["mismatched_amax"] == row.values["cases"]
  assert "amax: ours" in row.detail


def test_the_stochastic_rounding_bound_is_the_stated_confidence():
  """The bound is derived from the confidence (the standard normal's two-sided 99.9% quantile), and a bias of 1/64
  of a grid step, the smallest the docs claim, lies outside it even at these few draws of small tensors."""
  assert checks.Z_BOUND == pytest.approx(3.2905, abs=1e-4) and checks.SR_CONFIDENCE == 0.999
  row = _row(Emulator(FAULTS["sr-bias-small"]), "dgrad_dy")
  assert not row.ok and row.values["z"] > checks.Z_BOUND
  assert (row.values["mismatched_codes"], row.values["mismatched_scales"], row.values["mismatched_amax"]) == (0, 0, 0)


@pytest.mark.parametrize(("name", "amax_flagged"), [("shard-amax", 0.0), ("amax-ulp", 1.0)])
def test_the_audit_takes_a_shard_amax_and_flags_one_above_the_whole(name, amax_flagged):
  """The in-training audit (audit.audited) on a fault's operands: a per-shard amax, honest under GSPMD, is no
  mismatch there (the self-check, unsharded, fails it); an amax above the whole tensor's is."""
  fault = FAULTS[name]
  operand = next(o for o in operands.gemm_operands(GemmRecipe()) if o.name == fault.operand)
  x = tensors.tensor(_SHAPES[0].of(operand.source), "normal", 0)
  codes, scales, amax = Emulator(fault).quantize(x, operand, jax.random.key(0))
  assert float(amax) != float(audit.encode(x, operand).amax)  # the fault's amax is not the whole tensor's
  assert audit.audited(x, operand, codes, scales, amax).tolist() == [0.0, 0.0, amax_flagged]


def test_a_correct_rht_summed_in_another_order_passes_and_its_differences_are_counted():
  """The benign variant (--with-variant rht-order) at a shape where tiny_blocks' 16-token runs mix small and normal
  blocks: every check holds, the RHT'd operands' rows count the order-dependent differences they accepted (> 0 on
  wgrad_x), and the operands without an RHT are ours bit for bit."""
  rows = {r.subject: r for r in checks.quantization(OrderVariant(), [checks.Shape(1024, 512, 256, ("mlp/wo",))],
                                                    GemmRecipe(), draws=4)}
  assert all(row.ok for row in rows.values()), {s: r.detail for s, r in rows.items() if not r.ok}
  assert rows["wgrad_x"].values["accepted_order_differences"] > 0, rows["wgrad_x"].detail
  assert "order-dependent differences accepted" in rows["wgrad_x"].detail
  assert "accepted_order_differences" in rows["wgrad_dy"].values
  assert "accepted_order_differences" not in rows["fprop_x"].values
