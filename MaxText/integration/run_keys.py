# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The maxtext config keys that say where a run lives and what model it is, read once as plain values: what the
export needs to find a run's checkpoint, name its model for maxtext's conversion and quantize as its forward did.

Why here: every read of a maxtext config key is in the integration layer (tests/layers_test.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["RunKeys", "run_keys"]


@dataclasses.dataclass(frozen=True)
class RunKeys:
  """model_name, scan_layers, param_scan_axis: what maxtext's checkpoint conversion maps and where a scanned
  parameter stacks its layers; fused_mlp: gate and up are one `wi` kernel (one GEMM, one tensor scale). dtype: the
  compute dtype the layers cast a kernel to before its GEMM; weight_dtype: the parameters' stored dtype. The rest:
  where the checkpoint is and how orbax reads it, and the tokenizer."""

  model_name: str
  scan_layers: bool
  fused_mlp: bool
  param_scan_axis: int
  dtype: Any
  weight_dtype: Any
  run_name: str
  base_output_directory: str
  load_parameters_path: str
  tokenizer_path: str
  checkpoint_storage_concurrent_gb: int
  checkpoint_storage_use_ocdbt: bool
  checkpoint_storage_use_zarr3: bool


def run_keys(config: Any) -> RunKeys:
  """The keys of `config` (a loaded maxtext config)."""
  return RunKeys(**{f.name: getattr(config, f.name) for f in dataclasses.fields(RunKeys)})
