# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The export directory, written so that an interrupted export leaves nothing that looks complete: everything goes
to a hidden sibling directory, renamed to the destination only once the last file is closed.

Weights are written one safetensors shard per converted piece (a parameter, or one layer or expert of a stacked one:
MaxText.export.mapping.converted) as soon as it is converted, with Hugging Face's shard index beside them."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from MaxText.export.mapping import ExportError

__all__ = ["ExportDir", "check_destination", "INDEX_FILE"]

INDEX_FILE = "model.safetensors.index.json"


def check_destination(out: pathlib.Path, force: bool) -> None:
  """Refuses a destination that is a file, or a non-empty directory without --force (before anything is read)."""
  if out.exists() and not out.is_dir():
    raise ExportError(f"--out {out}: exists and is not a directory")
  if out.is_dir() and any(out.iterdir()) and not force:
    raise ExportError(f"--out {out}: directory is not empty (pass --force to replace it)")


def _sha256(path: pathlib.Path) -> str:
  digest = hashlib.sha256()
  with path.open("rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


class ExportDir:
  """A context manager: the files of one export, in a temporary sibling of `out` until `__exit__` succeeds."""

  def __init__(self, out: pathlib.Path, force: bool, shards: int) -> None:
    self.out, self.force, self.shards = out, force, shards
    self.tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    self.weight_map: dict[str, str] = {}
    self.total_size = 0
    self._next = 0

  def __enter__(self) -> "ExportDir":
    self.out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(self.tmp, ignore_errors=True)
    self.tmp.mkdir()
    return self

  def write_shard(self, tensors: dict[str, np.ndarray]) -> None:
    """One shard of weights (safetensors, pt metadata as transformers expects), named as Hugging Face names them."""
    self._next += 1
    name = f"model-{self._next:05d}-of-{self.shards:05d}.safetensors"
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    save_file(tensors, str(self.tmp / name), metadata={"format": "pt"})
    for key, value in tensors.items():
      if key in self.weight_map:
        raise ExportError(f"tensor {key} written twice (two checkpoint parameters map to it)")
      self.weight_map[key] = name
      self.total_size += value.nbytes

  def write_json(self, name: str, content: Any) -> None:
    (self.tmp / name).write_text(json.dumps(content, indent=2, sort_keys=False) + "\n", encoding="utf-8")

  def copy_in(self, source: pathlib.Path) -> list[str]:
    """Copies a file, or a directory's files, into the export; returns the names copied."""
    files = [source] if source.is_file() else sorted(p for p in source.iterdir() if p.is_file())
    for f in files:
      shutil.copy2(f, self.tmp / f.name)
    return [f.name for f in files]

  def write_index(self) -> None:
    """Hugging Face's shard index: which file holds each tensor."""
    self.write_json(INDEX_FILE, {"metadata": {"total_size": self.total_size},
                                 "weight_map": dict(sorted(self.weight_map.items()))})

  def checksums(self) -> dict[str, str]:
    """sha256 of every file written so far (the metadata file lists them)."""
    return {p.name: _sha256(p) for p in sorted(self.tmp.iterdir()) if p.is_file()}

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is not None:
      shutil.rmtree(self.tmp, ignore_errors=True)
      return
    if self.out.exists():
      shutil.rmtree(self.out)  # check_destination allowed it: empty, or --force
    self.tmp.rename(self.out)
