# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The versioned schema of report.json, as pydantic models: the single source of its field names and meanings.

Why pydantic: the same models validate a report when it is read back (tests, downstream tools) and print a JSON
Schema (`python -m MaxText.compare --print-schema`). Bump `SCHEMA_VERSION` on any change that is not a pure
addition of an optional field. Missing or non-finite numbers are written as null, never as NaN (which JSON lacks).
"""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = "1.1"  # 1.1: run backend/machine load, eval gaps, verdicts, speedup withheld when emulated


class _Model(BaseModel):
  model_config = ConfigDict(extra="forbid", frozen=True)


class MetricsSource(str, enum.Enum):
  """Where a run's numbers came from."""

  JSONL = "jsonl"
  TENSORBOARD = "tensorboard"


class WindowRule(str, enum.Enum):
  """How the gap window's first step was chosen."""

  EXPLICIT = "explicit"  # --window-start
  LR_PEAK = "lr_peak"  # end of warm-up: first step at the baseline's peak learning rate
  FRACTION = "fraction"  # 10% of the way into the common steps (no usable learning-rate column)


class Status(str, enum.Enum):
  """Outcome of one candidate-vs-baseline comparison."""

  OK = "ok"
  CANDIDATE_DIVERGED = "candidate_diverged"
  BASELINE_DIVERGED = "baseline_diverged"
  BOTH_DIVERGED = "both_diverged"
  NO_COMMON_STEPS = "no_common_steps"


class VerdictLevel(str, enum.Enum):
  """The one-word verdict on a candidate (thresholds in ComparisonSettings)."""

  OK = "ok"  # |relative gap| <= band_rel (with an interval: its upper end <= +band_rel, no worse than the band)
  DRIFTING = "drifting"  # band_rel < relative gap <= drift_rel
  OFF = "off"  # relative gap > drift_rel
  BETTER = "better"  # relative gap (with an interval: all of it) < -band_rel: lower loss by more than the band (suspect)
  INCONCLUSIVE = "inconclusive"  # the 95% interval reaches both below and above +band_rel
  DIVERGED = "diverged"  # a non-finite loss in the candidate or the baseline
  NOT_COMPARABLE = "not_comparable"  # step-0 losses differ: different initial weights or data
  NO_DATA = "no_data"  # no aligned steps, or no loss to judge


class ComparisonSettings(_Model):
  """The knobs of a comparison, as used (defaults filled in)."""

  window_start: int | None = Field(
      None, ge=0, description="first step of the gap window; null: chosen per comparison (the end of warm-up)")
  smooth: int = Field(20, ge=1, description="steps in the trailing means (smoothed final loss and final gap)")
  step0_tolerance: float = Field(0.05, ge=0, description="nats; step-0 losses closer than this agree")
  perf_start_step: int = Field(1, ge=0, description="throughput medians use steps >= this (step 0 compiles)")
  band_rel: float = Field(
      0.01, ge=0, description="verdict ok: gap / baseline loss (with an interval: its upper end) <= this, no worse "
      "than the baseline by more than this (NVIDIA's NVFP4 paper: < 1% vs FP8)"
  )
  drift_rel: float = Field(0.03, ge=0, description="verdict drifting up to this relative gap, off above it")
  contention_cores: float = Field(
      0.25, ge=0, description="other work busier than this many cores during a run makes its step times unreliable"
  )

  @model_validator(mode="after")
  def _bands_in_order(self) -> "ComparisonSettings":
    if self.drift_rel < self.band_rel:
      raise ValueError(f"drift_rel={self.drift_rel} must be >= band_rel={self.band_rel} (the ok band sits inside)")
    return self


class MachineLoad(_Model):
  """machine.json, written by the quickstart around each training process (absent for other runs)."""

  cpu_count: int | None
  loadavg_before: list[float] = Field(description="os.getloadavg() just before the run: 1, 5, 15 minutes")
  loadavg_after: list[float]
  wall_s: float
  run_cpu_s: float = Field(description="CPU seconds of the training process (user + system)")
  other_cores: float | None = Field(description="cores kept busy by other work on average while the run trained")


class RunSummary(_Model):
  """One run on its own."""

  name: str
  source: MetricsSource
  path: str = Field(description="the metrics file or TensorBoard dir read")
  num_steps: int = Field(description="training steps logged")
  first_step: int
  last_step: int
  diverged: bool = Field(description="a logged loss is NaN or infinite")
  first_nonfinite_step: int | None
  final_loss_smoothed: float | None = Field(description="trailing mean of the last `smooth` finite losses, nats")
  perf_steps: int = Field(description="steps behind the throughput medians")
  median_step_time_s: float | None
  median_tflops_per_sec_per_device: float | None = Field(description="maxtext's model-FLOP count")
  median_tokens_per_sec_per_device: float | None
  skipped_lines: int = Field(0, description="unparsable metrics lines that were skipped")
  quantization: str | None = Field(None, description="maxtext's `quantization` (from the TensorBoard config text)")
  hardware: str | None = Field(None, description="maxtext's `hardware` (from the TensorBoard config text)")
  backend: str | None = Field(None, description="resolved NVFP4 backend from precision_plan.json: emulated | te")
  nvfp4_gemms: int | None = Field(None, description="GEMM modules in NVFP4 per precision_plan.json")
  mlp_flop_share: float | None = Field(
      None, description="the MLP GEMMs' share of the training FLOPs by maxtext's count, per precision_plan.json")
  emulated: bool = Field(False, description="NVFP4 GEMMs ran on the emulated backend: step time = emulation cost")
  step_time_p90_over_p50: float | None = Field(None, description="spread of the step times (1.0: perfectly steady)")
  machine: MachineLoad | None = None


class LossGap(_Model):
  """Candidate loss - baseline loss (nats) over the window's aligned steps with finite losses in both runs."""

  window_start_step: int
  window_end_step: int
  window_rule: WindowRule
  num_steps: int
  mean_nats: float = Field(description="mean gap; positive: the candidate trails the baseline")
  max_nats: float = Field(description="largest signed gap")
  max_step: int = Field(description="step of max_nats")
  max_abs_nats: float
  final_smoothed_nats: float = Field(description="trailing mean of the last smooth_steps window steps, cand - base")
  smooth_steps: int
  baseline_final_smoothed_loss: float | None = Field(None, description="the baseline's side of final_smoothed_nats")


class Step0(_Model):
  """Loss at step 0: the same initial weights and first batch give nearly the same loss."""

  baseline_loss: float | None
  candidate_loss: float | None
  abs_diff: float | None
  tolerance: float
  within_tolerance: bool | None = Field(description="null when a run lacks step 0")


class Verdict(_Model):
  """One line a user can act on, and what it was computed from."""

  level: VerdictLevel
  basis: Literal["eval", "train", "none"] = Field(
      description="eval: the gap at the last common eval; train: the smoothed final training gap"
  )
  rel_gap: float | None = Field(description="the gap / the baseline loss at the same point")
  text: str


class Comparison(_Model):
  """One candidate against the baseline, on the steps both logged."""

  candidate: str
  baseline: str
  status: Status
  common_steps: int
  baseline_only_steps: int
  candidate_only_steps: int
  first_bad_step: int | None = Field(description="first step with a non-finite loss in either run")
  loss_gap: LossGap | None = Field(description="null when no aligned finite step falls in the window")
  step0: Step0
  step_time_ratio: float | None = Field(description="baseline median step time / candidate median step time")
  speedup: float | None = Field(
      description="step_time_ratio where it measures the precision's speed; null when speedup_withheld says why"
  )
  speedup_withheld: str | None = Field(description="why no speedup is claimed (emulated NVFP4, busy machine)")
  final_eval_step: int | None = Field(description="last train step after which both logged a full eval pass")
  final_eval_gap_nats: float | None
  final_eval_baseline_loss: float | None = None
  final_eval_gap_rel: float | None = Field(None, description="final_eval_gap_nats / final_eval_baseline_loss")
  eval_gap_ci95: list[float] | None = Field(
      None, description="95% interval [lo, hi] of final_eval_gap_nats from the paired per-batch eval losses (nats)")
  eval_gap_batches: int | None = Field(None, description="eval batches the interval pairs")
  eval_gap_ci_missing: str | None = Field(None, description="why eval_gap_ci95 is null")
  verdict: Verdict


class QuantStatsRow(_Model):
  """One decoder layer / GEMM / operand cell of a run's NVFP4 quantization statistics."""

  layer: int = Field(description="decoder layer (0-based)")
  gemm: str = Field(description="the GEMM's module path inside the layer, e.g. mlp/wo")
  operand: str = Field(description="fprop_x, fprop_w, dgrad_dy, wgrad_x or wgrad_dy")
  rel_error: float | None = Field(description="||dequantize(quantize(x)) - x|| / ||x||")
  underflow: float | None = Field(description="fraction of the nonzero elements that quantize to 0")


class QuantStatsSummary(_Model):
  """Where NVFP4 loses most in one run that logged statistics (nvfp4_stats_interval > 0)."""

  run: str
  step: int = Field(description="the last statistics step, which the rows describe")
  statistics: int = Field(description="how many nvfp4/ statistics that step logged")
  heatmap: str = Field(description="the PNG beside report.md")
  worst: list[QuantStatsRow] = Field(description="the cells with the largest rel_error, largest first")
  worst_layer: int | None = Field(description="the layer whose mean rel_error over its GEMM operands is largest")
  worst_layer_mean_rel_error: float | None
  median_layer_mean_rel_error: float | None = Field(description="the median of that mean over the layers")
  others_median: float | None = Field(
      None, description="the median of the other layers' mean rel_error; null with no other layer")
  others_spread: float | None = Field(
      None, description="max - min of the other layers' mean rel_error; null with fewer than two other layers")
  stands_out: bool | None = Field(
      None, description="the worst layer exceeds the other layers' median by more than their spread and by more than "
      "a margin of that median (MaxText.compare.quantstats.STANDS_OUT_MARGIN, 10%)")
  try_key: str | None = Field(description="the override that runs the worst layer's MLP GEMMs in BF16, when it "
                              "stands out; null otherwise")


class SeedGroup(_Model):
  """Runs of one precision over several seeds (named NAME@SEED), each paired with the baseline's run of its seed."""

  group: str
  runs: list[str]
  paired_with: list[str] = Field(description="the baseline run each paired run was compared with, in order")
  eval_gaps_nats: list[float] = Field(description="final eval gap of each paired run to its baseline run")
  mean_eval_gap_nats: float | None
  sd_nats: float | None = Field(description="sample standard deviation of the gaps across seeds; null for one run")
  ci95: list[float] | None = Field(description="95% t-interval of the mean gap across seeds; null for one run")
  baseline_noise_sd_nats: float | None = Field(
      description="the baseline group's own seed-to-seed standard deviation of final eval losses (noise floor)")
  baseline_runs: int
  unpaired: list[str] = Field(description="runs without an eval in common with their baseline run, and why")
  verdict: VerdictLevel | None = Field(
      None, description="ok | drifting | off | better | inconclusive: the mean gap relative to the baseline runs' mean "
      "eval loss, judged by its interval across seeds as a run's verdict is by its eval-batch interval; null "
      "without a spread (one paired run)")
  differs_from_baseline: bool | None = Field(
      None, description="the interval across seeds excludes 0: this precision's eval loss differs from the "
      "baseline's beyond seed-to-seed variation; null without a spread")
  note: str | None = None


class Report(_Model):
  """report.json."""

  schema_version: Literal["1.1"] = SCHEMA_VERSION
  baseline: str
  settings: ComparisonSettings
  runs: list[RunSummary]
  mlp_flop_share: float | None = Field(
      None, description="the share of the model's training FLOPs in the MLP GEMMs, the only GEMMs NVFP4 runs (maxtext's "
      "FLOP count): a comparison says little about NVFP4 where it is small. The baseline's, else the first run's "
      "that records it; None when no run has a precision plan (runs without an NVFP4 mode write none)")
  comparisons: list[Comparison]
  quant_stats: list[QuantStatsSummary] = Field(
      [], description="runs that logged NVFP4 quantization statistics: where NVFP4 loses most")
  seed_groups: list[SeedGroup] = Field([], description="precisions run over several seeds (runs named NAME@SEED)")
