# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The pre-flight's fit: a step fits when its peak is within the share of the GPU jax may allocate (75% by default,
XLA_PYTHON_CLIENT_MEM_FRACTION when set), not within the whole GPU."""

from __future__ import annotations

import dataclasses

import pytest

from MaxText.backends.targets import TARGETS
from MaxText.preflight import __main__ as preflight
from MaxText.preflight import report


@dataclasses.dataclass
class _Analysis:
  """What XLA's memory analysis of a compiled step reports (the fields report.Memory reads)."""

  argument_size_in_bytes: int
  output_size_in_bytes: int = 0
  alias_size_in_bytes: int = 0
  temp_size_in_bytes: int = 0
  generated_code_size_in_bytes: int = 0


@dataclasses.dataclass
class _Compiled:
  analysis: _Analysis

  def memory_analysis(self) -> _Analysis:
    return self.analysis


def _memory(peak_share: float) -> report.Memory:
  """report.Memory of a step whose peak is `peak_share` of a B200, judged with the fraction the pre-flight reads."""
  b200 = TARGETS["b200"]
  compiled = _Compiled(_Analysis(argument_size_in_bytes=int(peak_share * b200.memory_bytes)))
  return report.Memory.of(compiled, b200, preflight.mem_fraction())


def test_a_step_needing_90_percent_of_the_gpu_does_not_fit_jaxs_default_share(monkeypatch):
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  memory = _memory(0.90)
  assert memory.fraction == pytest.approx(0.75)
  assert not memory.fits and memory.margin < 0
  assert _memory(0.70).fits


@pytest.mark.parametrize(("fraction", "fits"), [("0.95", True), ("0.85", False)])
def test_the_fit_follows_xla_python_client_mem_fraction(monkeypatch, fraction, fits):
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", fraction)
  memory = _memory(0.90)
  assert memory.fraction == pytest.approx(float(fraction))
  assert memory.fits is fits
