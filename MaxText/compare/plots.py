# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""loss.png (the gap to the baseline, raw and smoothed, eval gaps, the losses) and throughput.png, with Agg.

Why Agg, set here: the comparison runs on headless cluster nodes and in CI, where an interactive backend would fail
or hang; the object-oriented API below never touches pyplot's global figure state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # pylint: disable=wrong-import-position
from matplotlib.figure import Figure  # pylint: disable=wrong-import-position

from MaxText.compare import analysis  # pylint: disable=wrong-import-position
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


#: Line styles and eval markers per candidate, so overlapping curves stay tellable apart without colour.
_STYLES = ("--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)))
_MARKERS = ("o", "s", "^", "D", "v", "P")


def _style(i: int) -> dict:
  """Colour, line style and marker of the i-th candidate (the baseline is black and solid)."""
  return {"color": f"C{i}", "linestyle": _STYLES[i % len(_STYLES)], "marker": _MARKERS[i % len(_MARKERS)]}


def _colors(runs: Sequence[RunMetrics], baseline: str) -> dict[str, str]:
  """The baseline black, candidates C0, C1, ... in input order: the same colours in both figures."""
  candidates = [r.name for r in runs if r.name != baseline]
  return {baseline: "black", **{name: _style(i)["color"] for i, name in enumerate(candidates)}}


def _band_level(base: RunMetrics, smooth: int) -> tuple[np.ndarray, np.ndarray, str]:
  """(steps, loss level, its name) the ok band scales with: the baseline's eval loss interpolated between its evals
  (what the verdict divides by), or its smoothed training loss when it has fewer than two evals."""
  steps, loss = _finite_prefix(base)
  ok = np.isfinite(base.eval_loss)
  if ok.sum() >= 2:
    return steps, np.interp(steps, base.eval_steps[ok], base.eval_loss[ok]), "eval loss"
  return steps, trailing_mean(loss, smooth), "smoothed training loss"


def _aligned_gap(base: RunMetrics, run: RunMetrics, first_bad: int | None) -> tuple[np.ndarray, np.ndarray]:
  steps = np.intersect1d(base.steps, run.steps)
  if first_bad is not None:
    steps = steps[steps < first_bad]
  gap = run.loss[np.searchsorted(run.steps, steps)] - base.loss[np.searchsorted(base.steps, steps)]
  return steps, gap


def plot_loss(runs: Sequence[RunMetrics], report: Report, path: Path) -> None:
  """Writes `loss_figure` to `path`."""
  loss_figure(runs, report).savefig(path)


def loss_figure(runs: Sequence[RunMetrics], report: Report) -> Figure:
  """Three panels, most useful first (axes 0, 1, 2).

  1. The gap to the baseline: trailing mean of the training gap (lines), the eval-loss gap (markers), and the ok band
     (+-band_rel of the baseline's smoothed loss) shaded. This is the panel to read.
  2. The raw per-step training gap, its maximum marked: what the table's max gap is.
  3. The losses themselves: training loss (trailing mean) in distinct line styles, eval loss as markers.
  """
  by_name = {r.name: r for r in runs}
  base = by_name[report.baseline]
  smooth = report.settings.smooth
  comparisons = {c.candidate: c for c in report.comparisons}
  candidates = [r for r in runs if r.name in comparisons]  # a seed group's other baseline runs are baselines
  fig = Figure(figsize=(10, 11), dpi=_DPI)
  ax_gap, ax_raw, ax_loss = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [4, 3, 3]})
  b_steps, level, what = _band_level(base, smooth)
  band = report.settings.band_rel * level
  ax_gap.fill_between(b_steps, -band, band, color="0.87", label=f"ok band: +-{100 * report.settings.band_rel:g}% of "
                      f"{base.name}'s {what}")  # fmt: skip
  for ax in (ax_gap, ax_raw):
    ax.axhline(0.0, color="black", linewidth=0.8)
  for i, run in enumerate(candidates):
    st, c = _style(i), comparisons[run.name]
    pair_base = by_name[c.baseline]  # the baseline run of the candidate's seed (MaxText.compare.seeds)
    steps, gap = _aligned_gap(pair_base, run, c.first_bad_step)
    label = f"{run.name} training" + (f" (mean {c.loss_gap.mean_nats:+.3f})" if c.loss_gap else "")
    ax_gap.plot(steps, trailing_mean(gap, smooth), color=st["color"], linestyle=st["linestyle"], linewidth=1.8,
                label=label)  # fmt: skip
    e_steps, _, e_gap = analysis.eval_gaps(pair_base, run)
    if c.first_bad_step is not None:
      e_gap = np.where(e_steps < c.first_bad_step, e_gap, np.nan)
    if len(e_steps):
      ax_gap.plot(e_steps, e_gap, color=st["color"], marker=st["marker"], markersize=8, linestyle="none",
                  markeredgecolor="black", label=f"{run.name} eval")  # fmt: skip
    if c.eval_gap_ci95 is not None and c.final_eval_step is not None:  # the paired 95% interval at the last eval
      lo, hi = c.eval_gap_ci95
      ax_gap.errorbar([c.final_eval_step], [c.final_eval_gap_nats], yerr=[[c.final_eval_gap_nats - lo],
                      [hi - c.final_eval_gap_nats]], color=st["color"], capsize=5, linewidth=1.5)  # fmt: skip
    ax_raw.plot(steps, gap, color=st["color"], linewidth=0.7, alpha=0.7, label=run.name)
    if c.loss_gap is not None:
      g = c.loss_gap
      ax_raw.plot([g.max_step], [g.max_nats], color=st["color"], marker=st["marker"], markeredgecolor="black")
      ax_raw.annotate(f"max {g.max_nats:+.3f} @ {g.max_step}", (g.max_step, g.max_nats), xytext=(4, 4),
                      textcoords="offset points", fontsize=8, color=st["color"])  # fmt: skip
  windows = {c.loss_gap.window_start_step for c in report.comparisons if c.loss_gap}
  for start in windows:
    for ax in (ax_gap, ax_raw):
      ax.axvline(start, color="0.4", linestyle="--", linewidth=0.8)
  ax_gap.set_ylabel(f"loss - {base.name} (nats)")
  ax_gap.set_title(f"gap to {base.name}: training (trailing mean over {smooth} steps), eval (markers, last with "
                   "its paired 95% interval); dashed: window start", fontsize=10)  # fmt: skip
  ax_raw.set_ylabel("nats, per step")
  ax_raw.set_title(f"raw training gap to {base.name}, one point per step (no smoothing)", fontsize=10)
  _plot_losses(ax_loss, base, candidates, smooth)
  ax_raw.margins(y=0.15)  # room for the max annotations
  for ax, where in ((ax_gap, "best"), (ax_raw, "lower left"), (ax_loss, "best")):  # raw: the max labels sit on top
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(loc=where, fontsize=7, ncol=2, framealpha=0.8)
  ax_loss.set_xlabel("step")
  fig.tight_layout()
  return fig


def _plot_losses(ax, base: RunMetrics, candidates: Sequence[RunMetrics], smooth: int) -> None:
  """Training loss (trailing mean) per run in distinct styles, eval loss as markers; the baseline black and solid."""
  for i, run in enumerate([base, *candidates]):
    st = {"color": "black", "linestyle": "-", "marker": "*"} if i == 0 else _style(i - 1)
    steps, loss = _finite_prefix(run)
    ax.plot(steps, trailing_mean(loss, smooth), color=st["color"], linestyle=st["linestyle"], linewidth=1.5,
            label=f"{run.name}: training")  # fmt: skip
    if len(run.steps) > len(steps):
      ax.axvline(run.steps[len(steps)], color=st["color"], linestyle=":", linewidth=1.0)
      ax.annotate(f"{run.name}: non-finite loss", (run.steps[len(steps)], 0.98), xycoords=("data", "axes fraction"),
                  color=st["color"], fontsize=8, rotation=90, va="top")  # fmt: skip
    ok = np.isfinite(run.eval_loss)
    if ok.any():
      ax.plot(run.eval_steps[ok], run.eval_loss[ok], color=st["color"], marker=st["marker"], linestyle="none",
              markersize=7, markerfacecolor="none", label=f"{run.name}: eval")  # fmt: skip
  ax.set_ylabel("loss (nats)")
  ax.set_title(f"loss: training (trailing mean over {smooth} steps), eval (open markers); close curves overlap, "
               "the panels above separate them", fontsize=10)  # fmt: skip


def plot_throughput(runs: Sequence[RunMetrics], report: Report, path: Path) -> None:
  """Left: step time per step. Right: median step time per run, relative to the baseline, speedup only if claimed."""
  fig = Figure(figsize=(11, 4.5), dpi=_DPI)
  ax_time, ax_bar = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
  start = report.settings.perf_start_step
  emulated = any(r.emulated for r in report.runs)
  what = "emulation cost, not NVFP4 speed" if emulated else "step time"
  colors = _colors(runs, report.baseline)
  for run in runs:
    keep = run.steps >= start
    ax_time.plot(run.steps[keep], run.step_time[keep], color=colors[run.name], linewidth=1.0, label=run.name)
  ax_time.set_xlabel("step")
  ax_time.set_ylabel("step time (s)")
  ax_time.set_title(f"step time per step (steps >= {start}): {what}", fontsize=10)
  ax_time.grid(alpha=0.3)
  ax_time.legend(fontsize=8)
  comparisons = {c.candidate: c for c in report.comparisons}
  names = [s.name for s in report.runs]
  values = [s.median_step_time_s or 0.0 for s in report.runs]
  bars = ax_bar.bar(range(len(names)), values, color=[colors[n] for n in names])
  for bar, name in zip(bars, names):
    c = comparisons.get(name)
    if c is None:
      note = "baseline"
    elif c.speedup is not None:
      note = f"speedup x{c.speedup:.2f}"
    elif c.step_time_ratio:
      note = f"x{1 / c.step_time_ratio:.2f} time"
    else:
      note = "n/a"
    ax_bar.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
  ax_bar.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
  ax_bar.set_ylabel("median step time (s)")
  withheld = any(c.speedup_withheld for c in report.comparisons)
  ax_bar.set_title("median step time" + (" (no speedup claimed: see report.md)" if withheld else ""), fontsize=10)
  ax_bar.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  fig.savefig(path)
