# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""scripts/fit_prediction.py against what is committed: the fitted constants in MaxText/preflight/calibration.json are
what the fit gives on the kept records of the published programs (docs/figures/prediction/published/), fitted on the
declared subset only; docs/prediction.md's table is what the script writes; and the goals the table is held to."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from MaxText.preflight import calibration
from tests.helpers import REPO_ROOT


@pytest.fixture(name="script", scope="module")
def _script():
  spec = importlib.util.spec_from_file_location("_fit_prediction", REPO_ROOT / "scripts" / "fit_prediction.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  yield module
  del sys.modules[spec.name]


@pytest.fixture(name="result", scope="module")
def _result(script):
  figures = script.load()
  assert len(figures) == 8, "four published points, FP8 and NVFP4 each"
  return script.report(figures)


def test_the_committed_constants_are_the_fit_on_the_declared_subset(script, result):
  committed = json.loads(calibration.FITTED.read_text(encoding="utf-8"))
  assert committed["fit_on"] == list(script.FIT_ON)
  assert result["values"] == pytest.approx(committed["values"], rel=1e-4)
  # a figure held out plays no part in the fit that predicts it
  figures = script.load()
  without_first = script.fit(figures[1:])
  assert figures[0].predict(without_first)[0] == pytest.approx(result["figures"][0]["leave_one_out"], rel=1e-6)


def test_the_doc_holds_the_table_the_script_writes(script, result):
  text = script.DOC.read_text(encoding="utf-8")
  body = text[text.index(script.BEGIN) + len(script.BEGIN):text.index(script.END)]
  assert body.strip() == script.table(result).strip(), "run scripts/fit_prediction.py --write"


def test_every_published_figure_is_predicted_within_15_percent_held_out_ones_included(result):
  """The issue's goal for the absolute figures, held by the suite: all eight TFLOP/s per GPU within +-15%, fitted
  and held out (each predicted by the fit on the other seven), each inside its interval. The ratios and the
  cross-GPU hold-out are reported in docs/prediction.md, not held to it (8B on GB200 misses by 16%: the doc says
  why)."""
  for row in result["figures"]:
    assert abs(row["error"]) <= 0.15 and abs(row["leave_one_out_error"]) <= 0.15, row
    assert row["across_gpus"]["role"] == ("held out" if "gb300" in row["point"] else "fitted")
    low, high = row["interval"]
    assert low <= row["predicted"] * (1 + 1e-9) and row["predicted"] <= high * (1 + 1e-9), row
