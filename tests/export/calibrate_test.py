# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The calibration's reading of its run's metrics (MaxText.export.calibrate.measured) on metrics files written here:
the largest input amax per GEMM over the steps, and the refusal when fewer steps measured than were asked. No
serving library: it runs in the export group beside the exports it guards (tests/export/dense_test.py runs the
calibration end to end)."""

from __future__ import annotations

import json
import pathlib

import pytest

from MaxText.export.calibrate import measured
from MaxText.export.mapping import ExportError
from MaxText.precision.taps import CALIBRATION


def _metrics(path: pathlib.Path, steps: list[int]) -> pathlib.Path:
  rows = [{"step": step, CALIBRATION.metric(0, "mlp/wi_0", "fprop_x", "amax"): 1.0 + step,
           CALIBRATION.metric(1, "mlp/wo", "fprop_x", "amax"): 5.0 - step, "learning/loss": 3.0} for step in steps]
  path.write_text("\n".join(json.dumps(row) for row in rows) + "\n", encoding="utf-8")
  return path


def test_every_step_measured_gives_each_gemms_largest_input_amax(tmp_path):
  calibration = measured(_metrics(tmp_path / "m.jsonl", [0, 1, 2]), 3)
  assert calibration.steps == 3 and calibration.amax == {(0, "mlp/wi_0"): 3.0, (1, "mlp/wo"): 5.0}


@pytest.mark.parametrize("steps_measured, asked", [([0, 1], 3), ([0], 2), ([0, 1, 2], 2)])
def test_a_run_that_measured_another_number_of_steps_than_asked_is_refused(tmp_path, steps_measured, asked):
  """Red when fewer steps are accepted: the amax would be a maximum over fewer batches than --calibration-steps."""
  with pytest.raises(ExportError, match=f"measured {len(steps_measured)} of {asked} steps"):
    measured(_metrics(tmp_path / "m.jsonl", steps_measured), asked)


def test_a_run_that_measured_nothing_is_refused(tmp_path):
  with pytest.raises(ExportError, match="wrote no nvfp4/calibration/ metrics"):
    measured(_metrics(tmp_path / "m.jsonl", []), 1)
