# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Seed groups (runs named NAME@SEED): same-seed pairing, the mean gap across seeds with its spread and interval,
the baseline's noise floor, and what a group of one run or a run without a common eval gets."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from MaxText.compare import seeds
from MaxText.compare.metrics import read_jsonl
from MaxText.compare.report import build_report, markdown_report, write_report
from MaxText.compare.schema import ComparisonSettings, VerdictLevel
from tests.compare.conftest import maxtext_record, write_lines

STEPS = 30


def _run(tmp_path, name, step0, eval_loss, evals=True):
  """A run whose training starts at `step0` (the seed's initial loss) with one final eval pass at step 29."""
  records = [maxtext_record(s, step0 - 0.05 * s, run_name=name) for s in range(STEPS)]
  if evals:
    records.append({"eval/avg_loss": eval_loss, "eval/total_loss": eval_loss * 512, "eval/total_weights": 512.0,
                    "step": float(STEPS - 1)})
  return read_jsonl(write_lines(tmp_path / name.replace("@", "_") / "metrics.jsonl", records), name)


BASE_EVAL = {"0": 6.00, "1": 6.04, "2": 5.98}
GAPS = {"0": 0.030, "1": 0.050, "2": 0.010}
STEP0 = {"0": 10.0, "1": 10.3, "2": 9.8}  # each seed its own initial weights: only same-seed pairs agree at step 0


def _grouped_runs(tmp_path):
  runs = [_run(tmp_path, f"bf16@{s}", STEP0[s], BASE_EVAL[s]) for s in BASE_EVAL]
  runs += [_run(tmp_path, f"te_nvfp4@{s}", STEP0[s], BASE_EVAL[s] + GAPS[s]) for s in GAPS]
  runs += [_run(tmp_path, "fp8", STEP0["0"], BASE_EVAL["0"] + 0.02)]
  runs += [_run(tmp_path, "no_rht@0", STEP0["0"], 0.0, evals=False)]
  return runs


@pytest.fixture()
def grouped(tmp_path):
  return build_report(_grouped_runs(tmp_path), "bf16@0", ComparisonSettings())


def test_names_split_into_group_and_seed():
  assert seeds.split_name("te_nvfp4@1") == ("te_nvfp4", "1")
  assert seeds.split_name("fp8") == ("fp8", None) and seeds.split_name("a@") == ("a@", None)


def test_each_seed_is_paired_with_the_baselines_run_of_that_seed(grouped):
  by = {c.candidate: c for c in grouped.comparisons}
  assert {c: by[c].baseline for c in ("te_nvfp4@0", "te_nvfp4@1", "te_nvfp4@2")} == {
      "te_nvfp4@0": "bf16@0", "te_nvfp4@1": "bf16@1", "te_nvfp4@2": "bf16@2"}
  assert all(by[c].step0.within_tolerance for c in ("te_nvfp4@1", "te_nvfp4@2"))  # same seed, same start
  assert "bf16@1" not in by and "bf16@2" not in by  # the baseline's own seeds are baselines, not candidates


def test_the_group_reports_the_mean_gap_its_spread_and_the_noise_floor(grouped):
  (g,) = [x for x in grouped.seed_groups if x.group == "te_nvfp4"]
  gaps = [GAPS[s] for s in ("0", "1", "2")]
  assert g.eval_gaps_nats == pytest.approx(gaps) and g.mean_eval_gap_nats == pytest.approx(np.mean(gaps))
  assert g.sd_nats == pytest.approx(np.std(gaps, ddof=1))
  half = stats.t.ppf(0.975, 2) * np.std(gaps, ddof=1) / math.sqrt(3)
  assert g.ci95 == pytest.approx([np.mean(gaps) - half, np.mean(gaps) + half])
  assert g.baseline_noise_sd_nats == pytest.approx(np.std(list(BASE_EVAL.values()), ddof=1)) and g.baseline_runs == 3
  assert "## Across seeds" in markdown_report(grouped)


def test_a_single_run_gets_no_spread_and_says_so_and_a_run_without_evals_is_named(grouped):
  by = {g.group: g for g in grouped.seed_groups}
  assert by["fp8"].sd_nats is None and by["fp8"].ci95 is None and "no spread across seeds (not 0)" in by["fp8"].note
  assert by["no_rht"].eval_gaps_nats == [] and by["no_rht"].unpaired == ["no_rht@0 (no eval in common with bf16@0)"]


def test_the_report_files_are_written_for_seed_groups(tmp_path):
  runs = _grouped_runs(tmp_path)
  paths = write_report(runs, build_report(runs, "bf16@0", ComparisonSettings()), tmp_path / "out")
  assert "## Across seeds" in paths["report.md"].read_text() and paths["loss.png"].stat().st_size > 10_000


def test_runs_without_seed_names_get_no_groups(tmp_path):
  runs = [_run(tmp_path, "bf16", 10.0, 6.0), _run(tmp_path, "te_nvfp4", 10.0, 6.03)]
  report = build_report(runs, "bf16", ComparisonSettings())
  assert report.seed_groups == [] and "Across seeds" not in markdown_report(report)


@pytest.mark.parametrize(
    "gaps, level, differs",
    [
        ((0.030, 0.050, 0.010), VerdictLevel.INCONCLUSIVE, False),  # [-0.020, +0.080] reaches past +1% of 6.007
        ((0.020, 0.021, 0.019), VerdictLevel.OK, True),  # all inside the band, all above 0
        ((-0.020, -0.021, -0.019), VerdictLevel.OK, True),  # all inside the band, all below 0
        ((0.100, 0.110, 0.120), VerdictLevel.DRIFTING, True),  # all above the 1% band (+1.8%), below 3%
        ((-0.005, 0.004, 0.001), VerdictLevel.OK, False),  # inside the band, 0 inside the interval
    ],
)
def test_a_group_is_judged_by_its_interval_across_seeds(tmp_path, gaps, level, differs):
  """The group verdict uses the run verdict's rule on the seed interval, relative to the baseline runs' mean eval."""
  runs = [_run(tmp_path, f"bf16@{s}", STEP0[s], BASE_EVAL[s]) for s in BASE_EVAL]
  runs += [_run(tmp_path, f"te_nvfp4@{s}", STEP0[s], BASE_EVAL[s] + gap) for s, gap in zip(BASE_EVAL, gaps)]
  report = build_report(runs, "bf16@0", ComparisonSettings())
  (g,) = report.seed_groups
  assert (g.verdict, g.differs_from_baseline) == (level, differs)
  row = [line for line in markdown_report(report).splitlines() if line.startswith("| te_nvfp4 |")]
  assert row and f"| {'yes' if differs else 'no'} | **{level.value}** |" in row[0]


def test_a_group_without_spread_gets_no_verdict(grouped):
  by = {g.group: g for g in grouped.seed_groups}
  assert by["fp8"].verdict is None and by["fp8"].differs_from_baseline is None
