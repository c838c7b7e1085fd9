# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The comparison maths: loss gaps in nats on aligned steps, step-0 agreement, throughput and speedup.

Conventions (docs/comparing-runs.md repeats them):
  * gap = candidate loss - baseline loss, in nats, on the steps both runs logged (missing steps are skipped, never
    interpolated); positive means the candidate is worse.
  * window: steps >= window start. Default start = the end of warm-up, read from the baseline's logged learning
    rate (the first step at which it reaches its maximum); if no learning rate was logged, or it peaks at the last
    step, `DEFAULT_WINDOW_FRACTION` of the way into the common steps.
  * smoothed final gap: the mean over the last `smooth` common window steps of the candidate minus the same mean of
    the baseline (a trailing mean, not an EMA: it weighs those steps equally and is easy to check by hand).
  * divergence: a run diverges at the first step whose loss is NaN or +-inf; the gap statistics then use only the
    common steps before the first bad step of either run, and the comparison's status says which run diverged.
  * throughput: medians over steps >= `perf_start_step` (default 1: step 0 includes compilation and first dispatch)
    with finite values. step_time_ratio = baseline median step time / candidate median step time; it is reported as
    a speedup only where it measures the precision (verdict.speedup_withheld). The ratio of maxtext's TFLOP/s
    medians is not the same number: a median of per-step FLOPs/time is not FLOPs/median time (even step counts
    average two middle steps), and on short runs single slow steps move either one.
  * eval gap: candidate - baseline `eval/avg_loss` at the last train step after which both logged a full eval pass,
    also relative to the baseline's eval loss (the verdict's basis).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from MaxText.compare import verdict
from MaxText.compare.metrics import RunMetrics
from MaxText.compare.schema import (
  Comparison,
  ComparisonSettings,
  LossGap,
  MachineLoad,
  RunSummary,
  Status,
  Step0,
  WindowRule,
)

#: Window start as a fraction of the common steps when warm-up cannot be read: maxtext's default
#: warmup_steps_fraction (0.1).
DEFAULT_WINDOW_FRACTION = 0.1


def _finite_or_none(x: float) -> float | None:
  return float(x) if math.isfinite(x) else None


def first_nonfinite_step(run: RunMetrics) -> int | None:
  """The first logged step whose loss is NaN or infinite, or None."""
  bad = ~np.isfinite(run.loss)
  return int(run.steps[np.argmax(bad)]) if bad.any() else None


def warmup_end_step(run: RunMetrics) -> int | None:
  """The first step at which the logged learning rate reaches its maximum; None without a usable LR column."""
  lr = run.learning_rate
  ok = np.isfinite(lr)
  if not ok.any():
    return None
  peak = np.max(lr[ok])
  return int(run.steps[ok][np.argmax(lr[ok] >= peak * (1 - 1e-6))])


def _median(values: np.ndarray) -> float | None:
  values = values[np.isfinite(values)]
  return float(np.median(values)) if len(values) else None


def _spread(times: np.ndarray) -> float | None:
  """p90 / p50 of the finite step times: 1.0 for a steady machine, well above it when something else interfered."""
  times = times[np.isfinite(times) & (times > 0)]
  return float(np.percentile(times, 90) / np.median(times)) if len(times) >= 2 else None


def _machine(run: RunMetrics) -> MachineLoad | None:
  try:
    return MachineLoad.model_validate(run.info.machine) if run.info.machine else None
  except ValueError:  # a machine.json from another version: the comparison does without it
    return None


def summarize_run(run: RunMetrics, settings: ComparisonSettings) -> RunSummary:
  """One run's own numbers: length, divergence, smoothed final loss, median throughput, backend, machine load."""
  keep = run.steps >= settings.perf_start_step
  times = run.step_time[keep]
  bad = first_nonfinite_step(run)
  info = run.info
  return RunSummary(
      name=run.name,
      source=run.source,
      path=run.path,
      num_steps=len(run.steps),
      first_step=int(run.steps[0]),
      last_step=int(run.steps[-1]),
      diverged=bad is not None,
      first_nonfinite_step=bad,
      final_loss_smoothed=smoothed_final_loss(run, settings.smooth),
      perf_steps=int(np.isfinite(times).sum()),
      median_step_time_s=_median(times),
      median_tflops_per_sec_per_device=_median(run.tflops[keep]),
      median_tokens_per_sec_per_device=_median(run.tokens_per_sec[keep]),
      skipped_lines=run.skipped_lines,
      quantization=info.quantization,
      hardware=info.hardware,
      backend=info.backend,
      nvfp4_gemms=info.nvfp4_gemms,
      mlp_flop_share=info.mlp_flop_share,
      # The fused backend's block-scaled GEMM is a dequantize + dot where XLA has no NVFP4 GEMM (CPU, as here).
      emulated=(info.backend == "emulated" or (info.backend == "fused" and info.hardware == "cpu"))
      and bool(info.nvfp4_gemms),
      step_time_p90_over_p50=_spread(times),
      machine=_machine(run),
  )


def smoothed_final_loss(run: RunMetrics, smooth: int) -> float | None:
  """Trailing mean of the last `smooth` finite losses before any divergence."""
  bad = first_nonfinite_step(run)
  loss = run.loss if bad is None else run.loss[run.steps < bad]
  return float(np.mean(loss[-smooth:])) if len(loss) else None


def _status(base_bad: int | None, cand_bad: int | None, common: int) -> Status:
  if common == 0:
    return Status.NO_COMMON_STEPS
  if base_bad is not None and cand_bad is not None:
    return Status.BOTH_DIVERGED
  if cand_bad is not None:
    return Status.CANDIDATE_DIVERGED
  if base_bad is not None:
    return Status.BASELINE_DIVERGED
  return Status.OK


def _window_start(baseline: RunMetrics, steps: np.ndarray, settings: ComparisonSettings) -> tuple[int, WindowRule]:
  if settings.window_start is not None:
    return settings.window_start, WindowRule.EXPLICIT
  warm = warmup_end_step(baseline)
  if warm is not None and warm < int(steps[-1]):
    return warm, WindowRule.LR_PEAK
  first, last = int(steps[0]), int(steps[-1])
  return first + math.ceil(DEFAULT_WINDOW_FRACTION * (last - first)), WindowRule.FRACTION


def loss_gap(
    baseline: RunMetrics, candidate: RunMetrics, steps: np.ndarray, settings: ComparisonSettings
) -> LossGap | None:
  """Gap statistics on `steps` (aligned, finite in both runs); None when the window holds no step."""
  if len(steps) == 0:
    return None
  start, rule = _window_start(baseline, steps, settings)
  window = steps[steps >= start]
  if len(window) == 0:
    return None
  base = baseline.loss[np.searchsorted(baseline.steps, window)]
  cand = candidate.loss[np.searchsorted(candidate.steps, window)]
  gap = cand - base
  k = min(settings.smooth, len(window))
  i_max = int(np.argmax(gap))
  return LossGap(
      window_start_step=int(start),
      window_end_step=int(window[-1]),
      window_rule=rule,
      num_steps=len(window),
      mean_nats=float(np.mean(gap)),
      max_nats=float(gap[i_max]),
      max_step=int(window[i_max]),
      max_abs_nats=float(np.max(np.abs(gap))),
      final_smoothed_nats=float(np.mean(cand[-k:]) - np.mean(base[-k:])),
      smooth_steps=k,
      baseline_final_smoothed_loss=float(np.mean(base[-k:])),
  )


def step0_agreement(baseline: RunMetrics, candidate: RunMetrics, tolerance: float) -> Step0:
  """Losses at step 0 (same weights and data -> nearly equal); the numbers are null when either run lacks step 0."""
  if not (baseline.steps[0] == 0 and candidate.steps[0] == 0):
    return Step0(baseline_loss=None, candidate_loss=None, abs_diff=None, tolerance=tolerance, within_tolerance=None)
  b, c = float(baseline.loss[0]), float(candidate.loss[0])
  diff = abs(c - b)
  return Step0(
      baseline_loss=_finite_or_none(b),
      candidate_loss=_finite_or_none(c),
      abs_diff=_finite_or_none(diff),
      tolerance=tolerance,
      within_tolerance=bool(diff <= tolerance),  # NaN compares False: a NaN step 0 never agrees
  )


def eval_gaps(baseline: RunMetrics, candidate: RunMetrics) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(steps, baseline eval losses, candidate - baseline) at every train step after which both logged an eval pass."""
  common = np.intersect1d(baseline.eval_steps, candidate.eval_steps)
  b = baseline.eval_loss[np.searchsorted(baseline.eval_steps, common)]
  c = candidate.eval_loss[np.searchsorted(candidate.eval_steps, common)]
  return common, b, c - b


def _final_eval_gap(baseline: RunMetrics, candidate: RunMetrics) -> tuple[int | None, float | None, float | None]:
  """(step, gap, baseline eval loss) at the last common eval; Nones without one."""
  steps, base, gap = eval_gaps(baseline, candidate)
  if len(steps) == 0:
    return None, None, None
  return int(steps[-1]), _finite_or_none(gap[-1]), _finite_or_none(base[-1])


#: Confidence of the paired eval-gap interval.
CI_LEVEL = 0.95


def paired_eval_gap(baseline: RunMetrics, candidate: RunMetrics,
                    step: int | None) -> tuple[tuple[float, float] | None, int, str | None]:
  """(95% interval of the eval gap in nats, eval batches, why there is none) at the eval after train step `step`.

  Both runs evaluate the same held-out batches, so each batch's loss difference is one paired sample; the gap is their
  token-weighted mean (equal to the difference of the two eval losses) and the interval is Student's t on the
  batches, n - 1 degrees of freedom. It says how much the gap could move with other eval batches of the same kind,
  not with another seed (MaxText.compare's run groups measure that). Refused when the two passes did not see the same
  batches (another count, or other token counts per batch), and absent where the per-batch losses were not logged.
  """
  if step is None:
    return None, 0, "no common eval"
  missing = [r.name for r in (baseline, candidate) if step not in r.eval_batches]
  if missing:
    return None, 0, (f"no per-batch eval losses at step {step} from {' and '.join(missing)} (maxtext's metrics_file "
                     "holds them for the last eval pass)")
  return paired_gap(np.array(baseline.eval_batches[step]), np.array(candidate.eval_batches[step]))


def paired_gap(base: np.ndarray, cand: np.ndarray) -> tuple[tuple[float, float] | None, int, str | None]:
  """(95% interval of candidate - baseline in nats, batches, why there is none) from two [batches, 2] arrays of
  (mean loss, tokens) on the same eval batches: paired_eval_gap's statistics, for any two evaluations of one set
  (two runs' eval passes, or two exports of one checkpoint: scripts/eval_export.py)."""
  if base.shape != cand.shape or not np.array_equal(base[:, 1], cand[:, 1]):
    return None, 0, (f"mismatched eval sets: {len(base)} vs {len(cand)} batches or other token counts "
                     "per batch; paired intervals need the same eval batches in both runs")
  n = len(base)
  if n < 2:
    return None, n, "one eval batch: no spread to build an interval from; raise eval_steps"
  weights, diffs = base[:, 1], cand[:, 0] - base[:, 0]
  if not np.all(np.isfinite(diffs)):
    return None, n, "non-finite eval batch losses"
  mean = float(np.sum(weights * diffs) / np.sum(weights))
  share = weights / np.sum(weights)
  stderr = math.sqrt(n / (n - 1) * float(np.sum(share**2 * (diffs - mean) ** 2)))
  half = float(stats.t.ppf(0.5 + CI_LEVEL / 2, n - 1)) * stderr
  return (mean - half, mean + half), n, None


def compare(baseline: RunMetrics, candidate: RunMetrics, settings: ComparisonSettings) -> Comparison:
  """Compares one candidate run with the baseline; never raises on divergence, gaps or mismatched lengths."""
  common = np.intersect1d(baseline.steps, candidate.steps)
  base_bad, cand_bad = first_nonfinite_step(baseline), first_nonfinite_step(candidate)
  bads = [s for s in (base_bad, cand_bad) if s is not None]
  first_bad = min(bads) if bads else None
  usable = common if first_bad is None else common[common < first_bad]
  base_sum, cand_sum = summarize_run(baseline, settings), summarize_run(candidate, settings)
  base_time, cand_time = base_sum.median_step_time_s, cand_sum.median_step_time_s
  ratio = base_time / cand_time if base_time and cand_time else None
  withheld = verdict.speedup_withheld(base_sum, cand_sum, settings)
  eval_step, eval_gap, eval_base = _final_eval_gap(baseline, candidate)
  if first_bad is not None and eval_step is not None and eval_step >= first_bad:
    eval_step, eval_gap, eval_base = None, None, None  # an eval after a divergence compares broken weights
  ci, batches, ci_missing = paired_eval_gap(baseline, candidate, eval_step)
  status = _status(base_bad, cand_bad, len(common))
  gap = loss_gap(baseline, candidate, usable, settings)
  step0 = step0_agreement(baseline, candidate, settings.step0_tolerance)
  return Comparison(
      candidate=candidate.name,
      baseline=baseline.name,
      status=status,
      common_steps=len(common),
      baseline_only_steps=len(np.setdiff1d(baseline.steps, candidate.steps)),
      candidate_only_steps=len(np.setdiff1d(candidate.steps, baseline.steps)),
      first_bad_step=first_bad,
      loss_gap=gap,
      step0=step0,
      step_time_ratio=ratio,
      speedup=None if withheld else ratio,
      speedup_withheld=withheld,
      final_eval_step=eval_step,
      final_eval_gap_nats=eval_gap,
      final_eval_baseline_loss=eval_base,
      final_eval_gap_rel=eval_gap / eval_base if eval_gap is not None and eval_base else None,
      eval_gap_ci95=list(ci) if ci else None,
      eval_gap_batches=batches or None,
      eval_gap_ci_missing=ci_missing,
      verdict=verdict.verdict(
          status=status, first_bad_step=first_bad, step0=step0, gap=gap, eval_step=eval_step, eval_gap=eval_gap,
          eval_base=eval_base, eval_ci=ci, eval_ci_missing=ci_missing, candidate=cand_sum, settings=settings,
      ),  # fmt: skip
  )
