# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The one-line verdict per candidate, and whether its step-time ratio may be called a speedup.

Why relative gaps with fixed thresholds: NVIDIA's NVFP4 pretraining paper reports the NVFP4 loss within 1% (relative)
of FP8's through the stable phase and about 1.5% late in the decay; `ComparisonSettings.band_rel` (1%) is that band and
`ComparisonSettings.drift_rel` (3%) is where "drifting, fix it" becomes "off, do not use as is". The gap judged is the one at
the last eval both runs logged (fixed held-out tokens) and, without evals, the smoothed final training gap; training
losses of single batches swing far more than these bands (see the report's raw gap panel).
"""

from __future__ import annotations

from MaxText.compare.schema import ComparisonSettings, LossGap, RunSummary, Status, Step0, Verdict, VerdictLevel

#: The config key for the action the paper takes when NVFP4 drifts: the final transformer blocks in BF16.
BF16_LAST_LAYERS_KEY = "nvfp4_bf16_last_layers"


def is_nvfp4(run: RunSummary) -> bool:
  """True when the run has NVFP4 GEMMs (plan), else when its quantization (or, lacking both, its name) says so."""
  if run.nvfp4_gemms is not None:
    return run.nvfp4_gemms > 0
  if run.quantization is not None:
    return run.quantization.startswith("te_nvfp4")
  return "nvfp4" in run.name.lower()


def _advice(level: VerdictLevel, nvfp4: bool) -> str:
  if level is VerdictLevel.DRIFTING:
    if nvfp4:
      return f"consider BF16 last layers (`{BF16_LAST_LAYERS_KEY}=N`, as NVIDIA's recipe does) and rerun"
    return "check this precision's recipe (scaling, which GEMMs are quantized) before relying on it"
  if level is VerdictLevel.OFF:
    if nvfp4:
      return (
          f"NVFP4 as configured hurts this model: try `{BF16_LAST_LAYERS_KEY}=N` or a lower learning rate, "
          "or stay on FP8/BF16"
      )
    return "do not use this precision for this model as configured"
  return ""


def _judge(rel: float, settings: ComparisonSettings) -> VerdictLevel:
  if rel > settings.drift_rel:
    return VerdictLevel.OFF
  if rel > settings.band_rel:
    return VerdictLevel.DRIFTING
  if rel < -settings.band_rel:
    return VerdictLevel.BETTER
  return VerdictLevel.OK


def judge_interval(rel: float, interval: tuple[float, float] | None, settings: ComparisonSettings) -> VerdictLevel:
  """The level of a relative gap `rel` (candidate - baseline, relative to the baseline), decided by its relative 95%
  interval where there is one. One rule for a run's eval-batch interval and for a seed group's interval across seeds.

  The question is non-inferiority: is the candidate worse than its baseline by more than the band? So
    - "ok" (no worse than the band) when the interval's upper end is at most +band, wherever its lower end lies;
    - "better" only when all of it lies below -band (lower than the baseline by more than the band);
    - the gap's own level (drifting, off) when all of it lies above +band;
    - "inconclusive" when it reaches both below and above +band.
  Without an interval the gap alone decides.
  """
  if interval is None:
    return _judge(rel, settings)
  lo, hi = interval
  if hi < -settings.band_rel:
    return VerdictLevel.BETTER
  if hi <= settings.band_rel:
    return VerdictLevel.OK
  if lo > settings.band_rel:
    return _judge(rel, settings)  # all of the interval above the band: the gap itself says how far
  return VerdictLevel.INCONCLUSIVE


def verdict(
    *,
    status: Status,
    first_bad_step: int | None,
    step0: Step0,
    gap: LossGap | None,
    eval_step: int | None,
    eval_gap: float | None,
    eval_base: float | None,
    candidate: RunSummary,
    settings: ComparisonSettings,
    eval_ci: tuple[float, float] | None = None,
    eval_ci_missing: str | None = None,
) -> Verdict:
  """Judges one candidate: divergence and step-0 disagreement first, then the relative loss gap.

  With the eval gap's 95% interval (`eval_ci`, nats; MaxText.compare.analysis.paired_eval_gap) the rule is
  `judge_interval`'s (no worse than the band, or by how much worse); without one, the gap alone decides and the text
  says why there is none.
  """
  nvfp4 = is_nvfp4(candidate)
  if status in (Status.CANDIDATE_DIVERGED, Status.BOTH_DIVERGED):
    hint = f"; try `{BF16_LAST_LAYERS_KEY}=N` or a lower learning rate" if nvfp4 else ""
    text = f"diverged at step {first_bad_step} (non-finite loss): not usable as configured{hint}"
    return Verdict(level=VerdictLevel.DIVERGED, basis="none", rel_gap=None, text=text)
  if status is Status.BASELINE_DIVERGED:
    text = f"no verdict: the baseline diverged at step {first_bad_step}; fix the baseline run first"
    return Verdict(level=VerdictLevel.DIVERGED, basis="none", rel_gap=None, text=text)
  if step0.within_tolerance is False:
    text = (
        f"not comparable: step-0 losses differ by {step0.abs_diff:.4f} nats (> {step0.tolerance}), so the runs did "
        "not start from the same weights or data; give the baseline a quant object (docs/comparing-runs.md)"
    )
    return Verdict(level=VerdictLevel.NOT_COMPARABLE, basis="none", rel_gap=None, text=text)
  interval = None
  if eval_gap is not None and eval_base:
    rel, basis = eval_gap / eval_base, "eval"
    what = f"eval loss {eval_gap:+.3f} nats ({100 * rel:+.2f}%) at step {eval_step}"
    if eval_ci is not None:
      interval = (eval_ci[0] / eval_base, eval_ci[1] / eval_base)
      what += f", 95% interval [{eval_ci[0]:+.3f}, {eval_ci[1]:+.3f}]"
    elif eval_ci_missing:
      what += f" (no interval: {eval_ci_missing})"
  elif gap is not None and gap.baseline_final_smoothed_loss:
    rel, basis = gap.final_smoothed_nats / gap.baseline_final_smoothed_loss, "train"
    what = f"smoothed final training loss {gap.final_smoothed_nats:+.3f} nats ({100 * rel:+.2f}%; no common eval)"
  else:
    return Verdict(level=VerdictLevel.NO_DATA, basis="none", rel_gap=None, text="no verdict: no gap to judge")
  level = judge_interval(rel, interval, settings)
  band, drift = f"{100 * settings.band_rel:g}%", f"{100 * settings.drift_rel:g}%"
  if level is VerdictLevel.INCONCLUSIVE:
    text = (
        f"inconclusive: {what}: the interval reaches both below and above +{band}, so it cannot say whether this is "
        "worse than the baseline by more than the band; more eval batches (eval_steps), more seeds or a longer run "
        "would resolve it"
    )
  elif level is VerdictLevel.OK:
    no_worse = "no worse than the baseline by more than " + band if interval is not None else f"within the {band} band"
    text = f"ok: {what}, {no_worse} (NVIDIA's NVFP4 paper reports within 1% of FP8)"
  elif level is VerdictLevel.BETTER:
    text = (
        f"suspect: {what}, lower than the baseline by more than {band}: not a precision gain to count on; "
        "check the step-0 column and evaluate on more tokens"
    )
  elif level is VerdictLevel.DRIFTING:
    text = f"drifting: {what}, above the {band} band (up to {drift}): {_advice(level, nvfp4)}"
  else:
    text = f"off: {what}, beyond {drift}: {_advice(level, nvfp4)}"
  return Verdict(level=level, basis=basis, rel_gap=rel, text=text)


def speedup_withheld(baseline: RunSummary, candidate: RunSummary, settings: ComparisonSettings) -> str | None:
  """Why the step-time ratio of this pair is not a speedup, or None when it is one.

  Not a speedup: NVFP4 emulated in either run (the time is the emulation's), either run on CPU (nothing about GPU
  speed), or other work keeping more than `settings.contention_cores` cores busy during either run (measured by the
  quickstart's machine.json).
  """
  reasons = []
  emulated = [r.name for r in (baseline, candidate) if r.emulated]
  if emulated:
    reasons.append(f"{' and '.join(emulated)} ran NVFP4 emulated: step time is emulation cost, not NVFP4 speed")
  if any(r.hardware == "cpu" for r in (baseline, candidate)):
    reasons.append("ran on CPU: says nothing about GPU speed")
  for r in (baseline, candidate):
    other = r.machine.other_cores if r.machine is not None else None
    if other is not None and other > settings.contention_cores:
      reasons.append(f"other work kept {r.machine.other_cores:.2f} cores busy during {r.name}")
  return "; ".join(reasons) or None
