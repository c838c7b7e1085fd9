# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""scripts/validate_prediction.py on CPU: maxtext's per-step lines read into the median after the warm-up, the
pre-flight's JSON read into each precision's prediction, and the measured-against-predicted table (the GPU runs
themselves need a Hopper GPU: scripts/validate_prediction.sh); and configs/validate.yml loads as maxtext loads it."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.helpers import REPO_ROOT

#: maxtext's per-step lines as its metric logger prints them (maxtext/common/metric_logger.py), with other output.
LOG = """I1205 09:00:00.1 metric_logger.py:214] completed step: 0, seconds: 41.250, TFLOP/s/device: 3.100, Tokens/s/device: 400.0, total_weights: 16384, loss: 10.9
WARNING something unrelated
I1205 09:00:01.1 metric_logger.py:214] completed step: 1, seconds: 0.900, TFLOP/s/device: 380.000, Tokens/s/device: 18000.0, total_weights: 16384, loss: 10.1
I1205 09:00:02.1 metric_logger.py:214] completed step: 2, seconds: 0.520, TFLOP/s/device: 610.000, Tokens/s/device: 31000.0, total_weights: 16384, loss: 9.8
I1205 09:00:03.1 metric_logger.py:214] completed step: 3, seconds: 0.500, TFLOP/s/device: 640.000, Tokens/s/device: 32000.0, total_weights: 16384, loss: 9.5
I1205 09:00:04.1 metric_logger.py:214] completed step: 4, seconds: 0.510, TFLOP/s/device: 630.000, Tokens/s/device: 31500.0, total_weights: 16384, loss: 9.2
"""  # noqa: E501


@pytest.fixture(name="script")
def _script(monkeypatch):
  spec = importlib.util.spec_from_file_location("_validate_prediction", REPO_ROOT / "scripts" / "validate_prediction.py")
  module = importlib.util.module_from_spec(spec)
  monkeypatch.setitem(sys.modules, spec.name, module)
  spec.loader.exec_module(module)
  return module


def _prediction(step: float, low: float, high: float, roofline: float, tflops: float) -> dict:
  return {"step_seconds": step, "step_interval_seconds": [low, high], "roofline_step_seconds": roofline,
          "model_tflops_per_gpu": tflops}


def test_the_median_leaves_out_the_warm_up_steps(script):
  assert script.step_lines(LOG)[0] == (0, 41.25, 3.1) and len(script.step_lines(LOG)) == 5
  assert script.measured(LOG, warmup=2) == {"step_seconds": 0.51, "tflops_per_gpu": 630.0, "steps": 3}
  with pytest.raises(ValueError, match="after step 5"):
    script.measured(LOG, warmup=5)


def test_the_table_puts_measured_beside_each_precisions_prediction(script):
  payload = {"prediction": {"run": _prediction(0.55, 0.53, 0.57, 0.40, 580.0),
                            "against": {"fp8": _prediction(0.40, 0.38, 0.42, 0.28, 800.0)}}}
  predictions = script.predicted(payload)
  assert predictions["bf16"]["step_seconds"] == 0.55 and predictions["fp8"]["step_seconds"] == 0.40
  measures = {"bf16": {"step_seconds": 0.50, "tflops_per_gpu": 640.0, "steps": 20},
              "fp8": {"step_seconds": 0.40, "tflops_per_gpu": 800.0, "steps": 20}}
  lines = script.table(measures, predictions, "h100")
  assert "--target h100" in lines[0]
  assert lines[2].split() == ["bf16", "500.0", "550.0", "530.0-570.0", "400.0", "+10%", "640", "580"]
  assert lines[3].split()[:6] == ["fp8", "400.0", "400.0", "380.0-420.0", "280.0", "+0%"]
  assert lines[-1] == "  fp8 over bf16: measured 1.25x, predicted 1.38x"


def test_the_validation_model_loads_as_maxtext_loads_it(script):
  from MaxText.integration import seam  # pylint: disable=import-outside-toplevel  # maxtext: seconds
  from MaxText.preflight import library  # pylint: disable=import-outside-toplevel

  seam.register()
  config = library.load_config(str(REPO_ROOT / "configs" / "validate.yml"), [*script.MODEL, "quantization=fp8"], 1)
  assert (config.num_decoder_layers, config.emb_dim, config.num_kv_heads) == (4, 4096, 8)
  assert config.dataset_type == "synthetic" and config.quantization == "fp8"
