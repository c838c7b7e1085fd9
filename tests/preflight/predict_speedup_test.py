# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""scripts/predict_speedup.py's table (the validation against NVIDIA's published points): the 405B points on the
post's 128 GPUs with what is assumed said, and a point whose programs do not fit the GPU marked so and not counted as
validated (issue 36). On hand-built results: the script's compiles take minutes."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.helpers import REPO_ROOT


@pytest.fixture(name="script")
def _script(monkeypatch):
  monkeypatch.syspath_prepend(str(REPO_ROOT / "scripts"))  # it imports bench_step beside it
  spec = importlib.util.spec_from_file_location("_predict_speedup", REPO_ROOT / "scripts" / "predict_speedup.py")
  module = importlib.util.module_from_spec(spec)
  monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


def _result(point: str, fits: dict[str, bool], every_gemm_error: float) -> dict:
  peaks = {name: (100.0 if ok else 159.5) for name, ok in fits.items()}
  return {"point": point, "devices": 128, "published_ratio": 1.44, "predicted_ratio": 1.2, "ratio_error": -0.17,
          "predicted_ratio_every_gemm_nvfp4": 1.4, "ratio_error_every_gemm_nvfp4": every_gemm_error,
          "predicted_ratio_overlapped": 1.3, "published_tflops_per_gpu": {"fp8": 1557, "nvfp4": 2224},
          "predicted_tflops_per_gpu": {"fp8": 2000, "nvfp4": 2500}, "tflops_error": {"fp8": 0.28, "nvfp4": 0.12},
          "fits_75_percent": fits, "peak_gib": peaks, "device_gib": 143.6, "validated": all(fits.values())}


def test_the_405b_points_run_on_the_posts_128_gpus_and_say_what_is_assumed(script):
  points = {p.name: p for p in script.POINTS}
  assert points["llama3.1_405b_gb200"].devices == 128 and points["llama3.1_405b_gb300"].devices == 128
  assert all(p.assumed for p in points.values())
  assert "per_device_batch_size 1" in points["llama3.1_405b_gb300"].assumed


def test_a_point_that_does_not_fit_says_so_and_is_not_counted_as_validated(script):
  fitting = _result("a", {"fp8": True, "nvfp4": True, "nvfp4_every_gemm": True}, -0.03)
  over = _result("b", {"fp8": True, "nvfp4": True, "nvfp4_every_gemm": False}, 0.03)
  assert script.fit_cell(fitting) == "yes"
  assert script.fit_cell(over) == "NO: nvfp4_every_gemm 159.5 GiB > 143.6"
  lines = script._table([fitting, over])  # pylint: disable=protected-access
  assert lines[1].endswith("   yes") and lines[2].endswith("NO: nvfp4_every_gemm 159.5 GiB > 143.6")
  assert lines[-1].startswith("validated (every program fits): 1 of 2 points; of them, every GEMM NVFP4 within "
                              "+-15% of the published ratio: 1;")
