# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The pre-flight (`python -m MaxText.preflight`) and the overhead audit (scripts/audit_overhead.py), run as users run
them, in .venv-gpu on this CPU: maxtext's train step compiled for described GPUs.

What is checked: the report's parts and exit statuses (fits: 0; does not fit, unknown target or comparison, a device
count the parallelism cannot use: 2 with one line), the step-time prediction's report (--predict) on a tiny config,
and the audit's two claims on the Llama 3 8B recipe's layer (2 layers here; the scanned layer is the same program):
the plugin adds at most 5% of the bytes TE's NVFP4 kernels move, and the backward never quantizes x or W again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

from tests.helpers import REPO_ROOT, TINY_YML

TINY_TE = ["base_emb_dim=128", "head_dim=32", "base_mlp_dim=256", "per_device_batch_size=1", "max_target_length=128",
           "quantization=te_nvfp4", "nvfp4_backend=te"]


def _taps() -> tuple:
  """The tap registry's entries (MaxText.precision.taps), in order: the pre-flight switches each off by its key."""
  from MaxText.precision.taps import TAPS  # pylint: disable=import-outside-toplevel  # jax: after the fixture

  return TAPS


def _preflight(*args: str) -> subprocess.CompletedProcess:
  """The pre-flight in a new process, with a temp folder of its own, which it must leave without the stub driver's
  folder (MaxText.preflight.deviceless builds one per process)."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the suite's 4 CPU devices are not the user's
  with tempfile.TemporaryDirectory() as tmp:
    proc = subprocess.run([sys.executable, "-m", "MaxText.preflight", *args], cwd=REPO_ROOT, env={**env, "TMPDIR": tmp},
                          capture_output=True, text=True, timeout=600, check=False)
    print(proc.stdout[-3000:], proc.stderr[-2000:])
    left = sorted(p.name for p in pathlib.Path(tmp).glob("te_stub_libcuda_*"))
  assert not left, left
  return proc


def _last_line(stderr: str) -> str:
  return [line for line in stderr.splitlines() if line.strip()][-1]


def test_a_tiny_te_nvfp4_step_fits_one_b200_and_reports_te_and_the_plugins_bytes(te, tmp_path):
  """With the audit on every 5th step: its bytes on the steps it runs (one more compile, without it) and averaged."""
  del te
  out = tmp_path / "preflight.json"
  proc = _preflight(str(TINY_YML.relative_to(REPO_ROOT)), *TINY_TE, "nvfp4_audit_interval=5", "--target", "b200",
                    "--devices", "1", "--json", str(out))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "per-device memory on 1 x NVIDIA B200" in proc.stdout and "fits," in proc.stdout
  report = json.loads(out.read_text())
  assert report["memory"]["fits"] and 0 < report["memory"]["peak"] < report["memory"]["device"]
  assert report["te_kernels"]["te_gemm_v2_ffi"] >= 3 and report["te_kernels"]["te_dbias_quantize_ffi"] >= 3
  assert report["overhead"]["te_bytes"] > 0 and "added_bytes_fraction" in report["overhead"]
  rows = report["overhead"]["net_by_group"]
  assert rows and sum(row["net_bytes"] for row in rows) == report["overhead"]["added_bytes"]
  compiled = [line for line in proc.stdout.splitlines() if line.startswith("compiled the train step")]
  taps_off = " ".join(f"{tap.key}=0" for tap in _taps())  # every tap of the registry off
  assert [line.split(": ", 1)[1] for line in compiled] == [
      "this run", "the run without the audit (nvfp4_audit_interval=0), to count what it adds",
      f"the overhead comparison (nvfp4_nonfinite_check=false {taps_off})"]
  (tap,) = report["overhead"]["taps"]
  assert tap["key"] == "nvfp4_audit_interval" and tap["interval"] == 5 and tap["bytes_on_its_steps"] > 0
  overhead = report["overhead"]
  assert overhead["mean_added_bytes"] == pytest.approx(overhead["added_bytes"] - tap["bytes_on_its_steps"] * 4 / 5)
  assert "the audit (nvfp4_audit_interval=5): +" in proc.stdout and "per step on average: +" in proc.stdout


def _by_origin(program: dict) -> dict[str, float]:
  """A predicted program's elementwise group by origin (issue 36), summed over phases; its rows sum to the group."""
  rows = program["elementwise_by_origin"]
  assert sum(row["seconds"] for row in rows) == pytest.approx(program["seconds"]["elementwise"], rel=1e-9)
  split: dict[str, float] = {}
  for row in rows:
    split[row["origin"]] = split.get(row["origin"], 0.0) + row["seconds"]
  return split


def test_predict_reports_step_times_ratios_and_where_the_time_goes(te, tmp_path):
  """--predict against maxtext's fp8 on one B200 for a run with statistics every 10th step: three compiles of the
  tiny model (the run, the run without its statistics, fp8 with the taps off as maxtext's fp8 requires), the
  report's rows, the JSON, and the elementwise split by origin: the guard's, the taps' and TE's NVFP4 kernels in
  the run and none in fp8, whose FP8 quantization is found."""
  del te
  out = tmp_path / "predict.json"
  proc = _preflight(str(TINY_YML.relative_to(REPO_ROOT)), *TINY_TE, "nvfp4_stats_interval=10", "--target", "b200",
                    "--devices", "1", "--no-overhead", "--predict-against", "fp8", "--json", str(out))
  assert proc.returncode == 0, proc.stderr[-3000:]
  prediction = json.loads(out.read_text())["prediction"]
  run, fp8 = prediction["run"], prediction["against"]["fp8"]
  groups = {"MLP GEMMs", "attention", "other GEMMs", "elementwise", "communication", "launch gaps", "unclassified"}
  assert set(run["seconds"]) == groups and set(fp8["seconds"]) == groups
  assert run["step_seconds"] == pytest.approx(sum(run["seconds"].values()))
  assert run["tflops_per_step"]["fp4_gemm"] > 0 and fp8["tflops_per_step"]["fp4_gemm"] == 0
  assert fp8["tflops_per_step"]["fp8_gemm"] > 0 and run["model_tflops_per_gpu"] > 0
  assert prediction["speedup"]["fp8"] == pytest.approx(fp8["step_seconds"] / run["step_seconds"])
  assert prediction["amdahl_ceiling"]["fp8"] >= prediction["speedup"]["fp8"]
  assert prediction["compared_programs"]["fp8"]["overrides"] == ["quantization=fp8",
                                                                 *(f"{tap.key}=0" for tap in _taps())]
  assert prediction["tap_seconds"]["nvfp4_stats_interval"] > 0
  split = {"run": _by_origin(run), "fp8": _by_origin(fp8)}
  for origin in ("TE NVFP4 quantize, RHT amax", "non-finite guard", "statistics, audit"):
    assert split["run"][origin] > 0 and split["fp8"][origin] == 0, origin
  assert split["fp8"]["FP8 quantization"] > 0
  report = proc.stdout[proc.stdout.index("predicted step time on 1 x NVIDIA B200"):]
  for row in ("this run", "fp8", "MLP GEMMs", "communication", "unclassified", "Amdahl ceiling over fp8",
              "elementwise by origin and phase", "  non-finite guard, forward",
              "the statistics (nvfp4_stats_interval=10): ", "not seen by the prediction"):
    assert f"  {row}" in report, row
  assert "Warning: " not in proc.stderr  # Python's warnings are held until after the report, on stdout
  if "warnings and log messages" in proc.stdout:
    assert proc.stdout.index("wrote ") < proc.stdout.index("warnings and log messages")


def test_a_step_too_large_for_the_gpu_exits_2_saying_by_how_much(te):
  del te
  proc = _preflight(str(TINY_YML.relative_to(REPO_ROOT)), *TINY_TE, "base_emb_dim=16384", "base_mlp_dim=65536",
                    "base_num_decoder_layers=4", "--target", "b200", "--devices", "1", "--no-overhead")
  assert proc.returncode == 2
  assert "does NOT fit" in proc.stdout
  compiled = [line for line in proc.stdout.splitlines() if line.startswith("compiled the train step")]
  assert [line.split(": ", 1)[1] for line in compiled] == ["this run"]  # --no-overhead: no second compile
  line = _last_line(proc.stderr)
  assert line.startswith("MaxText.preflight: does not fit: ") and "NVIDIA B200 (75%) by " in line, line


@pytest.mark.parametrize("args,expected", [
    (["--target", "a100", "--devices", "1"],
     "--target 'a100' is not a GPU the plugin describes; valid: b200, gb200, gb300, h100"),
    (["--target", "b200", "--devices", "1", "--predict-against", "fp8,fp4"],
     "--predict-against 'fp8,fp4': 'fp4' is not a program to compare with; valid: fp8, bf16, nvfp4_all"),
    (["--target", "b200", "--devices", "0"], "--devices 0"),
    # fp8 (maxtext's own mode): the plugin's config checks would refuse an NVFP4 run earlier, on its GEMM sizes.
    (["--target", "b200", "--devices", "4", "quantization=fp8", "ici_fsdp_parallelism=3"],
     "4 x b200: the config's parallelism cannot use this device count: Number of devices per slice 4 does not match"),
    (["--target", "b200", "--devices", "1", "nvfp4_bf16_layers=[7]"], "nvfp4_bf16_layers"),
], ids=["unknown_target", "unknown_comparison", "no_devices", "parallelism", "config_error"])
def test_bad_input_is_one_line_and_exit_2(te, args, expected):
  del te
  given = {a.split("=", 1)[0] for a in args if "=" in a}
  proc = _preflight(str(TINY_YML.relative_to(REPO_ROOT)), *[o for o in TINY_TE if o.split("=", 1)[0] not in given],
                    *args)
  assert proc.returncode == 2
  line = _last_line(proc.stderr)
  assert line.startswith("MaxText.preflight: ") and expected in line, line


def _audit_module():
  spec = importlib.util.spec_from_file_location("audit_overhead", REPO_ROOT / "scripts" / "audit_overhead.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_plugin_adds_at_most_5_percent_to_te_in_the_llama3_8b_layer(te, blackwell):
  """The lean non-finite guard (MaxText.backends.stages.guard): in the first form (a select against a NaN
  tensor, verdicts recomputed by remat) this was 0.675."""
  del te, blackwell
  from MaxText.preflight import deviceless  # pylint: disable=import-outside-toplevel

  deviceless.answer()  # Blackwell's answers, cuDNN's fused attention among them (the recipe's attention=cudnn_flash_te)
  audit = _audit_module()
  step = audit.whole_step("configs/recipes/llama3_8b_te_nvfp4.yml",
                          ["override_model_config=true", "base_num_decoder_layers=2"], "b200", 1)
  assert step["te_bytes"] > 0
  assert step["added_bytes_fraction"] <= 0.05, step["added_bytes_fraction"]
  assert step["te_quantize_calls"]["recomputed"] == 0 and step["te_quantize_calls"]["backward"] == 3


def test_the_audit_refuses_a_config_that_is_not_nvfp4_on_te(te):
  del te
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  proc = subprocess.run([sys.executable, "scripts/audit_overhead.py", "--config", str(TINY_YML.relative_to(REPO_ROOT)),
                         "quantization=fp8"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "the audit needs an NVFP4 config on TE" in _last_line(proc.stderr)
