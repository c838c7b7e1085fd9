# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The eval gap's paired 95% interval: per-batch eval losses recovered from maxtext's running eval records, the
interval against an independent computation, the refusals, and the verdicts it decides."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from MaxText.compare import analysis
from MaxText.compare.metrics import read_jsonl
from MaxText.compare.report import build_report, loss_table
from MaxText.compare.schema import ComparisonSettings, VerdictLevel
from tests.compare.conftest import maxtext_record, write_lines

STEPS = 40
EVAL_AT = 30
TOKENS = 512.0


def _eval_pass(train_step: int, losses, tokens=None) -> list[dict]:
  """An eval pass as maxtext's MetricLogger writes it to metrics_file: one running record per batch (step = the
  batch index; running mean loss and token count so far), then the final record at the train step."""
  tokens = [TOKENS] * len(losses) if tokens is None else tokens
  records, loss_sum, weight = [], 0.0, 0.0
  for k, (loss, w) in enumerate(zip(losses, tokens)):
    loss_sum, weight = loss_sum + loss * w, weight + w
    records.append({"eval/avg_loss": loss_sum / (weight + 1e-8), "eval/avg_perplexity": 1.0,
                    "eval/total_weights": weight, "eval/step_time_seconds": 0.1, "step": float(k)})
  records.append({"eval/avg_loss": loss_sum / (weight + 1e-8), "eval/total_loss": loss_sum,
                  "eval/total_weights": weight, "step": float(train_step)})
  return records


def _run(tmp_path, name, batch_losses, tokens=None):
  records = [maxtext_record(s, 8.0 - 0.05 * s, run_name=name) for s in range(STEPS)]
  records[EVAL_AT + 1:EVAL_AT + 1] = _eval_pass(EVAL_AT, batch_losses, tokens)  # after train step EVAL_AT
  return read_jsonl(write_lines(tmp_path / name / "metrics.jsonl", records), name)


BASE = [6.02, 5.97, 6.05, 5.99, 6.01, 5.96, 6.04, 5.98]


def test_per_batch_eval_losses_are_recovered_from_the_running_records(tmp_path):
  run = _run(tmp_path, "bf16", BASE)
  (batches,) = run.eval_batches.values()
  np.testing.assert_allclose([b[0] for b in batches], BASE, rtol=1e-9)
  assert [b[1] for b in batches] == [TOKENS] * len(BASE)
  assert list(run.eval_steps) == [EVAL_AT] and run.eval_loss[0] == pytest.approx(np.mean(BASE))


def test_interval_is_students_t_on_the_paired_batch_differences(tmp_path):
  diffs = np.array([0.031, 0.012, 0.044, 0.020, 0.027, 0.009, 0.038, 0.019])
  base, cand = _run(tmp_path, "bf16", BASE), _run(tmp_path, "nvfp4", list(np.array(BASE) + diffs))
  (lo, hi), n, missing = analysis.paired_eval_gap(base, cand, EVAL_AT)
  half = stats.t.ppf(0.975, n - 1) * diffs.std(ddof=1) / math.sqrt(n)
  assert missing is None and n == 8
  assert (lo, hi) == pytest.approx((diffs.mean() - half, diffs.mean() + half), abs=1e-9)
  (c,) = build_report([base, cand], "bf16", ComparisonSettings()).comparisons
  assert c.final_eval_gap_nats == pytest.approx(diffs.mean(), abs=1e-9) and lo < c.final_eval_gap_nats < hi
  assert "[+0.0" in loss_table(build_report([base, cand], "bf16", ComparisonSettings())) and "(8)" in loss_table(
      build_report([base, cand], "bf16", ComparisonSettings()))


@pytest.mark.parametrize("cand_tokens,count,reason", [
    ([TOKENS] * 7 + [300.0], 8, "mismatched eval sets"),
    (None, 7, "mismatched eval sets"),
], ids=["other_tokens", "fewer_batches"])
def test_other_eval_batches_are_refused(tmp_path, cand_tokens, count, reason):
  base = _run(tmp_path, "bf16", BASE)
  cand = _run(tmp_path, "nvfp4", [x + 0.02 for x in BASE[:count]], cand_tokens)
  ci, _, missing = analysis.paired_eval_gap(base, cand, EVAL_AT)
  assert ci is None and reason in missing
  (c,) = build_report([base, cand], "bf16", ComparisonSettings()).comparisons
  assert c.eval_gap_ci95 is None and reason in c.verdict.text


def test_one_batch_gets_no_interval_and_says_so(tmp_path):
  base, cand = _run(tmp_path, "bf16", BASE[:1]), _run(tmp_path, "nvfp4", [BASE[0] + 0.01])
  ci, n, missing = analysis.paired_eval_gap(base, cand, EVAL_AT)
  assert ci is None and n == 1 and "one eval batch" in missing


@pytest.mark.parametrize("shift,spread,level", [
    (0.010, 0.005, VerdictLevel.OK),  # +0.17%, the whole interval inside the 1% band
    (0.050, 0.080, VerdictLevel.INCONCLUSIVE),  # +0.8%: inside, but the interval reaches past +1%
    (0.120, 0.010, VerdictLevel.DRIFTING),  # +2%: all of the interval above the band
    (-0.055, 0.010, VerdictLevel.OK),  # -0.9%, the interval reaching below -1%: no worse than the baseline
    (-0.120, 0.010, VerdictLevel.BETTER),  # -2%: all of the interval below -1%
], ids=["inside", "straddles", "above", "below_lower_edge", "below"])
def test_the_interval_decides_the_verdict(tmp_path, shift, spread, level):
  noise = np.array([1, -1, 1, -1, 1, -1, 1, -1]) * spread
  base, cand = _run(tmp_path, "bf16", BASE), _run(tmp_path, "nvfp4", list(np.array(BASE) + shift + noise))
  (c,) = build_report([base, cand], "bf16", ComparisonSettings()).comparisons
  assert c.verdict.level is level, c.verdict.text
  assert "95% interval [" in c.verdict.text
  if level is VerdictLevel.INCONCLUSIVE:
    assert "more eval batches (eval_steps), more seeds or a longer run" in c.verdict.text
