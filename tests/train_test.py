# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""The training CLI end to end, in subprocesses: tiny runs train, bad configs fail in one line."""

from __future__ import annotations

import importlib.util
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT, Run, read_losses

# absl's log-line prefix, e.g. "W1121 05:10:33.552683 139984521096064 pyconfig.py:270] ...".
_ABSL_LINE = re.compile(r"^[IWEF]\d{4} ")


def _assert_trained(run: Run, metrics_file: pathlib.Path, steps: int) -> None:
  """The run exited 0 and wrote `steps` finite losses."""
  assert run.returncode == 0, run.stderr[-3000:]
  losses = read_losses(metrics_file)
  assert len(losses) == steps, losses
  assert all(math.isfinite(x) for x in losses), losses


@pytest.mark.slow
def test_tiny_trains_via_module(run_train, tmp_path: pathlib.Path) -> None:
  """`python -m MaxText.train configs/tiny.yml ...` in BF16 (no quantization) completes N steps with N finite losses.

  maxtext's own fp8 through the same command is train_runs_test.py's reference run.
  """
  metrics = tmp_path / "metrics.jsonl"
  run = run_train(
      [
          "run_name=tiny_bf16",
          f"base_output_directory={tmp_path / 'out'}",
          "steps=3",
          f"metrics_file={metrics}",
          "quantization=",
      ]
  )
  _assert_trained(run, metrics, steps=3)


@pytest.mark.slow
def test_tiny_trains_via_file_with_plugin_keys(run_train, tmp_path: pathlib.Path) -> None:
  """The historic form `python MaxText/train.py ...` works, and our nvfp4_* keys pass through the CLI.

  Our keys reaching maxtext's trainer proves the config-class hook takes effect inside its own `main`.
  """
  metrics = tmp_path / "metrics.jsonl"
  run = run_train(
      [
          "run_name=tiny_file",
          f"base_output_directory={tmp_path / 'out'}",
          "steps=2",
          f"metrics_file={metrics}",
          "nvfp4_backend=emulated",
          "nvfp4_attention_precision=fp8",
          "nvfp4_stochastic_rounding=false",
      ],
      as_file=True,
  )
  _assert_trained(run, metrics, steps=2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, expected",
    [
        ("nvfp4_bakend=te", ["unknown config key 'nvfp4_bakend'", "did you mean 'nvfp4_backend'"]),
        ("quantization=bogus", ["quantization='bogus'", "valid choices:", "'fp8'", "'te_nvfp4'"]),
        ("quantization=te_nvfp4 base_mlp_dim=200", ["mlp/wi_0 has N = 200 from mlp_dim=200 (base_mlp_dim=200)"]),
    ],
    ids=["misspelt_key", "bad_choice", "mlp_dim"],
)
def test_bad_config_fails_in_one_line(run_train, tmp_path: pathlib.Path, override: str, expected: list[str]) -> None:
  """A bad key or value exits 2 with one `config error` line naming it, and no traceback.

  Each kind of error's wording (a wrong type, tokens that do not tile, ...) is covered in-process by
  integration/config_test.py; these check the CLI plumbing once per place an error is raised: our unknown-key check,
  maxtext's pydantic validation, and our GEMM-shape check after the config loads (each case is a ~7 s subprocess).
  """
  run = run_train([f"base_output_directory={tmp_path}", *override.split()], timeout=120)
  assert run.returncode == 2, run.stderr[-3000:]
  assert "Traceback" not in run.stderr
  lines = [line for line in run.stderr.splitlines() if line.strip()]
  assert len(lines) <= 5, lines  # Our line plus at most maxtext's and jax's own short log lines.
  errors = [line for line in lines if line.startswith("MaxText.train: config error: ")]
  assert len(errors) == 1, lines
  for text in expected:
    assert text in errors[0], errors[0]
  assert all(_ABSL_LINE.match(line) for line in lines if line not in errors), lines


@pytest.mark.slow
def test_missing_base_config_named_and_traceback_on_request(tmp_path: pathlib.Path, jax_cache_dir) -> None:
  """The one line names the missing base_config and its includer; NVFP4_CONFIG_TRACEBACK=1 adds the traceback."""
  child = tmp_path / "child.yml"
  child.write_text('base_config: "nothere.yml"\nsteps: 3\n', encoding="utf-8")
  for env, traceback in (({}, False), ({"NVFP4_CONFIG_TRACEBACK": "1"}, True)):
    proc = subprocess.run([sys.executable, "-m", "MaxText.train", str(child)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, check=False, env=dict(os.environ, JAX_PLATFORMS="cpu", **env))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"MaxText.train: config error: config file not found: base_config 'nothere.yml' of {child}" in proc.stderr
    assert ("Traceback" in proc.stderr) is traceback, proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="needs a machine without TE")
def test_te_nvfp4_never_reaches_upstreams_te_class(run_train, tmp_path: pathlib.Path) -> None:
  """quantization=te_nvfp4 goes through our hook, not upstream's TransformerEngine import.

  Asking for the TE backend where TE is absent is the quickest run that proves it: it must stop with our
  message naming the remedy, not with maxtext's `ModuleNotFoundError` from `TransformerEngineQuantization`.
  (Training with the emulated backend is covered by train_runs_test.py.)
  """
  run = run_train(
      [f"base_output_directory={tmp_path}", "quantization=te_nvfp4", "nvfp4_backend=te", "steps=1"], timeout=120
  )
  assert run.returncode != 0
  assert "nvfp4_backend=emulated" in run.stderr, run.stderr[-3000:]
  assert "TransformerEngineQuantization" not in run.stderr, run.stderr[-3000:]
  assert not re.search(r"^ModuleNotFoundError", run.stderr, re.MULTILINE), run.stderr[-3000:]
