# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The comparison maths on hand-made metrics: gap, window, smoothing, step 0, speedup, missing steps, divergence."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from MaxText.compare import analysis
from MaxText.compare.schema import ComparisonSettings, Status, WindowRule
from tests.helpers import examples


def test_constant_gap_is_reported_exactly(make_run, decaying_loss):
  base = decaying_loss(100)
  c = analysis.compare(make_run("base", base), make_run("cand", base + 0.026), ComparisonSettings())
  assert c.status is Status.OK
  assert c.loss_gap.mean_nats == pytest.approx(0.026)
  assert c.loss_gap.max_nats == pytest.approx(0.026)
  assert c.loss_gap.max_abs_nats == pytest.approx(0.026)
  assert c.loss_gap.final_smoothed_nats == pytest.approx(0.026)
  assert c.common_steps == 100 and c.baseline_only_steps == 0 and c.candidate_only_steps == 0


def test_window_starts_at_end_of_warmup_from_learning_rate(make_run, decaying_loss, warmup_cosine):
  n, warm = 60, 12
  base = decaying_loss(n)
  cand = base + np.where(np.arange(n) < warm, 1.0, 0.1)  # large gap only during warm-up
  lrs = warmup_cosine(n, warm)
  c = analysis.compare(make_run("base", base, lrs=lrs), make_run("cand", cand, lrs=lrs), ComparisonSettings())
  assert c.loss_gap.window_rule is WindowRule.LR_PEAK
  assert c.loss_gap.window_start_step == warm
  assert c.loss_gap.num_steps == n - warm
  assert c.loss_gap.mean_nats == pytest.approx(0.1)


def test_window_falls_back_to_fraction_without_learning_rate(make_run, decaying_loss):
  base = decaying_loss(51)
  c = analysis.compare(make_run("base", base, lrs=False), make_run("cand", base + 0.5, lrs=False), ComparisonSettings())
  assert c.loss_gap.window_rule is WindowRule.FRACTION
  assert c.loss_gap.window_start_step == math.ceil(analysis.DEFAULT_WINDOW_FRACTION * 50)


def test_explicit_window_start_wins(make_run, decaying_loss):
  base = decaying_loss(40)
  cand = base + np.linspace(0.0, 0.39, 40)  # gap = 0.01 * step
  c = analysis.compare(make_run("base", base), make_run("cand", cand), ComparisonSettings(window_start=30))
  assert c.loss_gap.window_rule is WindowRule.EXPLICIT
  assert c.loss_gap.num_steps == 10
  assert c.loss_gap.mean_nats == pytest.approx(np.mean(np.arange(30, 40) * 0.01))
  assert c.loss_gap.max_nats == pytest.approx(0.39) and c.loss_gap.max_step == 39


def test_window_past_the_end_gives_no_gap_but_no_crash(make_run, decaying_loss):
  base = decaying_loss(10)
  c = analysis.compare(make_run("base", base), make_run("cand", base), ComparisonSettings(window_start=500))
  assert c.loss_gap is None and c.status is Status.OK


def test_smoothed_final_gap_is_a_trailing_mean(make_run):
  base = np.full(30, 5.0)
  cand = base.copy()
  cand[-4:] += [0.4, 0.0, 0.2, 0.2]  # last 4 steps: mean gap 0.2
  c = analysis.compare(make_run("base", base), make_run("cand", cand), ComparisonSettings(smooth=4))
  assert c.loss_gap.final_smoothed_nats == pytest.approx(0.2)
  assert c.loss_gap.smooth_steps == 4
  assert c.loss_gap.max_nats == pytest.approx(0.4) and c.loss_gap.max_step == 26


def test_negative_gap_keeps_its_sign(make_run, decaying_loss):
  base = decaying_loss(30)
  c = analysis.compare(make_run("base", base), make_run("cand", base - 0.05), ComparisonSettings())
  assert c.loss_gap.mean_nats == pytest.approx(-0.05)
  assert c.loss_gap.max_abs_nats == pytest.approx(0.05)


def test_step0_agreement(make_run, decaying_loss):
  base = decaying_loss(10)
  same = analysis.compare(make_run("base", base), make_run("same", base + 0.001), ComparisonSettings())
  assert same.step0.within_tolerance is True and same.step0.abs_diff == pytest.approx(0.001)
  other = base.copy()
  other[0] += 0.3
  diff = analysis.compare(make_run("base", base), make_run("other", other), ComparisonSettings())
  assert diff.step0.within_tolerance is False and diff.step0.abs_diff == pytest.approx(0.3)


def test_step0_missing_is_null_not_a_failure(make_run, decaying_loss):
  base = decaying_loss(10)
  c = analysis.compare(make_run("base", base), make_run("late", base[3:], steps=range(3, 10)), ComparisonSettings())
  assert c.step0.within_tolerance is None and c.step0.abs_diff is None
  assert c.common_steps == 7 and c.baseline_only_steps == 3


def test_speedup_uses_medians_and_skips_step0(make_run, decaying_loss):
  base = decaying_loss(20)
  slow = [100.0] + [2.0] * 19  # step 0 compiles
  fast = [300.0] + [1.0] * 18 + [50.0]  # one outlier must not move the median
  b, c = make_run("base", base, step_times=slow), make_run("cand", base, step_times=fast)
  result = analysis.compare(b, c, ComparisonSettings())
  assert result.speedup == pytest.approx(2.0)
  summary = analysis.summarize_run(c, ComparisonSettings())
  assert summary.median_step_time_s == pytest.approx(1.0)
  assert summary.median_tokens_per_sec_per_device == pytest.approx(512.0)
  assert summary.perf_steps == 19


def test_missing_steps_align_on_common_steps(make_run, decaying_loss):
  base = decaying_loss(30)
  keep = [s for s in range(30) if s % 3 != 1]  # the candidate lost every third record
  cand = make_run("cand", base[keep] + 0.1, steps=keep)
  c = analysis.compare(make_run("base", base), cand, ComparisonSettings(window_start=0))
  assert c.common_steps == len(keep) and c.baseline_only_steps == 10 and c.candidate_only_steps == 0
  assert c.loss_gap.num_steps == len(keep)
  assert c.loss_gap.mean_nats == pytest.approx(0.1)


def test_different_lengths(make_run, decaying_loss):
  base = decaying_loss(100)
  c = analysis.compare(make_run("base", base), make_run("short", base[:40] + 0.2), ComparisonSettings())
  assert c.common_steps == 40 and c.baseline_only_steps == 60
  assert c.loss_gap.window_end_step == 39
  assert c.loss_gap.mean_nats == pytest.approx(0.2)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_diverged_candidate_is_reported_not_raised(make_run, decaying_loss, bad):
  base = decaying_loss(50)
  cand = base + 0.05
  cand[30:] = bad
  cand[35] = 3.0  # a finite value after the blow-up must not revive the run
  c = analysis.compare(make_run("base", base), make_run("cand", cand), ComparisonSettings(window_start=0))
  assert c.status is Status.CANDIDATE_DIVERGED
  assert c.first_bad_step == 30
  assert c.loss_gap.window_end_step == 29
  assert c.loss_gap.mean_nats == pytest.approx(0.05)
  summary = analysis.summarize_run(make_run("cand2", cand), ComparisonSettings())
  assert summary.diverged and summary.first_nonfinite_step == 30
  assert math.isfinite(summary.final_loss_smoothed)


def test_diverged_baseline_and_both(make_run, decaying_loss):
  base = decaying_loss(20)
  bad_base = base.copy()
  bad_base[10:] = math.nan
  bad_cand = base.copy()
  bad_cand[5:] = math.nan
  c = analysis.compare(make_run("b", bad_base), make_run("c", base), ComparisonSettings())
  assert c.status is Status.BASELINE_DIVERGED and c.first_bad_step == 10
  both = analysis.compare(make_run("b2", bad_base), make_run("c2", bad_cand), ComparisonSettings())
  assert both.status is Status.BOTH_DIVERGED and both.first_bad_step == 5


def test_nan_at_step0_gives_no_gap(make_run):
  cand = np.full(5, math.nan)
  c = analysis.compare(make_run("b", np.full(5, 3.0)), make_run("c", cand), ComparisonSettings())
  assert c.status is Status.CANDIDATE_DIVERGED and c.first_bad_step == 0
  assert c.loss_gap is None
  assert c.step0.within_tolerance is False and c.step0.candidate_loss is None


def test_no_common_steps(make_run):
  c = analysis.compare(
      make_run("b", np.full(5, 3.0)), make_run("c", np.full(5, 3.0), steps=range(10, 15)), ComparisonSettings()
  )
  assert c.status is Status.NO_COMMON_STEPS and c.loss_gap is None


def test_settings_reject_bad_values():
  with pytest.raises(ValueError, match="smooth"):
    ComparisonSettings(smooth=0)
  with pytest.raises(ValueError, match="step0_tolerance"):
    ComparisonSettings(step0_tolerance=-1.0)


@hyp_settings(max_examples=examples(30), deadline=None)
@given(
    base=st.lists(st.floats(0.5, 12.0), min_size=3, max_size=40),
    shift=st.floats(-2.0, 2.0),
    noise_seed=st.integers(0, 2**16),
)
def test_gap_is_mean_of_differences(tmp_path_factory, base, shift, noise_seed):
  """For any losses: mean gap = mean(cand - base) over the window, max >= mean, and |max| <= max_abs."""
  import json  # pylint: disable=import-outside-toplevel

  from MaxText.compare.metrics import read_jsonl  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(noise_seed)
  base = np.asarray(base)
  cand = base + shift + rng.normal(0, 0.01, size=len(base))
  d = tmp_path_factory.mktemp("h")
  runs = []
  for name, losses in (("b", base), ("c", cand)):
    lines = [json.dumps({"learning/loss": float(loss), "step": s, "perf/step_time_seconds": 1.0})
             for s, loss in enumerate(losses)]
    (d / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    runs.append(read_jsonl(d / f"{name}.jsonl", name))
  c = analysis.compare(runs[0], runs[1], ComparisonSettings(window_start=0))
  assert c.loss_gap.mean_nats == pytest.approx(float(np.mean(cand - base)), abs=1e-9)
  assert c.loss_gap.max_nats >= c.loss_gap.mean_nats - 1e-12
  assert abs(c.loss_gap.max_nats) <= c.loss_gap.max_abs_nats + 1e-12
