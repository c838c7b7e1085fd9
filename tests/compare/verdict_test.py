# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Eval-loss gaps, verdicts, the speed columns (emulation, CPU, machine load), run info and the loss figure."""

import json
import math

import numpy as np
import pytest

from MaxText.compare import runinfo
from MaxText.compare.metrics import load_run
from MaxText.compare.plots import loss_figure
from MaxText.compare.report import build_report, loss_table, markdown_report, speed_table
from MaxText.compare.schema import ComparisonSettings, VerdictLevel
from MaxText.compare.verdict import BF16_LAST_LAYERS_KEY
from MaxText.integration import artifacts

N = 40
EVAL_STEPS = (0, 20, 39)
BASE_EVAL = 5.0


def _write_run(
    root, name, loss_offset=0.0, eval_gap=0.0, step_time=1.0, plan=None, machine=None, evals=True, spike=0.0
):
  """A run dir like the quickstart's: metrics.jsonl with train and eval records, optional plan and machine.json.

  `spike` is added to the training loss of step 25 only.
  """
  d = root / name
  d.mkdir(parents=True)
  lines = []
  for s in range(N):
    loss = 8.0 - 0.05 * s + (0.0 if s == 0 else loss_offset) + (spike if s == 25 else 0.0)  # same step-0 loss
    lines.append({"learning/loss": loss, "perf/step_time_seconds": step_time, "perf/per_device_tflops_per_sec": 1.0,
                  "perf/per_device_tokens_per_sec": 512.0 / step_time, "step": s, "run_name": name})  # fmt: skip
    if evals and s in EVAL_STEPS:
      gap = eval_gap * s / EVAL_STEPS[-1]
      lines.append({"eval/avg_loss": BASE_EVAL + gap, "eval/total_loss": 1.0, "step": s, "run_name": name})
  (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
  if plan is not None:
    backend, nvfp4, *share = plan
    gemms = [artifacts.GemmEntry(module=f"decoder/layers/mlp/w{i}", kernel_axes=("embed", "mlp"),
                                 precision="nvfp4" if i < nvfp4 else "bf16", backend=backend, implementation="")
             for i in range(3)]
    flops = artifacts.Flops(tflops_per_device_step=1.0, mlp_tflops_per_device_step=share[0],
                            mlp_flop_share=share[0]) if share else None
    written = artifacts.Plan(backend=backend, recipe=artifacts.RecipeRecord(rht=True, stochastic_rounding=True,
                                                                            weight_2d=True),
                             switches=artifacts.SwitchesRecord(bf16_first_layers=0, bf16_last_layers=0, bf16_layers=[],
                                                               bf16_from_step=None, bf16_forward_from_step=None),
                             decoder_layers_mlp=["nvfp4"], gemms=gemms, flops=flops)
    (d / artifacts.PLAN_FILE).write_text(written.model_dump_json(), encoding="utf-8")
  if machine is not None:
    (d / "machine.json").write_text(json.dumps(machine), encoding="utf-8")
  return load_run(d)


def _machine(other_cores):
  return {"cpu_count": 2, "loadavg_before": [0.5, 0.4, 0.3], "loadavg_after": [2.5, 1.0, 0.5], "wall_s": 60.0,
          "run_cpu_s": 100.0, "other_cores": other_cores}  # fmt: skip


@pytest.mark.parametrize(
    "name, eval_gap, level, advice",
    [
        ("te_nvfp4", 0.04, VerdictLevel.OK, "within the 1% band"),  # +0.8%, no interval: the gap alone
        ("te_nvfp4", 0.10, VerdictLevel.DRIFTING, BF16_LAST_LAYERS_KEY),  # +2%
        ("te_nvfp4", 0.25, VerdictLevel.OFF, BF16_LAST_LAYERS_KEY),  # +5%
        ("fp8", 0.10, VerdictLevel.DRIFTING, "check this precision's recipe"),
        ("te_nvfp4", -0.10, VerdictLevel.BETTER, "not a precision gain"),
    ],
)
def test_verdict_follows_the_eval_gap_and_its_thresholds(tmp_path, name, eval_gap, level, advice):
  base = _write_run(tmp_path, "bf16")
  cand = _write_run(tmp_path, name, loss_offset=-0.5, eval_gap=eval_gap)  # training gap says the opposite
  (c,) = build_report([base, cand], "bf16", ComparisonSettings()).comparisons
  assert c.final_eval_step == 39 and c.final_eval_gap_nats == pytest.approx(eval_gap)
  assert c.final_eval_baseline_loss == pytest.approx(BASE_EVAL)
  assert c.final_eval_gap_rel == pytest.approx(eval_gap / BASE_EVAL)
  assert c.verdict.level is level and c.verdict.basis == "eval"
  assert advice in c.verdict.text and "at step 39" in c.verdict.text
  if name == "fp8":
    assert BF16_LAST_LAYERS_KEY not in c.verdict.text  # the NVFP4 knob is no advice for an fp8 run


def test_verdict_thresholds_come_from_the_settings(tmp_path):
  runs = [_write_run(tmp_path, "bf16"), _write_run(tmp_path, "te_nvfp4", eval_gap=0.10)]  # +2%
  (c,) = build_report(runs, "bf16", ComparisonSettings(band_rel=0.025)).comparisons
  assert c.verdict.level is VerdictLevel.OK and "2.5% band" in c.verdict.text


def test_verdict_falls_back_to_the_training_gap_without_evals(tmp_path):
  runs = [_write_run(tmp_path, "bf16", evals=False), _write_run(tmp_path, "te_nvfp4", 0.2, evals=False)]
  (c,) = build_report(runs, "bf16", ComparisonSettings(smooth=5)).comparisons
  base_tail = np.mean([8.0 - 0.05 * s for s in range(N - 5, N)])
  assert c.final_eval_step is None and c.verdict.basis == "train"
  assert c.verdict.rel_gap == pytest.approx(0.2 / base_tail)
  assert c.verdict.level is VerdictLevel.OFF and "no common eval" in c.verdict.text  # 0.2 / 6.15 = 3.3%


def test_verdict_for_divergence_and_different_initial_weights(tmp_path, jsonl_writer):
  write_lines, record = jsonl_writer
  base = _write_run(tmp_path, "bf16")
  losses = [8.0 - 0.05 * s for s in range(N)]
  broken = [record(s, (math.nan if s >= 30 else loss), run_name="nvfp4") for s, loss in enumerate(losses)]
  shifted = [record(s, loss + 1.0, run_name="other") for s, loss in enumerate(losses)]
  runs = [base, load_run(write_lines(tmp_path / "nvfp4.jsonl", broken)),
          load_run(write_lines(tmp_path / "other.jsonl", shifted))]  # fmt: skip
  by = {c.candidate: c for c in build_report(runs, "bf16", ComparisonSettings()).comparisons}
  assert by["nvfp4"].verdict.level is VerdictLevel.DIVERGED and "step 30" in by["nvfp4"].verdict.text
  assert by["other"].verdict.level is VerdictLevel.NOT_COMPARABLE and "step-0" in by["other"].verdict.text


def test_emulated_nvfp4_claims_no_speedup(tmp_path):
  base = _write_run(tmp_path, "bf16", plan=("emulated", 0), step_time=2.0)  # quant object, no NVFP4 GEMM
  cand = _write_run(tmp_path, "te_nvfp4", plan=("emulated", 3), step_time=1.0)
  report = build_report([base, cand], "bf16", ComparisonSettings())
  (c,) = report.comparisons
  assert {r.name: r.emulated for r in report.runs} == {"bf16": False, "te_nvfp4": True}
  assert c.step_time_ratio == pytest.approx(2.0) and c.speedup is None
  assert "emulation cost" in c.speedup_withheld
  table = speed_table(report)
  assert "step time (s), emulation cost" in table and "| 3 (emulated) |" in table and "| withheld |" in table
  assert "No speedup is claimed" in markdown_report(report)


def test_a_bf16_baseline_built_as_te_nvfp4_is_called_bf16(tmp_path):
  """The quickstart's baseline is te_nvfp4 with nvfp4_mlp_precision=bf16 (the same initial weights): its plan runs no
  GEMM in NVFP4, and the speed table says so instead of printing te_nvfp4."""
  base = _write_run(tmp_path, "bf16", plan=("emulated", 0))
  cand = _write_run(tmp_path, "te_nvfp4", plan=("emulated", 3))
  report = build_report([base, cand], "bf16", ComparisonSettings())
  runs = [r.model_copy(update={"quantization": "te_nvfp4"}) for r in report.runs]
  table = speed_table(report.model_copy(update={"runs": runs}))
  assert "| bf16 | bf16 (te_nvfp4 with no GEMM in NVFP4) | 0 |" in table
  assert "| te_nvfp4 | te_nvfp4 | 3 (emulated) |" in table


@pytest.mark.parametrize(
    "shares, reported, says",
    [
        ((0.63, 0.63), 0.63, "carry 0.63 of this model's training FLOPs"),
        ((None, 0.08), 0.08, "gaps measured on this model say little about NVFP4"),  # fp8 runs write no plan
        ((None, None), None, "not recorded"),
    ],
)
def test_mlp_flop_share_from_the_plans(tmp_path, shares, reported, says):
  """The MLP GEMMs' share of the FLOPs (the plan's, written by the integration) is in report.json and report.md:
  the baseline's where it has one, else the first candidate's; below 0.5 the report says the gaps mean little."""
  runs = [_write_run(tmp_path, name, plan=None if share is None else ("emulated", nvfp4, share))
          for name, nvfp4, share in zip(("bf16", "te_nvfp4"), (0, 3), shares)]
  report = build_report(runs, "bf16", ComparisonSettings())
  assert report.mlp_flop_share == reported
  assert [r.mlp_flop_share for r in report.runs] == list(shares)
  assert says in markdown_report(report)
  assert ("say little" in markdown_report(report)) == (reported is not None and reported < 0.5)


def test_te_backend_on_a_quiet_machine_claims_the_speedup(tmp_path):
  base = _write_run(tmp_path, "fp8", step_time=2.0, machine=_machine(0.05))
  cand = _write_run(tmp_path, "te_nvfp4", plan=("te", 3), step_time=1.0, machine=_machine(0.05))
  report = build_report([base, cand], "fp8", ComparisonSettings())
  (c,) = report.comparisons
  assert c.speedup == pytest.approx(2.0) and c.speedup_withheld is None
  assert "emulation cost" not in speed_table(report) and "| 2.00 | 0.05 |" in speed_table(report)


def test_busy_machine_withholds_the_speedup_and_says_so(tmp_path):
  base = _write_run(tmp_path, "fp8", step_time=2.0, machine=_machine(0.05))
  cand = _write_run(tmp_path, "te_nvfp4", plan=("te", 3), step_time=1.0, machine=_machine(0.9))
  report = build_report([base, cand], "fp8", ComparisonSettings())
  (c,) = report.comparisons
  assert c.speedup is None and "0.90 cores busy during te_nvfp4" in c.speedup_withheld
  assert report.runs[1].machine.loadavg_after == [2.5, 1.0, 0.5]
  md = markdown_report(report)
  assert "up to 0.90 cores busy (during te_nvfp4; threshold 0.25): step times are unreliable" in md
  assert "te_nvfp4 0.5->2.5" in md


def test_cpu_hardware_from_tensorboard_config_withholds_the_speedup(tmp_path):
  from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel

  runs = []
  for name, quant, t in (("bf16", "QuantizationType.NONE", 2.0), ("fp8", "QuantizationType.FP8", 1.0)):
    writer = SummaryWriter(str(tmp_path / name / "tensorboard"))
    writer.add_text("hardware", "cpu", 0)  # maxtext's add_config_to_summary_writer, one text per key
    writer.add_text("quantization", quant, 0)
    for s in range(5):
      writer.add_scalar("learning/loss", 5.0 - 0.1 * s, s)
      writer.add_scalar("perf/step_time_seconds", t, s)
    writer.close()
    runs.append(load_run(tmp_path / name))
  report = build_report(runs, "bf16", ComparisonSettings())
  assert [(r.quantization, r.hardware) for r in report.runs] == [("", "cpu"), ("fp8", "cpu")]
  (c,) = report.comparisons
  assert c.step_time_ratio == pytest.approx(2.0) and c.speedup is None and "ran on CPU" in c.speedup_withheld


def test_loss_table_puts_the_eval_gap_beside_the_training_gaps(tmp_path):
  runs = [_write_run(tmp_path, "bf16"), _write_run(tmp_path, "te_nvfp4", loss_offset=-0.002, eval_gap=0.1)]
  table = loss_table(build_report(runs, "bf16", ComparisonSettings(smooth=5)))
  row = next(line for line in table.splitlines() if line.startswith("| te_nvfp4 "))
  assert row.startswith("| te_nvfp4 | ok | 40 | +0.1000 | — | +2.00 | 39 | -0.0020 | -0.0020 |")  # no per-batch evals
  assert row.endswith("| **drifting** |")
  assert "eval loss 5.000" in next(line for line in table.splitlines() if line.startswith("| bf16 "))


def test_loss_figure_draws_smoothed_raw_and_eval_gaps(tmp_path):
  base = _write_run(tmp_path, "bf16")
  cand = _write_run(tmp_path, "te_nvfp4", loss_offset=0.03, eval_gap=0.1, spike=0.4)
  report = build_report([base, cand], "bf16", ComparisonSettings(smooth=7))
  assert report.comparisons[0].loss_gap.max_nats == pytest.approx(0.43)
  fig = loss_figure([base, cand], report)
  ax_gap, ax_raw, ax_loss = fig.axes
  assert "trailing mean over 7 steps" in ax_gap.get_title() and "no smoothing" in ax_raw.get_title()
  eval_line = next(curve for curve in ax_gap.get_lines() if curve.get_label() == "te_nvfp4 eval")
  np.testing.assert_allclose(eval_line.get_xdata(), EVAL_STEPS)
  np.testing.assert_allclose(eval_line.get_ydata(), [0.1 * s / 39 for s in EVAL_STEPS])
  raw = next(curve for curve in ax_raw.get_lines() if curve.get_label() == "te_nvfp4")
  assert np.max(raw.get_ydata()) == pytest.approx(report.comparisons[0].loss_gap.max_nats)
  labels = [curve.get_label() for curve in ax_loss.get_lines()]
  assert {"bf16: training", "bf16: eval", "te_nvfp4: training", "te_nvfp4: eval"} <= set(labels)
  styles = {curve.get_label(): curve.get_linestyle() for curve in ax_loss.get_lines()}
  assert styles["bf16: training"] != styles["te_nvfp4: training"]  # overlapping curves stay distinguishable


def test_machine_record_separates_this_run_from_other_work():
  before = runinfo.MachineSample((1.0, 1.0, 1.0), busy_cpu_s=1000.0, children_cpu_s=50.0)
  after = runinfo.MachineSample((2.0, 1.5, 1.1), busy_cpu_s=1300.0, children_cpu_s=250.0)
  record = runinfo.machine_record(before, after, wall_s=100.0)
  assert record["run_cpu_s"] == pytest.approx(200.0)
  assert record["other_cores"] == pytest.approx(1.0)  # (300 busy - 200 ours) / 100 s
  assert record["loadavg_before"] == [1.0, 1.0, 1.0] and record["loadavg_after"] == [2.0, 1.5, 1.1]
  sample = runinfo.machine_sample()
  assert len(sample.loadavg) == 3 and sample.children_cpu_s >= 0
