# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Hand-made metrics files in maxtext's metrics_file format, for the comparison tests."""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from MaxText.compare.metrics import RunMetrics, read_jsonl


def maxtext_record(step: int, loss: float, step_time: float = 1.0, lr: float | None = 1e-3, run_name: str = "r") -> dict:
  """One training line as maxtext's MetricLogger writes it (the keys the comparison reads, plus some it ignores)."""
  record = {
      "learning/grad_norm": 1.0,
      "learning/loss": loss,
      "learning/total_weights": 512.0,
      "perf/step_time_seconds": step_time,
      "perf/per_device_tflops": 1.0,
      "perf/per_device_tflops_per_sec": 1.0 / step_time,
      "perf/per_device_tokens": 512.0,
      "perf/per_device_tokens_per_sec": 512.0 / step_time,
      "step": float(step),
      "run_name": run_name,
  }
  if lr is not None:
    record["learning/current_learning_rate"] = lr
  return record


def write_lines(path: pathlib.Path, records: Sequence[dict]) -> pathlib.Path:
  """json.dumps writes NaN/Infinity literals for non-finite floats, exactly like maxtext does."""
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
  return path


@pytest.fixture()
def make_run(tmp_path: pathlib.Path) -> Callable[..., RunMetrics]:
  """Returns `make(name, losses, steps=None, step_times=None, lrs=None) -> RunMetrics`, via a real JSONL file.

  `lrs=None` writes a learning-rate column that is flat (no warm-up); pass `lrs=False` to omit the column.
  """

  def make(name, losses, steps=None, step_times=None, lrs=None) -> RunMetrics:
    steps = list(range(len(losses))) if steps is None else list(steps)
    step_times = [1.0] * len(losses) if step_times is None else list(step_times)
    if lrs is None:
      lrs = [1e-3] * len(losses)
    records = [
        maxtext_record(s, float(loss), t, None if lrs is False else float(lrs[i]), name)
        for i, (s, loss, t) in enumerate(zip(steps, losses, step_times))
    ]
    return read_jsonl(write_lines(tmp_path / name / "metrics.jsonl", records))

  return make


def warmup_cosine(n: int, warmup: int, peak: float = 1e-3) -> list[float]:
  """maxtext-like schedule: linear warm-up to `peak` at step `warmup`, then cosine decay."""
  out = []
  for s in range(n):
    if s < warmup:
      out.append(peak * (s + 1) / (warmup + 1))
    else:
      out.append(peak * 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, n - warmup))))
  return out


def decaying_loss(n: int, start: float = 10.0, end: float = 4.0) -> np.ndarray:
  return end + (start - end) * np.exp(-np.arange(n) / (n / 5))


@pytest.fixture(name="warmup_cosine")
def _warmup_cosine_fixture():
  return warmup_cosine


@pytest.fixture(name="decaying_loss")
def _decaying_loss_fixture():
  return decaying_loss


@pytest.fixture(name="jsonl_writer")
def _jsonl_writer_fixture():
  """(write_lines, maxtext_record): for tests that need odd files (torn lines, eval records, duplicates)."""
  return write_lines, maxtext_record
