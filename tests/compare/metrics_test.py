# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Reading runs: maxtext's metrics_file JSONL, the TensorBoard fallback, run-dir discovery and clear errors."""

import math

import numpy as np
import pytest

from MaxText.compare.metrics import load_run, read_jsonl
from MaxText.compare.schema import MetricsSource


def _eval_records(step):
  running = {"eval/avg_loss": 9.0, "eval/step_time_seconds": 0.1, "step": 0.0, "run_name": "r"}
  final = {"eval/total_loss": 100.0, "eval/avg_loss": 8.5, "eval/total_weights": 10.0, "step": float(step), "run_name": "r"}
  return running, final


def test_jsonl_train_and_eval_records(tmp_path, jsonl_writer):
  write, rec = jsonl_writer
  running, final = _eval_records(2)
  path = write(tmp_path / "m.jsonl", [rec(0, 10.0), rec(1, 9.0), running, rec(2, 8.0), final])
  run = read_jsonl(path)
  assert run.name == "r"  # the run_name field
  assert run.source is MetricsSource.JSONL
  np.testing.assert_array_equal(run.steps, [0, 1, 2])
  np.testing.assert_allclose(run.loss, [10.0, 9.0, 8.0])
  np.testing.assert_array_equal(run.eval_steps, [2])  # running-eval records are not final evals
  np.testing.assert_allclose(run.eval_loss, [8.5])


def test_jsonl_nan_literals_torn_line_and_duplicate_steps(tmp_path, jsonl_writer):
  write, rec = jsonl_writer
  path = write(tmp_path / "m.jsonl", [rec(0, 10.0), rec(1, 9.0), rec(1, 7.0), rec(2, math.nan), rec(3, math.inf)])
  with path.open("a") as f:
    f.write('{"learning/loss": 1.0, "st')  # the run was killed mid-write
  run = read_jsonl(path)
  assert "NaN" in path.read_text() and "Infinity" in path.read_text()
  np.testing.assert_array_equal(run.steps, [0, 1, 2, 3])
  assert run.loss[1] == 7.0  # a resumed run re-logs a step: the last record wins
  assert math.isnan(run.loss[2]) and math.isinf(run.loss[3])
  assert run.skipped_lines == 1


def test_missing_perf_keys_are_nan(tmp_path):
  path = tmp_path / "m.jsonl"
  path.write_text('{"learning/loss": 3.0, "step": 0}\n')
  run = read_jsonl(path)
  assert math.isnan(run.step_time[0]) and math.isnan(run.learning_rate[0])


def test_run_dir_uses_its_basename_and_metrics_jsonl(tmp_path, jsonl_writer):
  write, rec = jsonl_writer
  write(tmp_path / "fp8_run" / "metrics.jsonl", [rec(0, 10.0), rec(1, 9.0)])
  write(tmp_path / "fp8_run" / "other" / "notes.jsonl", [rec(0, 1.0)])
  run = load_run(tmp_path / "fp8_run")
  assert run.name == "fp8_run" and run.path.endswith("metrics.jsonl")
  assert load_run(tmp_path / "fp8_run", name="explicit").name == "explicit"


def _write_events(run_dir, losses, name="r"):
  from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel

  writer = SummaryWriter(str(run_dir / "tensorboard" / name))
  for step, loss in enumerate(losses):
    writer.add_scalar("learning/loss", np.array(loss), step)
    writer.add_scalar("perf/step_time_seconds", np.array(0.5), step)
    writer.add_scalar("learning/current_learning_rate", np.array(1e-3), step)
  writer.add_scalar("eval/avg_loss", np.array(4.0), len(losses) - 1)
  writer.close()


def test_tensorboard_fallback_without_jsonl(tmp_path):
  _write_events(tmp_path / "bf16", [5.0, 4.0, 3.0])
  run = load_run(tmp_path / "bf16")
  assert run.source is MetricsSource.TENSORBOARD and run.name == "bf16"
  np.testing.assert_allclose(run.loss, [5.0, 4.0, 3.0])
  np.testing.assert_allclose(run.step_time, [0.5] * 3)
  np.testing.assert_array_equal(run.eval_steps, [2])


def test_tensorboard_wins_over_truncated_jsonl(tmp_path, jsonl_writer):
  """maxtext truncates metrics_file at every step-0 record (running eval included): TB then has more steps."""
  write, rec = jsonl_writer
  _write_events(tmp_path / "run", [5.0, 4.0, 3.0, 2.0])
  write(tmp_path / "run" / "metrics.jsonl", [rec(3, 2.0)])
  assert load_run(tmp_path / "run").source is MetricsSource.TENSORBOARD
  write(tmp_path / "run" / "metrics.jsonl", [rec(s, 6.0 - s) for s in range(4)])
  assert load_run(tmp_path / "run").source is MetricsSource.JSONL  # a tie goes to the exact record


@pytest.mark.parametrize(
    "layout, message",
    [("missing", "does not exist"), ("empty", "has no metrics"), ("eval_only", "no training records")],
)
def test_clear_errors(tmp_path, layout, message):
  target = tmp_path / "run"
  if layout != "missing":
    target.mkdir()
  if layout == "eval_only":
    (target / "metrics.jsonl").write_text('{"eval/avg_loss": 3.0, "eval/total_loss": 1.0, "step": 0}\n')
  with pytest.raises(ValueError, match=message):
    load_run(target)


def test_ambiguous_jsonl_files_are_an_error(tmp_path, jsonl_writer):
  write, rec = jsonl_writer
  write(tmp_path / "run" / "a.jsonl", [rec(0, 1.0)])
  write(tmp_path / "run" / "b.jsonl", [rec(0, 1.0)])
  with pytest.raises(ValueError, match="several JSONL"):
    load_run(tmp_path / "run")
