# Copyright 2026 The NVFP4-for-MaxText Authors. Licensed under the Apache License, Version 2.0.
"""loss.png (loss curves and the gap to the baseline) and throughput.png, drawn with matplotlib's Agg backend.

Why Agg, set here: the comparison runs on headless cluster nodes and in CI, where an interactive backend would fail
or hang; the object-oriented API below never touches pyplot's global figure state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # pylint: disable=wrong-import-position

import numpy as np  # pylint: disable=wrong-import-position

from MaxText.compare.metrics import RunMetrics  # pylint: disable=wrong-import-position
from MaxText.compare.schema import Report  # pylint: disable=wrong-import-position

_DPI = 120


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
  """Mean of each value and the up to `window - 1` values before it (the smoothing the report uses)."""
  if window <= 1 or len(values) == 0:
    return values.astype(np.float64)
  csum = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
  idx = np.arange(1, len(values) + 1)
  lo = np.maximum(idx - window, 0)
  return (csum[idx] - csum[lo]) / (idx - lo)


def _finite_prefix(run: RunMetrics) -> tuple[np.ndarray, np.ndarray]:
  """Steps and losses before the first non-finite loss (a diverged run is drawn up to where it broke)."""
  bad = ~np.isfinite(run.loss)
  end = int(np.argmax(bad)) if bad.any() else len(run.loss)
  return run.steps[:end], run.loss[:end]


def plot_loss(runs: Sequence[RunMetrics], report: Report, path: Path) -> None:
  """Top: every run's loss (raw, faint; trailing mean, solid). Bottom: smoothed candidate - baseline gap."""
  by_name = {r.name: r for r in runs}
  base = by_name[report.baseline]
  smooth = report.settings.smooth
  fig = Figure(figsize=(9, 7), dpi=_DPI)
  ax_loss, ax_gap = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
  for i, run in enumerate(runs):
    color = f"C{i}"
    steps, loss = _finite_prefix(run)
    ax_loss.plot(steps, loss, color=color, alpha=0.25, linewidth=0.8)
    ax_loss.plot(steps, trailing_mean(loss, smooth), color=color, linewidth=1.6, label=run.name)
    if len(steps) < len(run.steps):
      ax_loss.axvline(run.steps[len(steps)], color=color, linestyle=":", linewidth=1.0)
      ax_loss.annotate(f"{run.name}: non-finite loss", (run.steps[len(steps)], np.nanmax(loss) if len(loss) else 0),
                       color=color, fontsize=8, rotation=90, va="top")
  ax_loss.set_ylabel("training loss (nats)")
  ax_loss.set_title(f"loss (trailing mean over {smooth} steps)")
  ax_loss.legend(loc="best", fontsize=8)
  ax_loss.grid(alpha=0.3)
  ax_gap.axhline(0.0, color="black", linewidth=0.8)
  for i, run in enumerate(runs):
    if run.name == base.name:
      continue
    comparison = next(c for c in report.comparisons if c.candidate == run.name)
    steps = np.intersect1d(base.steps, run.steps)
    if comparison.first_bad_step is not None:
      steps = steps[steps < comparison.first_bad_step]
    gap = run.loss[np.searchsorted(run.steps, steps)] - base.loss[np.searchsorted(base.steps, steps)]
    label = run.name
    if comparison.loss_gap is not None:
      label += f" (mean {comparison.loss_gap.mean_nats:+.3f})"
      ax_gap.axvline(comparison.loss_gap.window_start_step, color=f"C{i}", linestyle="--", linewidth=0.8)
    ax_gap.plot(steps, trailing_mean(gap, smooth), color=f"C{i}", linewidth=1.4, label=label)
  ax_gap.set_xlabel("step")
  ax_gap.set_ylabel(f"loss - {base.name} (nats)")
  ax_gap.set_title("gap to the baseline (dashed: window start)")
  ax_gap.grid(alpha=0.3)
  if len(runs) > 1:
    ax_gap.legend(loc="best", fontsize=8)
  fig.tight_layout()
  fig.savefig(path)


def plot_throughput(runs: Sequence[RunMetrics], report: Report, path: Path) -> None:
  """Left: step time per step. Right: median tokens/s/device per run, annotated with the speedup."""
  fig = Figure(figsize=(11, 4.5), dpi=_DPI)
  ax_time, ax_bar = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
  start = report.settings.perf_start_step
  for i, run in enumerate(runs):
    keep = run.steps >= start
    ax_time.plot(run.steps[keep], run.step_time[keep], color=f"C{i}", linewidth=1.0, label=run.name)
  ax_time.set_xlabel("step")
  ax_time.set_ylabel("step time (s)")
  ax_time.set_title(f"step time (steps >= {start})")
  ax_time.grid(alpha=0.3)
  ax_time.legend(fontsize=8)
  speedups = {c.candidate: c.speedup for c in report.comparisons}
  names = [s.name for s in report.runs]
  values = [s.median_tokens_per_sec_per_device or 0.0 for s in report.runs]
  bars = ax_bar.bar(range(len(names)), values, color=[f"C{i}" for i in range(len(names))])
  for bar, name in zip(bars, names):
    note = "baseline" if name == report.baseline else f"x{speedups[name]:.2f}" if speedups.get(name) else "n/a"
    ax_bar.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
  ax_bar.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
  ax_bar.set_ylabel("median tokens/s/device")
  ax_bar.set_title("throughput (speedup vs baseline)")
  ax_bar.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  fig.savefig(path)
