# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""te_nvfp4 under the ways maxtext distributes and resumes training: sharding, processes, accumulation, resume.

Every run here is the tiny model for STEPS steps with the same seeds; each is compared with the single-device run
of the same global batch. Tolerance: sharding and accumulation change the reduction order of the f32 GEMM
accumulations (tensor parallelism splits wo's contracting dim over devices) and of the gradient all-reduces, and in
NVFP4 a last-bit change of a GEMM output can move a whole 16-block to the next FP4 value through its amax, so the
losses drift further apart than BF16 runs would. Bounds: the step-0 loss within STEP0_BOUND of its layout (same
weights, same data: exact up to reduction order), every loss within MAX_DRIFT nats. Measured here
(docs/development.md, "Reliability: what was tried"): step 0 differs by 0.000 (fsdp 8), 0.002 (tensor 4), 0.007
(fsdp 2 x tensor 2), 0.012 (2-step accumulation); the largest drift over 10 steps is 0.005-0.022 nats.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO_ROOT, TINY_YML, read_losses, resumed_losses, train_cli

pytestmark = pytest.mark.slow

STEPS = 10
MAX_DRIFT = 0.05
_NVFP4 = ["quantization=te_nvfp4", "nvfp4_backend=emulated", f"steps={STEPS}", "learning_rate_schedule_steps=10"]
#: Asynchronous checkpoints every 4 steps, for the resume tests.
_CHECKPOINTS = ["enable_checkpointing=true", "checkpoint_period=4", "async_checkpointing=true"]

#: name -> (overrides, simulated CPU devices, the single-device run it must track, step-0 bound). maxtext's synthetic
#: data draws its tokens for the whole global batch, so each run is compared with a single-device run of the same
#: global batch. Data/fsdp parallelism computes each GEMM whole (weights gathered): step 0 agrees to 1e-3.
_LAYOUTS = {
    "single": (["per_device_batch_size=4"], 1, None, 0.0),
    "tensor4": (["ici_fsdp_parallelism=1", "ici_tensor_parallelism=4", "per_device_batch_size=1"], 4, "single", 0.02),
    "fsdp2_tensor2": (["ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", "per_device_batch_size=1"], 4, "single",
                      0.02),
    # Also checkpoints (asynchronously): test_resume_is_bit_identical resumes it.
    "grad_accum2": (["gradient_accumulation_steps=2", "per_device_batch_size=2", *_CHECKPOINTS], 1, "single", 0.02),
    "single8": (["per_device_batch_size=8"], 1, None, 0.0),
    "fsdp8": (["ici_fsdp_parallelism=8", "per_device_batch_size=1"], 8, "single8", 1e-3),
}


def _devices_env(n: int) -> dict[str, str]:
  return {"XLA_FLAGS": f"--xla_force_host_platform_device_count={n}"} if n > 1 else {}


@pytest.fixture(scope="module")
def layouts_dir(tmp_path_factory) -> pathlib.Path:
  """Where the layouts train: each run's output folder is `<layouts_dir>/<name>`."""
  return tmp_path_factory.mktemp("layouts")


@pytest.fixture(scope="module")
def layouts(layouts_dir, jax_cache_dir) -> dict[str, list[float]]:
  root = layouts_dir
  losses = {}
  for name, (overrides, devices, _, _) in _LAYOUTS.items():
    run = train_cli([f"run_name={name}", f"base_output_directory={root}", f"metrics_file={root / name}.jsonl",
                     *_NVFP4, *overrides], jax_cache_dir, env=_devices_env(devices))
    assert run.returncode == 0, f"{name}: {run.stderr[-4000:]}"
    losses[name] = read_losses(root / f"{name}.jsonl")
  print(json.dumps(losses))
  return losses


@pytest.mark.parametrize("name", [n for n, layout in _LAYOUTS.items() if layout[2]])
def test_layout_tracks_the_single_device_run(layouts, name) -> None:
  _, _, reference, step0_bound = _LAYOUTS[name]
  single, other = layouts[reference], layouts[name]
  assert len(other) == STEPS
  assert abs(other[0] - single[0]) < step0_bound, (name, other, single)
  drift = max(abs(a - b) for a, b in zip(other, single))
  assert drift < MAX_DRIFT, (name, drift, other, single)


def test_two_processes_through_jax_distributed_track_one_process(layouts, tmp_path, jax_cache_dir) -> None:
  """2 processes x 2 CPU devices on localhost, through maxtext's own jax.distributed initialization (its CPU path
  always uses port 1234 of JAX_COORDINATOR_ADDRESS)."""
  procs = []
  for i in range(2):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS="127.0.0.1", JOB_INDEX="0",
               JOB_COMPLETION_INDEX=str(i), PROCESSES_IN_JOB="2", JAX_PROCESS_COUNT="2", **_devices_env(2))
    args = [sys.executable, "-m", "MaxText.train", str(TINY_YML), "skip_jax_distributed_system=false",
            f"jax_cache_dir={jax_cache_dir}", "jax_distributed_initialization_timeout=300",
            f"base_output_directory={tmp_path}", "run_name=mp", f"metrics_file={tmp_path}/p{i}.jsonl",
            "per_device_batch_size=1", *_NVFP4]
    procs.append(subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True))
  start = time.monotonic()
  outputs = [p.communicate(timeout=600)[0] for p in procs]
  print(f"[{time.monotonic() - start:.1f}s] 2-process run")
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-4000:]
  losses = read_losses(tmp_path / "p0.jsonl")
  single = layouts["single"]
  assert abs(losses[0] - single[0]) < 1e-3 and max(abs(a - b) for a, b in zip(losses, single)) < MAX_DRIFT


@pytest.mark.parametrize("layout", [None, "grad_accum2"], ids=["async_scan_off", "async_grad_accum"])
def test_resume_is_bit_identical(layout, layouts, layouts_dir, tmp_path, jax_cache_dir) -> None:
  """A run resumed from its step-4 checkpoint repeats the straight run's later losses exactly: an unscanned model
  (trained here), and the gradient-accumulation layout (its run above is the straight run)."""
  if layout is None:
    root, name, common = tmp_path, "ck", [*_NVFP4, *_CHECKPOINTS, "scan_layers=false"]
    straight = train_cli([*common, f"base_output_directory={root}", f"run_name={name}",
                          f"metrics_file={root / name}.jsonl"], jax_cache_dir)
    assert straight.returncode == 0, straight.stderr[-4000:]
    full = read_losses(root / f"{name}.jsonl")
  else:
    root, name, common, full = layouts_dir, layout, [*_NVFP4, *_LAYOUTS[layout][0]], layouts[layout]
  after = resumed_losses(root, name, 4, common, jax_cache_dir)
  assert [after[s] for s in range(5, STEPS)] == full[5:], (after, full)
