# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The maxtext config keys the plugin reads, read once as plain values: `RunKeys`, where a run lives and what model it
is (what the export needs to find a run's checkpoint, name its model for maxtext's conversion and quantize as its
forward did), and `MaxtextKeys`, the keys a config may lack, each with maxtext's default.

Why here: every read of a maxtext config key is in the integration layer (tests/layers_test.py), and every read of
a key a config may lack is in this module (`getattr(config, ...)` nowhere else); the plugin's own keys are read by
MaxText.integration.settings."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

__all__ = ["EXPERT_LAYOUT_KEYS", "MaxtextKeys", "RunKeys", "maxtext_keys", "run_keys"]


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


#: The mesh axes whose ici_/dcn_ parallelism keys MaxtextKeys reads (those that split an MLP GEMM's hidden width).
_MLP_PARALLELISM = ("fsdp_transpose", "tensor", "tensor_sequence", "autoregressive")
#: maxtext's routed-expert layouts the NVFP4 expert hooks do not cover (integration/checks.py names each).
EXPERT_LAYOUT_KEYS = ("ici_expert_parallelism", "dcn_expert_parallelism", "num_moe_emb_chunks", "use_ring_of_experts",
                      "te_moe_block")


@dataclasses.dataclass(frozen=True)
class MaxtextKeys:
  """The maxtext keys the integration reads that a config may lack (older maxtext, a test's namespace), each with
  the value maxtext's own default means; read once per config object, so a hook called every step looks nothing up
  twice. `quantization` decides whether anything of the plugin's runs at all; the rest are model, layout and data
  facts the config-load checks and the shapes read."""

  quantization: str | None = None
  first_num_dense_layers: int = 0
  load_parameters_path: str = ""
  load_full_state_path: str = ""
  num_target_devices: int = 1
  num_slices: int = 1
  using_pipeline_parallelism: bool = False
  gradient_accumulation_steps: int = 1
  logical_axis_rules: tuple = ()
  eval_interval: int = -1
  per_device_batch_size: Any = None
  eval_per_device_batch_size: Any = None
  fused_mlp: bool = False
  fused_qkv: bool = False
  attention_type: str = ""
  attention: str = ""
  num_experts: int = 1
  emb_dim: int = 0
  moe_mlp_dim: int = 0
  te_comm_gemm_overlap: str = "disabled"
  context_parallel_strategy: str = ""
  context_parallel_load_balance: bool = False
  packing: bool = False
  dataset_type: str = ""
  #: ici x dcn parallelism of the mesh axes in _MLP_PARALLELISM (-1 stays negative: the rest of the devices).
  mlp_parallelism: tuple[int, ...] = ()
  #: EXPERT_LAYOUT_KEYS as the config gives them.
  expert_layout: tuple[tuple[str, Any], ...] = ()


_KEYS_CACHE: weakref.WeakKeyDictionary[Any, MaxtextKeys] = weakref.WeakKeyDictionary()


def _plain(value: Any, default: Any) -> Any:
  """A key's value as the type of its default: unset (None) or empty is the default, as maxtext's `x or default`."""
  if isinstance(default, bool):
    return bool(value)
  if isinstance(default, int):
    return int(value or default)
  if isinstance(default, tuple):
    return tuple(value or ())
  if isinstance(default, str) and not value:
    return default
  return default if value is None else value


def _read(config: Any) -> MaxtextKeys:
  defaults = MaxtextKeys()
  values = {f.name: _plain(getattr(config, f.name, None), getattr(defaults, f.name))
            for f in dataclasses.fields(MaxtextKeys) if f.name not in ("mlp_parallelism", "expert_layout")}
  parallelism = tuple(int(getattr(config, f"ici_{axis}_parallelism", 1) or 1)
                      * int(getattr(config, f"dcn_{axis}_parallelism", 1) or 1) for axis in _MLP_PARALLELISM)
  layout = tuple((key, getattr(config, key, None)) for key in EXPERT_LAYOUT_KEYS)
  return MaxtextKeys(**values, mlp_parallelism=parallelism, expert_layout=layout)


def maxtext_keys(config: Any) -> MaxtextKeys:
  """The MaxtextKeys of `config`, read once per config object (a config that cannot be cached is read each time)."""
  try:
    return _KEYS_CACHE[config]
  except (KeyError, TypeError):
    pass
  keys = _read(config)
  try:
    _KEYS_CACHE[config] = keys
  except TypeError:
    pass
  return keys
