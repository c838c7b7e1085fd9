# Copyright 2026 The NVFP4-for-MaxText Authors. Licensed under the Apache License, Version 2.0.
"""Builds the report from loaded runs and writes report.json, report.md, loss.png and throughput.png.

Why a markdown table as the printed output too: the same text goes to the terminal, into report.md and into the
README, so a number quoted anywhere can be traced to one generator.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from MaxText.compare import analysis, plots
from MaxText.compare.metrics import RunMetrics
from MaxText.compare.schema import Comparison, Report, Settings

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
LOSS_PNG = "loss.png"
THROUGHPUT_PNG = "throughput.png"


def build_report(runs: Sequence[RunMetrics], baseline: str, settings: Settings) -> Report:
  """Compares every run other than `baseline` with it.

  Raises:
    ValueError: `baseline` names no run, or two runs share a name.
  """
  names = [r.name for r in runs]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(f"several runs are named {duplicates}; name them explicitly with NAME=PATH arguments")
  if baseline not in names:
    raise ValueError(f"--baseline {baseline!r} is not one of the runs {names}; pass one of those names")
  base = runs[names.index(baseline)]
  return Report(
      baseline=baseline,
      settings=settings,
      runs=[analysis.summarize_run(r, settings) for r in runs],
      comparisons=[analysis.compare(base, r, settings) for r in runs if r.name != baseline],
  )


def _fmt(value: float | None, spec: str) -> str:
  return "n/a" if value is None else format(value, spec)


def _status_note(c: Comparison) -> str:
  if c.first_bad_step is None:
    return c.status.value
  return f"{c.status.value} at step {c.first_bad_step}"


def markdown_table(report: Report) -> str:
  """One row per run: loss gaps against the baseline, step-0 agreement and throughput."""
  by_candidate = {c.candidate: c for c in report.comparisons}
  header = (
      "| run | status | steps | mean gap (nats) | max gap (nats) | final gap (nats) | step-0 diff "
      "| step time (s) | TFLOP/s/dev | tokens/s/dev | speedup |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
  )
  rows = []
  for run in sorted(report.runs, key=lambda r: r.name != report.baseline):  # baseline first, then input order
    c = by_candidate.get(run.name)
    perf = (
        f"| {_fmt(run.median_step_time_s, '.4f')} | {_fmt(run.median_tflops_per_sec_per_device, '.3f')} "
        f"| {_fmt(run.median_tokens_per_sec_per_device, '.1f')} "
    )
    if c is None:
      status = "baseline" + (f", diverged at step {run.first_nonfinite_step}" if run.diverged else "")
      rows.append(f"| {run.name} | {status} | {run.num_steps} | — | — | — | — {perf}| 1.00 |")
      continue
    gap = c.loss_gap
    step0 = "n/a" if c.step0.abs_diff is None else f"{c.step0.abs_diff:.4f}" + ("" if c.step0.within_tolerance else " (!)")
    rows.append(
        f"| {run.name} | {_status_note(c)} | {c.common_steps} | {_fmt(gap and gap.mean_nats, '+.4f')} "
        f"| {_fmt(gap and gap.max_nats, '+.4f')} | {_fmt(gap and gap.final_smoothed_nats, '+.4f')} | {step0} "
        f"{perf}| {_fmt(c.speedup, '.2f')} |"
    )
  return header + "\n".join(rows) + "\n"


def markdown_report(report: Report) -> str:
  """report.md: the table plus the settings and the definitions needed to read it."""
  s = report.settings
  windows = sorted({(c.loss_gap.window_start_step, c.loss_gap.window_rule.value) for c in report.comparisons if c.loss_gap})
  window_text = ", ".join(f"steps >= {start} ({rule})" for start, rule in windows) or "empty"
  lines = [
      f"# Precision comparison against `{report.baseline}`",
      "",
      markdown_table(report),
      f"- Gap = candidate loss - baseline loss in nats on the steps both runs logged; window: {window_text}.",
      f"- Final gap: trailing mean over the last {s.smooth} window steps. Max gap: largest signed gap.",
      f"- Step-0 diff: absolute loss difference at step 0; (!) marks a difference above {s.step0_tolerance} nats, i.e. "
      "different initial weights or data (any maxtext quantization object changes the initialization).",
      f"- Throughput: medians over steps >= {s.perf_start_step}; speedup = baseline step time / run step time.",
      "",
      f"![loss]({LOSS_PNG})",
      "",
      f"![throughput]({THROUGHPUT_PNG})",
      "",
  ]
  return "\n".join(lines)


def write_report(runs: Sequence[RunMetrics], report: Report, out_dir: str | Path) -> dict[str, Path]:
  """Writes the four files into `out_dir` (created if missing) and returns their paths by name."""
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = {name: out / name for name in (REPORT_JSON, REPORT_MD, LOSS_PNG, THROUGHPUT_PNG)}
  paths[REPORT_JSON].write_text(json.dumps(report.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
  paths[REPORT_MD].write_text(markdown_report(report), encoding="utf-8")
  plots.plot_loss(runs, report, paths[LOSS_PNG])
  plots.plot_throughput(runs, report, paths[THROUGHPUT_PNG])
  return paths


def read_report(path: str | Path) -> Report:
  """Reads and validates a report.json (raises pydantic.ValidationError if it does not match the schema)."""
  return Report.model_validate_json(Path(path).read_text(encoding="utf-8"))
