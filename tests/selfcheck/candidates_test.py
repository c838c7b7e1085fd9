# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The self-check can fail: each fault injected into the emulator's quantization fails exactly its operand's check,
and the emulator without a fault passes every check (it is the bit-exact reference)."""

from __future__ import annotations

import pytest

from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.selfcheck import checks
from MaxText.selfcheck.candidates import FAULTS, Emulator

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
  if fault.name == "sr-bias":
    assert "z = +" in failed[fault.operand]  # biased up, far outside the 99.9% interval
  else:
    assert "first:" in failed[fault.operand] and "ours" in failed[fault.operand]
