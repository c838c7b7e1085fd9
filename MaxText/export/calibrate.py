# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The export's activation calibration (`--activations calibrate`, W4A4): each NVFP4 GEMM's input amax over N steps of
the run's own data through the checkpoint's weights, read from the calibration tap (MaxText.precision.taps).

How: maxtext's own trainer loads the checkpoint's weights (`load_parameters_path`, MaxText.integration.checkpoints:
the plugin's own variables start fresh) into a scratch run with the run's config, data pipeline and sharding, and
trains N steps at `learning_rate=0` (the parameters every step multiplies stay the exported ones) with
`nvfp4_calibration_interval=1` and no late BF16 switch; the tap's metrics
(`nvfp4/calibration/layer_03/mlp/wi_0/fprop_x/amax`) land in a metrics file, and the amax of each GEMM's input is
their largest over the steps. Any maxtext checkpoint of the model serves (a training checkpoint, or one maxtext's
checkpoint conversion wrote), and nothing is written into the run's directory. Until loading parameters into an NVFP4
run worked, the calibration resumed the training checkpoint instead, which only a training checkpoint allows.
In a subprocess: a fresh jax with the run's own devices, and the export's process keeps its memory for the conversion.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from MaxText.export.mapping import ROUTED, ExportError, layer_of
from MaxText.integration.cli import not_overridden
from MaxText.integration.settings import settings_of
from MaxText.precision.taps import CALIBRATION, TAPS

__all__ = ["Calibration", "calibrate", "gemm_path", "measured", "read_input_amax"]


@dataclasses.dataclass(frozen=True)
class Calibration:
  """The input amax of every NVFP4 GEMM: (decoder layer, GEMM path as in the metric names) -> the largest over
  `steps` steps (a routed-expert GEMM: over its experts too, one scale they share)."""

  steps: int
  amax: dict[tuple[int, str], float]

  def input_amax(self, key: str, hf_name: str) -> float:
    """The input amax of the GEMM whose weight is checkpoint parameter `key`, HF tensor `hf_name`."""
    layer, gemm = layer_of(hf_name), gemm_path(key)
    if layer is None or (layer, gemm) not in self.amax:
      raise ExportError(f"{hf_name}: the calibration measured no input amax for layer {layer}, GEMM {gemm} "
                        f"({len(self.amax)} GEMMs measured)")
    return self.amax[(layer, gemm)]


def gemm_path(key: str) -> str:
  """A GEMM weight's checkpoint key as the GEMM's path in the metric names: `params-decoder-layers-mlp-wi_0-kernel`
  -> `mlp/wi_0`; a routed expert stack `...-MoeBlock_0-wi_0` -> `MoeBlock_0/experts/wi_0` (telemetry's names)."""
  parts = key.split("-")[3:]  # after params, decoder and the layer stack (layers, layers_0, moe_layers, ...)
  if parts and parts[-1] == "kernel":
    parts = parts[:-1]
  if ROUTED.search(key):
    parts = [*parts[:-1], "experts", parts[-1]]
  return "/".join(parts)


def read_input_amax(metrics_file: pathlib.Path) -> tuple[dict[tuple[int, str], float], int]:
  """((layer, GEMM path) -> the largest `fprop_x` amax the calibration tap wrote over the metrics file's steps, how
  many steps wrote any)."""
  found: dict[tuple[int, str], float] = {}
  steps = set()
  for line in metrics_file.read_text(encoding="utf-8").splitlines():
    row = json.loads(line) if line.strip() else {}
    for name, value in row.items():
      parts = CALIBRATION.parse(name)
      if parts is not None and parts[2:] == ("fprop_x", "amax"):
        found[parts[:2]] = max(found.get(parts[:2], 0.0), float(value))
        steps.add(row.get("step"))
  return found, len(steps)


def calibrate(config: Any, config_path: str, overrides: Sequence[str], checkpoint: pathlib.Path, steps: int,
              workdir: pathlib.Path) -> Calibration:
  """Runs the calibration (module docstring) in `workdir`; raises ExportError (one line) when it cannot."""
  settings = settings_of(config)
  if not settings.nvfp4 or not settings.nvfp4_gemms:
    raise ExportError(f"--activations calibrate with quantization={settings.quantization or 'none'}, "
                      f"nvfp4_mlp_precision={settings.mlp.value} and nvfp4_attention_precision="
                      f"{settings.attention.value}: the calibration measures the inputs of the NVFP4 "
                      "GEMMs the run trained with, and this run has none; export weight-only (--activations none)")
  if steps < 1:
    raise ExportError(f"--calibration-steps {steps}: use 1 or more")
  metrics = workdir / "calibration_metrics.jsonl"
  ours = [f"load_parameters_path={checkpoint}", "load_full_state_path=''", "run_name=calibration",
          f"base_output_directory={workdir}", f"metrics_file={metrics}", f"steps={steps}", "learning_rate=0",
          "enable_checkpointing=false", "nvfp4_bf16_from_step=null", "nvfp4_bf16_forward_from_step=null",
          *(f"{tap.key}={int(tap is CALIBRATION)}" for tap in TAPS)]
  command = [sys.executable, "-m", "MaxText.train", config_path, *not_overridden(overrides, ours), *ours]
  run = subprocess.run(command, capture_output=True, text=True, check=False)
  if run.returncode != 0:
    tail = " ".join(run.stderr.strip().splitlines()[-1:])[:300]
    raise ExportError(f"the calibration run (MaxText.train loading {checkpoint} for {steps} steps at "
                      f"learning_rate=0) failed with exit status {run.returncode}: {tail}")
  return measured(metrics, steps)


def measured(metrics: pathlib.Path, steps: int) -> Calibration:
  """The calibration the run's metrics file holds; ExportError when it holds none, or fewer or more steps than
  `steps` measured (a step that measured nothing would make the amax a maximum over fewer batches than asked)."""
  amax, found = read_input_amax(metrics)
  if not amax:
    raise ExportError(f"the calibration run wrote no {CALIBRATION.prefix} metrics to {metrics}")
  if found != steps:
    raise ExportError(f"the calibration run measured {found} of {steps} steps ({metrics}); every step must "
                      "measure the NVFP4 GEMMs' inputs")
  return Calibration(steps, amax)
