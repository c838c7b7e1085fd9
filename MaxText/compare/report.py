# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Builds the report from loaded runs and writes report.json, report.md, loss.png and throughput.png, and a
stats_<run>.png heatmap for every run that logged NVFP4 quantization statistics.

Why a markdown table as the printed output too: the same text goes to the terminal, into report.md and into the
docs, so a number quoted anywhere can be traced to one generator.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from MaxText.compare import analysis, plots, quantstats, seeds
from MaxText.compare.metrics import RunMetrics
from MaxText.compare.schema import Comparison, ComparisonSettings, Report, RunSummary

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
LOSS_PNG = "loss.png"
THROUGHPUT_PNG = "throughput.png"


def build_report(runs: Sequence[RunMetrics], baseline: str, settings: ComparisonSettings) -> Report:
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
  by_name = dict(zip(names, runs))
  base_group = seeds.split_name(baseline)[0]
  baseline_runs = [r for r in runs if r.name == baseline or (seeds.split_name(r.name)[1] is not None
                                                             and seeds.split_name(r.name)[0] == base_group)]
  comparisons = [analysis.compare(by_name[seeds.baseline_for(r.name, baseline, names)], r, settings)
                 for r in runs if r not in baseline_runs]
  summaries = [analysis.summarize_run(r, settings) for r in runs]
  shares = [r.mlp_flop_share for r in sorted(summaries, key=lambda r: r.name != baseline) if r.mlp_flop_share is not None]
  baseline_eval = {r.name: (float(r.eval_loss[-1]) if len(r.eval_loss) and math.isfinite(r.eval_loss[-1]) else None)
                   for r in baseline_runs}
  return Report(
      baseline=baseline,
      settings=settings,
      runs=summaries,
      mlp_flop_share=shares[0] if shares else None,
      comparisons=comparisons,
      quant_stats=[q for r in runs if (q := quantstats.summarize(r)) is not None],
      seed_groups=seeds.groups(comparisons, baseline_eval, baseline, settings),
  )


def _fmt(value: float | None, spec: str) -> str:
  return "n/a" if value is None else format(value, spec)


def _status_note(c: Comparison) -> str:
  if c.first_bad_step is None:
    return c.status.value
  return f"{c.status.value} at step {c.first_bad_step}"


def _baseline_first(report: Report) -> list[RunSummary]:
  return sorted(report.runs, key=lambda r: r.name != report.baseline)  # baseline first, then input order


def _markdown_table(header: str, rows: list[list[str]]) -> str:
  """`header` (its column and alignment lines) followed by one `| a | b |` line per row."""
  return header + "\n".join("| " + " | ".join(row) + " |" for row in rows) + "\n"


def loss_table(report: Report) -> str:
  """One row per run: the eval-loss gap at the last common eval beside the training gaps, step-0 diff, verdict."""
  by_candidate = {c.candidate: c for c in report.comparisons}
  header = (
      "| run | status | steps | eval gap (nats) | 95% interval (batches) | eval gap (%) | at step "
      "| final train gap (nats) | mean train gap | max train gap (step) | step-0 diff | verdict |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
  )
  rows = []
  for run in _baseline_first(report):
    c = by_candidate.get(run.name)
    if c is None:
      status = "baseline" + (f", diverged at step {run.first_nonfinite_step}" if run.diverged else "")
      evals = {x.final_eval_baseline_loss for x in report.comparisons if x.final_eval_baseline_loss is not None}
      eval_note = f"eval loss {min(evals):.3f}" if len(evals) == 1 else "—"
      rows.append([run.name, status, str(run.num_steps), eval_note] + ["—"] * 8)
      continue
    gap = c.loss_gap
    step0 = "n/a" if c.step0.abs_diff is None else f"{c.step0.abs_diff:.4f}"
    step0 += "" if c.step0.abs_diff is None or c.step0.within_tolerance else " (!)"
    rel = None if c.final_eval_gap_rel is None else 100 * c.final_eval_gap_rel
    max_gap = "n/a" if gap is None else f"{gap.max_nats:+.4f} ({gap.max_step})"
    rows.append([run.name, _status_note(c), str(c.common_steps), _fmt(c.final_eval_gap_nats, "+.4f"),
                 _interval_note(c), _fmt(rel, "+.2f"), _fmt(c.final_eval_step, "d"),
                 _fmt(gap and gap.final_smoothed_nats, "+.4f"), _fmt(gap and gap.mean_nats, "+.4f"), max_gap, step0,
                 f"**{c.verdict.level.value}**"])
  return _markdown_table(header, rows)


def seed_lines(report: Report) -> list[str]:
  """The "Across seeds" section: per seed group, the mean paired eval gap, its spread and interval, and the noise
  floor; [] when no run is named NAME@SEED."""
  if not report.seed_groups:
    return []
  header = ("| group | paired runs | mean eval gap (nats) | sd across seeds | 95% interval | baseline noise sd | "
            "differs from baseline | verdict | notes |\n|---|---:|---:|---:|---:|---:|---|---|---|\n")
  rows = []
  for g in report.seed_groups:
    ci = "—" if g.ci95 is None else f"[{g.ci95[0]:+.4f}, {g.ci95[1]:+.4f}]"
    notes = "; ".join([*([g.note] if g.note else []), *(f"unpaired: {u}" for u in g.unpaired)]) or "—"
    differs = "—" if g.differs_from_baseline is None else ("yes" if g.differs_from_baseline else "no")
    level = "—" if g.verdict is None else f"**{g.verdict.value}**"
    rows.append([g.group, str(len(g.eval_gaps_nats)), _fmt(g.mean_eval_gap_nats, "+.4f"), _fmt(g.sd_nats, ".4f"), ci,
                 _fmt(g.baseline_noise_sd_nats, ".4f"), differs, level, notes])
  return ["## Across seeds", "", _markdown_table(header, rows),
          f"- Runs named NAME@SEED form group NAME; each is paired with `{seeds.split_name(report.baseline)[0]}@SEED` "
          "(same weights and data order). The interval is Student's t over seeds; the baseline noise sd is the "
          "baseline's own seed-to-seed spread of final eval losses. Differs from baseline: the interval excludes 0. "
          "Verdict: the mean gap relative to the baseline runs' mean eval loss, judged by the interval across seeds "
          "as a run's is by its eval-batch interval (ok: all of it inside the band; inconclusive: it reaches both "
          "inside and outside; more seeds narrow it).", ""]


def _interval_note(c: Comparison) -> str:
  """The eval gap's 95% interval and how many batches it pairs, or "—" (the reason is in the verdict)."""
  if c.eval_gap_ci95 is None:
    return "—"
  lo, hi = c.eval_gap_ci95
  return f"[{lo:+.4f}, {hi:+.4f}] ({c.eval_gap_batches})"


def _gemm_note(run: RunSummary) -> str:
  if run.nvfp4_gemms is None:
    return "—"
  return f"{run.nvfp4_gemms} ({run.backend})" if run.nvfp4_gemms else "0"


def _quantization_note(run: RunSummary) -> str:
  """maxtext's `quantization`, said plainly where it misleads: an NVFP4 mode whose plan runs no GEMM in NVFP4 (the
  quickstart's baseline, te_nvfp4 with nvfp4_mlp_precision=bf16) is a BF16 run."""
  if run.quantization is None:
    return "n/a"
  if run.nvfp4_gemms == 0 and run.quantization.startswith("te_nvfp4"):
    return f"bf16 ({run.quantization} with no GEMM in NVFP4)"
  return run.quantization or "none"


def any_emulated(report: Report) -> bool:
  return any(r.emulated for r in report.runs)


def speed_table(report: Report) -> str:
  """One row per run: step time (labelled emulation cost where NVFP4 was emulated), spread, load, speedup."""
  by_candidate = {c.candidate: c for c in report.comparisons}
  time_label = "step time (s), emulation cost" if any_emulated(report) else "step time (s)"
  header = (
      f"| run | quantization | NVFP4 GEMMs (backend) | {time_label} | p90/p50 | TFLOP/s/dev | tokens/s/dev "
      "| step time x baseline | speedup | other load (cores) |\n"
      "|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
  )
  rows = []
  for run in _baseline_first(report):
    c = by_candidate.get(run.name)
    cost = "1.00" if c is None else _fmt(c.step_time_ratio and 1 / c.step_time_ratio, ".2f")
    speedup = "—" if c is None else ("withheld" if c.speedup_withheld else _fmt(c.speedup, ".2f"))
    load = "n/a" if run.machine is None else _fmt(run.machine.other_cores, ".2f")
    quant = _quantization_note(run)
    rows.append([run.name, quant, _gemm_note(run), _fmt(run.median_step_time_s, ".4f"),
                 _fmt(run.step_time_p90_over_p50, ".2f"), _fmt(run.median_tflops_per_sec_per_device, ".3f"),
                 _fmt(run.median_tokens_per_sec_per_device, ".1f"), cost, speedup, load])
  return _markdown_table(header, rows)


def verdict_lines(report: Report) -> str:
  """`- **name**: verdict` for every candidate, after the thresholds they use."""
  s = report.settings
  head = (
      f"Verdicts (relative gap = gap / baseline loss; |gap| <= {100 * s.band_rel:g}%: ok, the band NVIDIA's NVFP4 "
      f"paper reports against FP8; up to {100 * s.drift_rel:g}%: drifting; above: off; judged at the last common "
      "eval, else on the smoothed final training gap):"
  )
  return head + "\n" + "".join(f"- **{c.candidate}**: {c.verdict.text}\n" for c in report.comparisons)


def _speed_notes(report: Report) -> list[str]:
  s = report.settings
  notes = []
  if any_emulated(report):
    notes.append(
        "- **NVFP4 ran emulated** (precision_plan.json: backend emulated): its step time is the cost of emulating FP4 "
        "in f32 on this machine, not NVFP4 speed. No speedup is claimed."
    )
  for c in report.comparisons:
    if c.speedup_withheld:
      notes.append(f"- {c.candidate}: speedup withheld: {c.speedup_withheld}.")
  loads = [(r.name, r.machine) for r in report.runs if r.machine is not None]
  if loads:
    cores = loads[0][1].cpu_count
    busiest = max(loads, key=lambda x: x[1].other_cores or 0.0)
    spans = ", ".join(
        f"{n} {m.loadavg_before[0]:.1f}->{m.loadavg_after[0]:.1f}" for n, m in loads
    )
    verdict_text = (
        "step times are unreliable" if (busiest[1].other_cores or 0.0) > s.contention_cores else "below the threshold"
    )
    notes.append(
        f"- Machine load ({cores} cores): other work kept up to {_fmt(busiest[1].other_cores, '.2f')} cores busy "
        f"(during {busiest[0]}; threshold {s.contention_cores}): {verdict_text}. 1-minute load average before->after "
        f"each run: {spans}."
    )
  else:
    notes.append(
        "- Machine load: not recorded (machine.json is written by the quickstart); p90/p50 shows step-time noise."
    )
  notes.append(
      f"- Step times: medians over steps >= {s.perf_start_step}; p90/p50 near 1 means steady steps. A speedup "
      "(baseline step time / run step time) is claimed only for non-emulated runs on an accelerator on a quiet machine."
  )
  return notes


def markdown_summary(report: Report) -> str:
  """What the CLI prints: the verdicts and both tables."""
  return verdict_lines(report) + "\n" + loss_table(report) + "\n" + speed_table(report)


def markdown_table(report: Report) -> str:
  """Both tables (loss, then step time), as printed and as in report.md."""
  return loss_table(report) + "\n" + speed_table(report)


def quant_stats_lines(report: Report) -> list[str]:
  """report.md's "Where NVFP4 loses most": per run that logged statistics, its worst GEMM operands and a key to try."""
  if not report.quant_stats:
    return []
  lines = ["## Where NVFP4 loses most", ""]
  for q in report.quant_stats:
    rows = [[str(r.layer), r.gemm, r.operand, _fmt(r.rel_error, ".4f"), _fmt(r.underflow, ".2%")] for r in q.worst]
    lines += [f"`{q.run}`, statistics step {q.step} ({q.statistics} statistics; heatmap `{q.heatmap}`):", "",
              _markdown_table("| layer | GEMM | operand | rel_error | underflow |\n|---:|---|---|---:|---:|\n", rows)]
    if q.worst_layer is not None:
      means = (f"{_fmt(q.worst_layer_mean_rel_error, '.4f')}; median layer {_fmt(q.median_layer_mean_rel_error, '.4f')}"
               f"; the other layers spread over {_fmt(q.others_spread, '.4f')}")
      excess = ("" if q.worst_layer_mean_rel_error is None or not q.others_median else
                f", {q.worst_layer_mean_rel_error / q.others_median - 1:.1%} above their median")
      rule = (f"a layer stands out when its mean exceeds the other layers' median by more than their spread and by "
              f"more than {quantstats.STANDS_OUT_MARGIN:.0%}")
      if q.try_key:
        lines.append(f"- Layer {q.worst_layer} has the largest mean relative error over its GEMM operands and stands "
                     f"out from the others ({means}{excess}; {rule}). To try: `{q.try_key}` (that layer's MLP GEMMs "
                     "in BF16), and compare the eval gap.")
      elif q.stands_out is None:
        lines.append(f"- No layer stands out: layer {q.worst_layer}'s mean relative error is the largest "
                     f"({means}{excess}), but with fewer than two other layers there is no spread to judge it by.")
      else:
        lines.append(f"- No layer stands out: layer {q.worst_layer}'s mean relative error is the largest "
                     f"({means}{excess}), but {rule}; no layer to steer to BF16 on this evidence.")
    lines.append("")
  lines += ["- rel_error: ||dequantize(quantize(x)) - x|| / ||x|| of the operand as the GEMM quantizes it (wgrad operands"
            " after the RHT); underflow: the fraction of its nonzero elements that quantize to 0. dY uses nearest "
            "rounding for the statistic (the recipe rounds it stochastically).", ""]
  return lines


def flop_share_line(report: Report) -> str:
  """What share of the training FLOPs NVFP4 could touch: the first thing to know before reading a gap."""
  if report.mlp_flop_share is None:
    return "- MLP share of the training FLOPs: not recorded (no run wrote a precision plan with it)."
  share = report.mlp_flop_share
  caution = " NVFP4 runs only these GEMMs, so gaps measured on this model say little about NVFP4." if share < 0.5 else ""
  return (f"- The MLP GEMMs, the only GEMMs NVFP4 runs, carry {share:.2f} of this model's training FLOPs "
          f"(maxtext's FLOP count; report.json: mlp_flop_share).{caution}")


def markdown_report(report: Report) -> str:
  """report.md: verdicts, the loss table, the step-time table, and the definitions needed to read them."""
  s = report.settings
  gaps = [c.loss_gap for c in report.comparisons if c.loss_gap]
  windows = sorted({(g.window_start_step, g.window_rule.value) for g in gaps})
  window_text = ", ".join(f"steps >= {start} ({rule})" for start, rule in windows) or "empty"
  lines = [
      f"# Precision comparison against `{report.baseline}`",
      "",
      verdict_lines(report),
      "## Loss",
      "",
      loss_table(report),
      flop_share_line(report),
      "- Eval gap: candidate - baseline eval loss at the last train step after which both ran an eval pass (the same "
      "held-out tokens in every run); %: relative to the baseline's eval loss. The verdict uses it.",
      "- Training gaps: candidate - baseline training loss in nats on the steps both runs logged; window: "
      f"{window_text}. "
      f"Final: difference of trailing means over the last {s.smooth} window steps. Max: largest single-step gap. "
      "Training batches differ from step to step, so single-step gaps swing far more than the eval gap, and a "
      "short run's final training gap can even have the other sign (loss.png, middle panel).",
      f"- Step-0 diff: absolute loss difference at step 0; (!) marks a difference above {s.step0_tolerance} nats, i.e. "
      "different initial weights or data (any maxtext quantization object changes the initialization).",
      "",
      *seed_lines(report),
      "## Step time",
      "",
      speed_table(report),
      *_speed_notes(report),
      "",
      f"![loss]({LOSS_PNG})",
      "",
      f"![throughput]({THROUGHPUT_PNG})",
      "",
      *quant_stats_lines(report),
      *[f"![{q.run} statistics]({q.heatmap})\n" for q in report.quant_stats],
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
  for path in quantstats.plot_all(runs, out):
    paths[path.name] = path
  return paths


def read_report(path: str | Path) -> Report:
  """Reads and validates a report.json (raises pydantic.ValidationError if it does not match the schema)."""
  return Report.model_validate_json(Path(path).read_text(encoding="utf-8"))
