# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Starting an NVFP4 run from another run's checkpoint, through maxtext's trainer (emulated backend, CPU).

Source runs (module-scoped, one or two steps each, checkpointing):
  bf16            maxtext's bf16, scanned
  nvfp4           te_nvfp4 with statistics every step (so its checkpoint holds tap state), two steps
  unscanned_fp8   maxtext's fp8, scan_layers=false (one run for both: fp8's and the unscanned layout's loads)
  moe             bf16, a tiny Mixtral (routed experts)
Each target run loads one with `load_parameters_path=<run>/checkpoints/<step>/items` at learning rate 0 and saves
its step 0: at learning rate 0 Adam's update is exactly zero, so that checkpoint's weights are the weights the
load put into the model, and they must equal the source's bit for bit. The plugin's own variables must be fresh.
te_nvfp4_no_rht is a target only (unscanned_fp8_to_no_rht): as a source its checkpoint would hold what te_nvfp4's
does, the Hadamard transform having no variables (MaxText.integration.checkpoints names the plugin's).
"""

from __future__ import annotations

import pathlib

import pytest

from tests.helpers import MIXTRAL, arrays_that_differ, last_checkpoint, read_checkpoint, train_cli

pytestmark = pytest.mark.slow

MIXTRAL_SPARSE = [*MIXTRAL, "sparse_matmul=true", "megablox=false"]
_SAVE = ["enable_checkpointing=true", "checkpoint_period=1", "async_checkpointing=false"]

#: name -> (overrides, steps): the source runs.
_SOURCES = {
    "bf16": ([], 1),
    "nvfp4": (["quantization=te_nvfp4", "nvfp4_stats_interval=1"], 2),
    "unscanned_fp8": (["quantization=fp8", "scan_layers=false"], 1),
    "moe": (MIXTRAL_SPARSE, 1),
}
#: name -> (source, overrides): the target runs, each loading its source's last checkpoint at learning rate 0.
_TARGETS = {
    # A BF16 first layer: every GEMM holds its decoder layer index (nvfp4_layer), which the bf16 source lacks.
    "bf16_to_nvfp4": ("bf16", ["quantization=te_nvfp4", "nvfp4_bf16_first_layers=1"]),
    "nvfp4_to_nvfp4": ("nvfp4", ["quantization=te_nvfp4", "nvfp4_stats_interval=1"]),
    "unscanned_fp8_to_no_rht": ("unscanned_fp8", ["quantization=te_nvfp4_no_rht", "scan_layers=false"]),
    "moe_to_nvfp4": ("moe", ["quantization=te_nvfp4", *MIXTRAL_SPARSE]),
}


def _listing(directory: pathlib.Path) -> dict[str, tuple[int, int]]:
  return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, jax_cache_dir) -> dict[str, object]:
  """Trains the sources, then the targets; returns the root, each target's log and the sources' listings before."""
  root = tmp_path_factory.mktemp("checkpoint_load")
  for name, (overrides, steps) in _SOURCES.items():
    run = train_cli([f"run_name={name}", f"base_output_directory={root}", f"steps={steps}", *_SAVE, *overrides],
                    jax_cache_dir)
    assert run.returncode == 0, f"{name}: {run.stderr[-4000:]}"
  listings = {name: _listing(root / name) for name in _SOURCES}
  logs = {}
  for name, (source, overrides) in _TARGETS.items():
    run = train_cli([f"run_name={name}", f"base_output_directory={root}", "steps=1", "learning_rate=0", *_SAVE,
                     f"load_parameters_path={last_checkpoint(root / source)}", *overrides], jax_cache_dir)
    assert run.returncode == 0, f"{name}: {run.stderr[-4000:]}"
    logs[name] = run.stdout + run.stderr
  return {"root": root, "logs": logs, "listings": listings}


@pytest.mark.parametrize("target", list(_TARGETS))
def test_weights_load_bit_for_bit(runs, target):
  root, source = runs["root"], _TARGETS[target][0]
  before = {k: v for k, v in read_checkpoint(last_checkpoint(root / source)).items() if k.startswith("params/")}
  after = {k: v for k, v in read_checkpoint(last_checkpoint(root / target)).items() if k.startswith("params/")}
  differ = arrays_that_differ(before, after)
  assert before and not differ, differ


@pytest.mark.parametrize("target", list(_TARGETS))
def test_plugin_state_starts_fresh_and_is_named(runs, target):
  """The plugin's variables are not the source's: they hold what a run from scratch holds after one step. A dense
  GEMM's SR counter is 1 after init and 2 after the step (MaxText.backends.sr); a MoE layer's expert state is built
  at its first call, so its counter is 1 after the step (a MoE run from scratch saved 1, 2, 3 at steps 0-2). The
  two-step nvfp4 source saved 3. One line names what starts fresh."""
  root = runs["root"]
  counters = {k: v for k, v in read_checkpoint(last_checkpoint(root / target)).items() if k.endswith("/nvfp4_sr_count")}
  fresh = {k: 1 if "/nvfp4_experts/" in k else 2 for k in counters}
  assert counters and all((v == fresh[k]).all() for k, v in counters.items()), counters
  log = runs["logs"][target]
  line = next((x for x in log.splitlines() if "the plugin's own state starts fresh, not loaded: " in x), "")
  named = "nvfp4_experts" if target == "moe_to_nvfp4" else "nvfp4_sr_count"  # Mixtral: every MLP GEMM is an expert's
  assert named in line, log[-3000:]
  if target == "bf16_to_nvfp4":
    assert "nvfp4_layer" in line, line
    layers = [v for k, v in read_checkpoint(last_checkpoint(root / target)).items() if k.endswith("/nvfp4_layer")]
    assert layers and all(v.tolist() == [0, 1] for v in layers), layers  # assigned as in a run from scratch
  if target == "nvfp4_to_nvfp4":
    source = {k: v for k, v in read_checkpoint(last_checkpoint(root / "nvfp4")).items() if k.endswith("/nvfp4_sr_count")}
    assert all((v == 3).all() for v in source.values()), source
    assert "nvfp4_stats" in log.split("starts fresh, not loaded: ")[1].splitlines()[0]


def test_nothing_written_into_the_source_runs(runs):
  assert {name: _listing(runs["root"] / name) for name in _SOURCES} == runs["listings"]


def test_an_architecture_mismatch_keeps_maxtexts_message(runs, jax_cache_dir):
  root = runs["root"]
  run = train_cli(["run_name=mismatch", f"base_output_directory={root}", "steps=1", "quantization=te_nvfp4",
                   "base_mlp_dim=128", f"load_parameters_path={last_checkpoint(root / 'bf16')}"], jax_cache_dir)
  assert run.returncode != 0
  assert "Checkpoint does not match the model" in run.stderr and "mlp/wi_0/kernel" in run.stderr, run.stderr[-3000:]


def test_a_full_state_from_another_precision_is_said(runs, jax_cache_dir):
  """load_full_state_path from the bf16 run into te_nvfp4 trains on, and says in one line what starts fresh."""
  root = runs["root"]
  run = train_cli(["run_name=full_state", f"base_output_directory={root}", "steps=2", "quantization=te_nvfp4",
                   "enable_checkpointing=true", f"load_full_state_path={last_checkpoint(root / 'bf16')}"], jax_cache_dir)
  assert run.returncode == 0, run.stderr[-4000:]
  log = run.stdout + run.stderr
  line = next(x for x in log.splitlines() if "NVFP4: load_full_state_path=" in x)
  assert "not an NVFP4 run" in line and "quantization: None -> 'te_nvfp4'" in line, line
  assert "nvfp4_sr_count" in line and (root / "full_state" / "precision_changes.jsonl").exists()
