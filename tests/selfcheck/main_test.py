# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""`python -m MaxText.selfcheck` on this CPU machine: the emulator is the candidate, every check holds (exit 0), a
fault fails naming its operand (exit 1), bad input is one line (exit 2); the report as a table and JSON.

Through subprocesses where a config loads: the command line installs its one-line config-error handler for the whole
process. Options and the config's own refusals are checked in this process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from MaxText.selfcheck import __main__ as selfcheck_main
from MaxText.selfcheck import run
from tests.helpers import REPO_ROOT, TINY_YML, run_cache

_SMALL = [str(TINY_YML), "quantization=te_nvfp4", "base_emb_dim=32", "base_mlp_dim=64", "per_device_batch_size=1",
          "--draws", "4", "--repeats", "1"]


def _selfcheck(*args: str) -> subprocess.CompletedProcess:
  # The run's compilation cache (tests/conftest.py), not maxtext's default ~/jax_cache.
  return subprocess.run([sys.executable, "-m", "MaxText.selfcheck", *_SMALL, *run_cache(), *args], cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_every_check_holds_here_and_says_what_cannot_run(tmp_path):
  proc = _selfcheck("--json", str(tmp_path / "sc.json"))
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "candidate: emulator (TransformerEngine's NVFP4 not checked here:" in proc.stdout
  report = json.loads((tmp_path / "sc.json").read_text())
  assert report["ok"] and {r["check"] for r in report["results"]} == {"quantization", "gemm", "step", "speed"}
  step = [r for r in report["results"] if r["check"] == "step"][0]
  assert step["ok"] is None and "--compile-only --target b200" in step["detail"]


@pytest.mark.slow
def test_a_fused_backend_run_checks_the_fused_backend(tmp_path):
  """nvfp4_backend=fused: the candidate is the fused backend, its GEMMs (jax.nn.scaled_matmul on this CPU, TE's on
  Blackwell) held against the float64 reference, and the speed check times its NVFP4 GEMM."""
  proc = _selfcheck("nvfp4_backend=fused", "--json", str(tmp_path / "sc.json"))
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "candidate: fused backend (our quantizer, jax.nn.scaled_matmul)" in proc.stdout
  report = json.loads((tmp_path / "sc.json").read_text())
  assert report["ok"] and [r["ok"] for r in report["results"] if r["check"] == "gemm"] == [True] * 3 * len(
      {r["subject"].split()[-1] for r in report["results"] if r["check"] == "gemm"})


@pytest.mark.slow
def test_a_correct_rht_in_another_order_passes_counting_what_it_accepts(tmp_path):
  """--with-variant rht-order at GEMM shapes where the tiny_blocks tensor's RHT sums round by their order (x of 1024
  tokens x 512): exit 0, and the wgrad_x row says how many order-dependent differences it accepted (> 0)."""
  small = {a.split("=")[0] for a in _SMALL if "=" in a}
  args = [a for a in _SMALL if a.split("=")[0] not in small or a.startswith(("quantization", "per_device"))]
  proc = subprocess.run([sys.executable, "-m", "MaxText.selfcheck", *args, "base_emb_dim=512", "base_mlp_dim=256",
                         "max_target_length=1024", *run_cache(), "--with-variant", "rht-order", "--json",
                         str(tmp_path / "sc.json")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                        check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "candidate: emulator with variant rht-order" in proc.stdout
  row = next(r for r in json.loads((tmp_path / "sc.json").read_text())["results"] if r["subject"] == "wgrad_x")
  assert row["ok"] and row["values"]["accepted_order_differences"] > 0, row


@pytest.mark.slow
def test_a_fault_fails_naming_its_operand():
  proc = _selfcheck("--with-fault", "rht-sign")
  lines = [line for line in proc.stderr.splitlines() if line.startswith("MaxText.selfcheck:")]
  assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
  assert lines[0].startswith("MaxText.selfcheck: mismatch: quantization wgrad_x: mismatching codes"), lines
  assert "candidate: emulator with fault rht-sign" in proc.stdout


@pytest.mark.parametrize(("args", "expected"), [
    (["--with-fault", "nope"], "argument --with-fault: invalid choice: 'nope'"),
    (["--compile-only"], "--compile-only and --target go together"),
])
def test_a_bad_option_is_one_line_and_exit_2(args, expected, capsys):
  """Options are read before anything loads, in this process: the same one line the command prints."""
  with pytest.raises(SystemExit) as exited:
    selfcheck_main.parse_args([*_SMALL, *args])
  lines = capsys.readouterr().err.splitlines()
  assert exited.value.code == 2 and len(lines) == 1, lines
  assert lines[0].startswith("MaxText.selfcheck: ") and expected in lines[0], lines


@pytest.mark.parametrize(("overrides", "expected"), [
    (["quantization=fp8"], "quantization=fp8: the self-check needs an NVFP4 mode"),
    (["quantization=te_nvfp4", "nvfp4_mlp_precision=bf16"],
     "nvfp4_mlp_precision=bf16 and nvfp4_attention_precision=bf16: no GEMM runs in NVFP4"),
])
def test_a_config_with_nothing_to_check_is_named(load_config, overrides, expected):
  with pytest.raises(run.BadInput, match=expected):
    run.shapes_of(load_config(TINY_YML, *overrides))


def test_the_attention_projections_shapes_are_checked_when_they_run_in_nvfp4(load_config):
  """nvfp4_attention_precision=nvfp4: the self-check's shapes include query, key, value and out (alone, with the
  MLP in BF16), beside the MLP's when both are NVFP4."""
  only, _ = run.shapes_of(load_config(TINY_YML, "quantization=te_nvfp4", "nvfp4_mlp_precision=bf16",
                                      "nvfp4_attention_precision=nvfp4"))
  modules = {m for shape in only for m in shape.modules}
  assert modules == {"self_attention/query", "self_attention/key", "self_attention/value", "self_attention/out"}
  both, _ = run.shapes_of(load_config(TINY_YML, "quantization=te_nvfp4", "nvfp4_attention_precision=nvfp4"))
  assert modules < {m for shape in both for m in shape.modules} and any("mlp/wo" in s.modules for s in both)


@pytest.mark.slow
@pytest.mark.parametrize(("args", "expected"), [
    (["quantization=fp8"], "quantization=fp8: the self-check needs an NVFP4 mode"),
    (["nvfp4_backend=bogus"], "nvfp4_backend='bogus' is not a valid choice"),
])
def test_bad_input_is_one_line_and_exit_2(args, expected):
  """Through the command line, once per way a config is refused: the self-check's own check, maxtext's loader."""
  proc = _selfcheck(*args)
  lines = [line for line in proc.stderr.splitlines() if line.startswith("MaxText.selfcheck:")]
  assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr[-2000:]
