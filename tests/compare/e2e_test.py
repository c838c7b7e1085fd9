# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""End to end: two tiny real runs on the local corpus (no quantization vs maxtext's fp8), then the comparison CLI.

The runs are forked from the suite's warm process (helpers.train_cli): what is checked is the comparison CLI, in a
process of its own; the training CLI's own behaviour in a new interpreter is train_test.py's."""

import pathlib
import subprocess
import sys

import pytest

from MaxText.compare.report import read_report
from MaxText.compare.schema import MetricsSource, Status
from MaxText.data import corpus
from tests.helpers import train_cli

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 8


@pytest.mark.slow
def test_compare_two_tiny_runs(jax_cache_dir, tmp_path):
  corpus_dir = tmp_path / "corpus"
  corpus.build_corpus(corpus_dir)
  base_dir = tmp_path / "runs"
  for name, quantization in (("bf16", ""), ("fp8", "fp8")):
    (base_dir / name).mkdir(parents=True)  # maxtext does not create metrics_file's folder
    result = train_cli(
        [
            f"run_name={name}",
            f"base_output_directory={base_dir}",
            f"steps={STEPS}",
            f"quantization={quantization}",
            f"metrics_file={base_dir / name / 'metrics.jsonl'}",
            *corpus.corpus_overrides(corpus_dir),
        ],
        jax_cache_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
  out = tmp_path / "report"
  proc = subprocess.run(
      [sys.executable, "-m", "MaxText.compare", str(base_dir / "bf16"), str(base_dir / "fp8"), "--baseline", "bf16",
       "--out", str(out), "--smooth", "3"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
  )
  assert proc.returncode == 0, proc.stderr
  assert "| bf16 | baseline" in proc.stdout and "| fp8 | ok |" in proc.stdout
  report = read_report(out / "report.json")
  assert [r.name for r in report.runs] == ["bf16", "fp8"]
  assert all(r.source is MetricsSource.JSONL and r.num_steps == STEPS for r in report.runs)
  (c,) = report.comparisons
  assert c.status is Status.OK and c.common_steps == STEPS
  assert c.loss_gap is not None and abs(c.loss_gap.mean_nats) < 1.0  # same data, same schedule: close curves
  assert c.step_time_ratio is not None and c.step_time_ratio > 0
  # maxtext wrote hardware=cpu into the TensorBoard config: a CPU step-time ratio is never called a speedup.
  assert {r.hardware for r in report.runs} == {"cpu"} and {r.quantization for r in report.runs} == {"", "fp8"}
  assert c.speedup is None and "ran on CPU" in c.speedup_withheld
  # The bf16 run has no quant object and fp8 has one, and any quant object changes maxtext's parameter init (an rng
  # fork per DenseGeneral), so step-0 losses need not agree here; the field must still be filled in.
  assert c.step0.abs_diff is not None and c.step0.within_tolerance is not None
  for png in ("loss.png", "throughput.png"):
    assert (out / png).stat().st_size > 10_000
