# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""te_nvfp4 / te_nvfp4_no_rht end to end through maxtext's trainer on CPU (emulated backend).

One module-scoped set of tiny runs (subprocesses, ~3 minutes in all) serves every assertion:
  fp8       quantization=fp8 (maxtext's own), the reference run
  nvfp4     te_nvfp4, attention bf16, scan_layers=true, checkpoints every 10 steps; resumed from step 10 by a test
  no_rht    te_nvfp4_no_rht, attention fp8, scan_layers=false
  remat     te_nvfp4, scan_layers=false, remat_policy=minimal_with_context_and_quantization
  attention te_nvfp4 with the attention projections in NVFP4 too (nvfp4_attention_precision=nvfp4), otherwise the
            nvfp4 run
  fused     the attention run on the fused backend (nvfp4_backend=fused)
"""

import json
import math
import pathlib

import pytest

from tests.helpers import TINY_SCHEDULE, read_losses, resumed_losses, train_cli

STEPS = 20
RESUME_FROM = 10
#: Every run's length and schedule; the resume repeats them.
_LENGTH = [f"steps={STEPS}", TINY_SCHEDULE]
#: Final-loss bound against the fp8 run (nats). Measured on this tiny model at 25 steps: te_nvfp4 +0.15.
FINAL_GAP_BOUND = 0.35

_RUNS = {
    "fp8": ["quantization=fp8"],
    # Checkpoints every RESUME_FROM steps (synchronously): test_resume_is_bit_identical resumes this run.
    "nvfp4": ["quantization=te_nvfp4", "nvfp4_backend=emulated", "enable_checkpointing=true",
              f"checkpoint_period={RESUME_FROM}", "async_checkpointing=false"],
    "no_rht": ["quantization=te_nvfp4_no_rht", "nvfp4_attention_precision=fp8", "scan_layers=false"],
    "remat": ["quantization=te_nvfp4", "scan_layers=false", "remat_policy=minimal_with_context_and_quantization"],
    # Every dense GEMM in NVFP4, attention projections included (the opt-in).
    "attention": ["quantization=te_nvfp4", "nvfp4_backend=emulated", "nvfp4_attention_precision=nvfp4"],
    # The fused backend: the attention run's settings, codes and scales multiplied by jax.nn.scaled_matmul (a
    # dequantize + f32 dot on CPU).
    "fused": ["quantization=te_nvfp4", "nvfp4_backend=fused", "nvfp4_attention_precision=nvfp4"],
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory, jax_cache_dir) -> dict[str, pathlib.Path]:
  """Trains every configuration once; returns run name -> output dir (metrics in <dir>/metrics.jsonl)."""
  root = tmp_path_factory.mktemp("nvfp4_runs")
  out = {}
  for name, overrides in _RUNS.items():
    run_dir = root / name
    run_dir.mkdir()
    result = train_cli([f"run_name={name}", f"base_output_directory={root}", *_LENGTH,
                        f"metrics_file={run_dir / 'metrics.jsonl'}", *overrides], jax_cache_dir)
    assert result.returncode == 0, f"{name}: {result.stderr[-4000:]}"
    (run_dir / "stdout.txt").write_text(result.stdout + result.stderr)
    out[name] = run_dir
  return out


def _plan(run_dir: pathlib.Path) -> dict[str, str]:
  plan = json.loads((run_dir / "precision_plan.json").read_text())
  return {g["module"].split("/")[-1]: g["precision"] for g in plan["gemms"]}


@pytest.mark.parametrize("name", ["nvfp4", "no_rht", "remat", "attention"])
def test_loss_falls_and_tracks_fp8(runs, name):
  losses = read_losses(runs[name] / "metrics.jsonl")
  fp8 = read_losses(runs["fp8"] / "metrics.jsonl")
  assert len(fp8) == STEPS and all(math.isfinite(x) for x in fp8), fp8  # maxtext's fp8 through our CLI
  assert len(losses) == STEPS and all(math.isfinite(x) for x in losses), losses
  assert losses[-1] < 0.7 * losses[0], losses
  assert abs(losses[-1] - fp8[-1]) < FINAL_GAP_BOUND, (losses[-1], fp8[-1])


def test_the_fused_backend_trains_the_emulated_backends_losses(runs):
  """The bound between the backends on CPU: 0. Both quantize with the same code, and XLA:CPU's dequantize + dot
  behind jax.nn.scaled_matmul accumulates the same exact f32 products in the same order as the emulated dot
  (measured: every loss of 20 steps equal). On a GPU the GEMMs' accumulation order may differ."""
  assert read_losses(runs["fused"] / "metrics.jsonl") == read_losses(runs["attention"] / "metrics.jsonl")
  plan = json.loads((runs["fused"] / "precision_plan.json").read_text())
  implementations = {g["implementation"] for g in plan["gemms"] if g["precision"] == "nvfp4"}
  assert plan["backend"] == "fused" and implementations == {
      "MaxText.nvfp4 quantizer + jax.nn.scaled_matmul (fused) [Nvfp4DotGeneral]"}, implementations


def test_same_initial_weights_as_fp8(runs):
  """fp8 and te_nvfp4 both hold a quant object per DenseGeneral, so init is identical: step-0 losses agree."""
  assert abs(read_losses(runs["nvfp4"] / "metrics.jsonl")[0] - read_losses(runs["fp8"] / "metrics.jsonl")[0]) < 0.02


def test_attention_projections_in_nvfp4_train_otherwise(runs):
  """nvfp4_attention_precision=nvfp4: the plan's attention projections are NVFP4 (the table says the BF16 layers
  steer them too), and the losses are not the bf16-attention run's."""
  assert set(_plan(runs["attention"]).values()) == {"nvfp4"}, _plan(runs["attention"])
  assert "MLP and attention GEMMs per decoder layer: 0-1: nvfp4" in (runs["attention"] / "stdout.txt").read_text()
  attention, mlp_only = (read_losses(runs[n] / "metrics.jsonl") for n in ("attention", "nvfp4"))
  assert attention[0] != mlp_only[0] and attention[-1] != mlp_only[-1], (attention, mlp_only)


@pytest.mark.parametrize("name,attention", [("nvfp4", "bf16"), ("no_rht", "fp8"), ("remat", "bf16")])
def test_precision_plan_file_and_table(runs, name, attention):
  plan = _plan(runs[name])
  assert {plan[m] for m in ("wi_0", "wi_1", "wo")} == {"nvfp4"}, plan
  assert {plan[m] for m in ("query", "key", "value", "out")} == {attention}, plan
  assert "logits_dense" not in plan  # maxtext gives the logits projection no quant object
  share = json.loads((runs[name] / "precision_plan.json").read_text())["flops"]["mlp_flop_share"]
  assert 0.0 < share < 1.0  # values: tests/integration/flops_test.py
  log = (runs[name] / "stdout.txt").read_text()
  assert "NVFP4 precision plan (emulated backend" in log and "decoder/" in log and "mlp/wi_0" in log
  assert "nvfp4_backend=auto -> emulated" in log or name == "nvfp4"


def test_unscanned_plan_has_one_entry_per_layer(runs):
  modules = [g["module"] for g in json.loads((runs["no_rht"] / "precision_plan.json").read_text())["gemms"]]
  assert any("layers_0/" in m for m in modules) and any("layers_1/" in m for m in modules), modules
  assert json.loads((runs["no_rht"] / "precision_plan.json").read_text())["recipe"]["rht"] is False


def test_resume_is_bit_identical(runs, jax_cache_dir):
  """The nvfp4 run resumed from its checkpoint of step RESUME_FROM continues exactly (same seed, same SR keys).

  That a fresh run repeats another's losses exactly is shown by every bit-for-bit comparison between runs: the
  pins of integration/maxtext_versions_test.py, statistics and the audit on and off, the late switches."""
  full = read_losses(runs["nvfp4"] / "metrics.jsonl")
  resumed = resumed_losses(runs["nvfp4"].parent, "nvfp4", RESUME_FROM, [*_RUNS["nvfp4"], *_LENGTH],
                           jax_cache_dir)
  assert [resumed[s] for s in range(RESUME_FROM + 1, STEPS)] == full[RESUME_FROM + 1:]
