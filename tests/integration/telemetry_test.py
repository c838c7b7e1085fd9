# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""nvfp4_stats_interval: per-GEMM statistics in maxtext's metrics, named per layer, GEMM and operand; the
config errors; and training unchanged by them (bit-identical losses)."""

from __future__ import annotations

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.integration import telemetry
from MaxText.nvfp4.operands import GEMM_OPERANDS
from MaxText.nvfp4.stats import STAT_NAMES, WGRAD_STAT_NAMES
from MaxText.precision.switches import Switches
from MaxText.precision.taps import STATISTICS
from tests.helpers import TINY_YML, load_config, read_losses, settings, train_cli


def _state(stacked: bool) -> dict:
  """A train state as maxtext's train_step returns it (nested dicts), with three GEMMs' statistics variables."""
  value = jnp.arange(3 * 5 * 4, dtype=jnp.float32).reshape(3, 5, 4)
  if stacked:
    layers = {"layers": {"mlp": {g: {"Nvfp4DotGeneral_0": {"nvfp4_stats": value}} for g in ("wi_0", "wo")}}}
  else:
    layers = {f"layers_{i}": {"mlp": {"wo": {"Nvfp4DotGeneral_0": {"nvfp4_stats": value[i]}}}} for i in range(3)}
  return {"model": {"decoder": layers}, "optimizer": {"step": jnp.int32(0)}}


def test_metric_names_per_layer_gemm_operand_and_statistic():
  plugin = settings(switches=Switches(num_layers=3), stats_interval=2)
  scanned = telemetry.stats_metrics(_state(True), plugin)
  assert len(scanned) == 3 * 2 * len(GEMM_OPERANDS) * len(STAT_NAMES)
  assert float(scanned["nvfp4/layer_02/mlp/wo/wgrad_dy/subnormal_scales"]) == 2 * 20 + 4 * 4 + 3
  unscanned = telemetry.stats_metrics(_state(False), plugin)
  assert {k for k in scanned if "/wo/" in k} == set(unscanned)
  assert float(unscanned["nvfp4/layer_01/mlp/wo/fprop_x/amax"]) == 20.0
  # A BF16 layer quantizes nothing: no statistics are reported for it.
  steered = telemetry.stats_metrics(_state(True), settings(switches=Switches(num_layers=3, layers=(1,)),
                                                           stats_interval=2))
  assert not [k for k in steered if k.startswith("nvfp4/layer_01/")] and len(steered) == 2 * len(scanned) // 3


def test_expert_stacks_report_the_mean_and_the_worst_expert():
  """A scanned RoutedMoE layer's statistics (layers, expert GEMMs, experts, operands, stats): per expert GEMM the
  mean over experts (amax: the max) and the worst expert's underflow and rel_error."""
  value = jnp.stack([jnp.full((2, 3, 5, 4), 0.1), jnp.full((2, 3, 5, 4), 0.3)], axis=2)  # expert 1 worse
  state = {"model": {"decoder": {"layers": {"MoeBlock_0": {"nvfp4_experts": {"nvfp4_stats": value}}}}}}
  metrics = telemetry.stats_metrics(state, settings(switches=Switches(num_layers=2), stats_interval=1))
  assert len(metrics) == 2 * 3 * len(GEMM_OPERANDS) * (len(STAT_NAMES) + 2)
  base = "nvfp4/layer_01/MoeBlock_0/experts/wo/wgrad_x"
  assert float(metrics[f"{base}/rel_error"]) == pytest.approx(0.2)
  assert float(metrics[f"{base}/rel_error_worst"]) == pytest.approx(0.3)
  assert float(metrics[f"{base}/amax"]) == pytest.approx(0.3)
  assert f"{base}/amax_worst" not in metrics


def test_expert_stacks_report_the_sum_of_their_experts_audit_counts():
  """The audit's counts of a RoutedMoE layer's expert GEMM: two experts with 1 and 2 mismatching codes report 3 (the
  sum over experts, not the worst expert's 2), and a count in one expert only is not averaged away."""
  counts = np.zeros((1, 3, 2, len(GEMM_OPERANDS), 3), np.float32)  # layers, expert GEMMs, experts, operands, columns
  counts[0, 2, 0, 0, 0], counts[0, 2, 1, 0, 0] = 1.0, 2.0  # wo, fprop_x codes
  counts[0, 0, 1, 3, 1] = 5.0  # wi_0, wgrad_x scales: expert 1 only
  state = {"model": {"decoder": {"layers": {"MoeBlock_0": {"nvfp4_experts": {"nvfp4_audit": jnp.asarray(counts)}}}}}}
  metrics = telemetry.stats_metrics(state, settings(switches=Switches(num_layers=1), audit_interval=1))
  assert float(metrics["nvfp4/audit/layer_00/MoeBlock_0/experts/wo/fprop_x/codes"]) == 3.0
  assert float(metrics["nvfp4/audit/layer_00/MoeBlock_0/experts/wi_0/wgrad_x/scales"]) == 5.0
  assert sum(float(v) for v in metrics.values()) == 8.0


def test_expert_stacks_report_the_largest_of_their_experts_calibration_amax():
  """The calibration's input amax of a RoutedMoE layer's expert GEMM: the largest over experts (one input scale the
  experts share), neither their mean nor their sum."""
  amax = np.zeros((1, 3, 2, len(GEMM_OPERANDS), 1), np.float32)  # layers, expert GEMMs, experts, operands, amax
  amax[0, 0, :, 0, 0] = (1.5, 4.0)  # wi_0, fprop_x
  state = {"model": {"decoder": {"layers": {"MoeBlock_0": {"nvfp4_experts": {"nvfp4_calibration": jnp.asarray(amax)}}}}}}
  metrics = telemetry.stats_metrics(state, settings(switches=Switches(num_layers=1), calibration_interval=1))
  assert float(metrics["nvfp4/calibration/layer_00/MoeBlock_0/experts/wi_0/fprop_x/amax"]) == 4.0
  assert len(metrics) == 3 * len(GEMM_OPERANDS)


def test_weight_gradient_rows_are_named_wgrad_beside_the_operands():
  """A tap's weight-gradient variable (nvfp4_stats_wgrad, one row): `.../<gemm>/wgrad/zero` and `zero_channels`,
  per layer under scan; an expert stack's the mean over its experts (no worst: not a `worst` column)."""
  dense = jnp.asarray([[[0.5, 0.25]], [[0.0, 0.0]], [[1.0, 0.5]]], jnp.float32)  # 3 layers x 1 row x 2
  experts = np.zeros((3, 3, 2, 1, 2), np.float32)  # layers, expert GEMMs, experts, row, columns
  experts[1, 2, :, 0, :] = ((0.25, 0.0), (1.0, 1.0))  # layer 1, wo: the second expert received no token
  state = {"model": {"decoder": {"layers": {
      "mlp": {"wo": {"MeasuredDotGeneral_0": {"nvfp4_stats_wgrad": dense}}},
      "MoeBlock_0": {"nvfp4_experts": {"nvfp4_stats_wgrad": jnp.asarray(experts)}}}}}}
  metrics = {k: float(v) for k, v in telemetry.stats_metrics(
      state, settings(switches=Switches(num_layers=3), stats_interval=1)).items()}
  assert len(metrics) == 3 * 2 + 3 * 3 * 2
  assert (metrics["nvfp4/layer_02/mlp/wo/wgrad/zero"], metrics["nvfp4/layer_02/mlp/wo/wgrad/zero_channels"]) == (1, 0.5)
  assert metrics["nvfp4/layer_00/mlp/wo/wgrad/zero"] == 0.5
  assert metrics["nvfp4/layer_01/MoeBlock_0/experts/wo/wgrad/zero"] == 0.625
  assert metrics["nvfp4/layer_01/MoeBlock_0/experts/wo/wgrad/zero_channels"] == 0.5
  assert STATISTICS.parse("nvfp4/layer_01/MoeBlock_0/experts/wo/wgrad/zero") == (1, "MoeBlock_0/experts/wo", "wgrad",
                                                                                  "zero")


def test_statistics_steps():
  """Every interval-th step, up to but not including nvfp4_bf16_from_step: from that step on every GEMM runs in BF16
  and quantizes nothing, the switch step itself included."""
  plugin = settings(switches=Switches(num_layers=3, from_step=6), stats_interval=3)
  assert [s for s in range(10) if STATISTICS.is_step(plugin, s)] == [0, 3]
  plugin = settings(switches=Switches(num_layers=3), stats_interval=3)
  assert [s for s in range(10) if STATISTICS.is_step(plugin, s)] == [0, 3, 6, 9]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["quantization=te_nvfp4", "nvfp4_stats_interval=-1"], "nvfp4_stats_interval=-1 is negative"),
        (["quantization=fp8", "nvfp4_stats_interval=2"],
         "nvfp4_stats_interval=2 with quantization='fp8': it measures NVFP4 GEMMs (the statistics)"),
        (["quantization=te_nvfp4", "nvfp4_mlp_precision=bf16", "nvfp4_audit_interval=2"],
         "nvfp4_audit_interval=2 with nvfp4_mlp_precision=bf16 and nvfp4_attention_precision=bf16: no GEMM is NVFP4"),
        (["quantization=te_nvfp4", "gradient_accumulation_steps=2", "nvfp4_stats_interval=2"],
         "nvfp4_stats_interval=2 with gradient_accumulation_steps=2"),
    ],
)
def test_bad_statistics_settings_fail_at_load(overrides, expected):
  with pytest.raises(Exception) as info:
    load_config(TINY_YML, "nvfp4_backend=emulated", *overrides)
  assert expected in str(info.value)


@pytest.mark.slow
def test_statistics_through_the_trainer_leave_the_losses_unchanged(tmp_path: pathlib.Path, jax_cache_dir) -> None:
  """3 layers, the MLP and attention projections in NVFP4, statistics and the audit every 2 steps, 5 steps, every
  GEMM in BF16 from step 4: steps 0 and 2 carry 3 layers x 7 GEMMs (the MLP's 3, the attention projections' 4) x 5
  operands x 4 statistics, and each GEMM's weight-gradient shares (wgrad/zero, wgrad/zero_channels), in range, and
  the audit's counts, all zero; steps 1 and 3 none, nor step 4 (the switch step: nothing is quantized); the losses
  equal those of the same run without either bit for bit. With nvfp4_mlp_precision=bf16 (the baseline; attention
  still NVFP4) the MLP GEMMs report their weight-gradient shares alone, and the losses equal that run's without
  statistics bit for bit.

  Grouped-query attention (4 query heads, 2 key/value heads, as Llama 3 8B's 32 and 8): the key and value GEMMs are
  half the query's width (N = 32), the one shape of the suite's models where they differ; both runs train it in
  NVFP4, at no cost beyond the runs this test makes anyway."""
  common = ["quantization=te_nvfp4", "nvfp4_backend=emulated", "steps=5", "base_num_decoder_layers=3",
            "enable_tensorboard=true", "nvfp4_bf16_from_step=4", "nvfp4_attention_precision=nvfp4",
            "base_num_query_heads=4", "base_num_kv_heads=2"]
  gemms = [*(f"mlp/{g}" for g in ("wi_0", "wi_1", "wo")),
           *(f"self_attention/{g}" for g in ("query", "key", "value", "out"))]
  losses, rows = {}, {}
  for name, extra in (("stats", ["nvfp4_stats_interval=2", "nvfp4_audit_interval=2"]), ("plain", []),
                      ("bf16_stats", ["nvfp4_mlp_precision=bf16", "nvfp4_stats_interval=2"]),
                      ("bf16_plain", ["nvfp4_mlp_precision=bf16"])):
    run = train_cli([f"run_name={name}", f"base_output_directory={tmp_path}",
                     f"metrics_file={tmp_path / name}.jsonl", *common, *extra], jax_cache_dir)
    assert run.returncode == 0, run.stderr[-4000:]
    losses[name] = read_losses(tmp_path / f"{name}.jsonl")
    rows[name] = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
  assert losses["stats"] == losses["plain"]
  assert losses["bf16_stats"] == losses["bf16_plain"] and losses["bf16_plain"] != losses["plain"]
  assert not [k for r in rows["plain"] + rows["bf16_plain"] for k in r if k.startswith("nvfp4/")]
  zeros = {f"nvfp4/layer_{i:02d}/{g}/wgrad/{s}" for i in range(3) for g in gemms for s in WGRAD_STAT_NAMES}
  for row in rows["bf16_stats"]:
    stats = {k: v for k, v in row.items() if k.startswith("nvfp4/")}
    if int(row["step"]) not in (0, 2):
      assert not stats, row["step"]
      continue
    attention = {k for k in stats if "/self_attention/" in k}
    assert set(stats) - attention == {k for k in zeros if "/mlp/" in k}, sorted(stats)
    assert attention >= {k for k in zeros if "/self_attention/" in k} and len(attention) == 3 * 4 * (5 * 4 + 2)
    assert all(0 <= stats[k] <= 1 for k in stats if "/wgrad/" in k), stats
  for row in rows["stats"]:
    stats = {k: v for k, v in row.items() if k.startswith("nvfp4/") and not k.startswith("nvfp4/audit/")}
    audited = {k: v for k, v in row.items() if k.startswith("nvfp4/audit/")}
    if int(row["step"]) not in (0, 2):
      assert not stats and not audited, row["step"]
      continue
    # The emulated backend's audit holds its quantizer against itself: every operand of every GEMM, all zero.
    assert set(audited) == {f"nvfp4/audit/layer_{i:02d}/{g}/{o}/{c}" for i in range(3)
                            for g in gemms for o in GEMM_OPERANDS for c in ("codes", "scales", "amax")}
    assert not any(audited.values()), audited
    names = {f"nvfp4/layer_{i:02d}/{g}/{o}/{s}" for i in range(3) for g in gemms for o in GEMM_OPERANDS
             for s in STAT_NAMES}
    assert set(stats) == names | zeros
    for key, value in stats.items():
      stat = key.rsplit("/", 1)[1]
      assert np.isfinite(value), key
      assert (value > 0) if stat in ("amax", "rel_error") else (0 <= value <= 1), (key, value)
      if stat == "rel_error":
        assert value < 0.5, (key, value)
