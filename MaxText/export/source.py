# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The run's config, as MaxText.train loads it, and its checkpoint: the run's own latest
(`base_output_directory`/`run_name`/checkpoints/N), else `load_parameters_path=`, read with maxtext's conversion
reader (parameters only)."""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Sequence
from typing import Any

from MaxText.export import PROG
from MaxText.export.mapping import ExportError
from MaxText.integration import loading
from MaxText.integration.run_keys import run_keys

__all__ = ["Checkpoint", "load_config", "find_checkpoint", "reader_config", "read_parameters"]


def load_config(config_path: str, overrides: Sequence[str]) -> Any:
  """The run's config as MaxText.train loads it (MaxText.integration.loading: the one loader of our tools)."""
  return loading.load_config(config_path, overrides, prog=PROG)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """Where the parameters come from: an orbax item directory and the training step it holds (None: not known)."""

  path: pathlib.Path
  step: int | None
  source: str  # "load_parameters_path" or "the run's latest checkpoint"


_STEP = re.compile(r"(?:^|/)(\d+)(?:/items)?/?$")


def find_checkpoint(config: Any) -> Checkpoint:
  """The checkpoint to export, in maxtext's own order of loading: the newest step under the run's checkpoint
  directory (<base_output_directory>/<run_name>/checkpoints/<step>/items) when it has one, else
  `load_parameters_path`.

  Why that order: a run that started from `load_parameters_path` (a fine-tune) saves its own checkpoints, and maxtext
  resumes those, not the path it started from; the export of such a run, with the same command line, is the fine-tuned
  model."""
  keys = run_keys(config)
  root = pathlib.Path(keys.base_output_directory) / keys.run_name / "checkpoints"
  steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []
  steps = [s for s in steps if (root / str(s) / "items").is_dir()]
  if steps:
    return Checkpoint(root / str(steps[-1]) / "items", steps[-1], "the run's latest checkpoint")
  if keys.load_parameters_path:
    path = pathlib.Path(keys.load_parameters_path)
    if not path.exists():
      raise ExportError(f"load_parameters_path={path}: no such checkpoint")
    step = _STEP.search(str(path))
    return Checkpoint(path, int(step.group(1)) if step else None, "load_parameters_path")
  raise ExportError(f"no checkpoint found: {root} holds no <step>/items (set load_parameters_path=, or "
                    "base_output_directory= and run_name= of a run that saved one)")


@dataclasses.dataclass(frozen=True)
class _ReaderConfig:
  """The keys maxtext's reader (`load_orbax_checkpoint`) takes from a config, with the path to read."""

  load_parameters_path: str
  checkpoint_storage_concurrent_gb: int
  checkpoint_storage_use_ocdbt: bool
  checkpoint_storage_use_zarr3: bool
  weight_dtype: Any
  lora: Any


@dataclasses.dataclass(frozen=True)
class _NoLora:
  lora_restore_path: str = ""


def reader_config(config: Any, checkpoint: Checkpoint) -> Any:
  """What maxtext's reader (`load_orbax_checkpoint`) takes from a config, pointed at `checkpoint` (the run's config
  may name no load_parameters_path: the checkpoint was found in the run's directory)."""
  keys = run_keys(config)
  return _ReaderConfig(str(checkpoint.path), keys.checkpoint_storage_concurrent_gb, keys.checkpoint_storage_use_ocdbt,
                       keys.checkpoint_storage_use_zarr3, keys.weight_dtype, _NoLora())


def read_parameters(config: Any, checkpoint: Checkpoint) -> dict[str, Any]:
  """The checkpoint's parameters as maxtext's conversion names them (`params-decoder-...`), in weight_dtype:
  maxtext's reader restores `params` only (not the optimizer state) onto one device."""
  # pylint: disable-next=import-outside-toplevel  # import cost: maxtext, transformers and tqdm load when exporting
  from maxtext.checkpoint_conversion.utils.utils import detect_and_extract_checkpoint, load_orbax_checkpoint
  return detect_and_extract_checkpoint(load_orbax_checkpoint(reader_config(config, checkpoint)))
