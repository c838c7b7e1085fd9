# Copyright 2026 The MaxText NVFP4 plugin authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#    https://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""`make quickstart`'s machinery: progress parsing, the corpus check, arguments, and a `--smoke` run end to end."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from MaxText import quickstart
from MaxText.compare.report import read_report
from MaxText.compare.schema import MetricsSource, Status
from MaxText.data import corpus
from tests.conftest import REPO_ROOT

# Two lines as maxtext 0.2.5's metric_logger writes them (absl prefix included).
_TRAIN = (
    "I1121 05:45:44.817718 140198661168000 metric_logger.py:265] completed step: {step}, seconds: 0.250, "
    "TFLOP/s/device: 0.022, Tokens/s/device: 1700.093, total_weights: 252, loss: {loss}, lm_loss: {loss}, "
    "perplexity: 22450.084"
)
_EVAL = (
    "I1121 05:48:08.297864 140051736398720 metric_logger.py:302] Completed eval after train step 75, loss=7.480, "
    "perplexity=62411.533, total_weights=504.0, avg_z_loss=0.000"
)


def test_progress_prints_stretch_means_the_last_step_and_evals():
  lines: list[str] = []
  progress = quickstart.RunProgress(name="fp8", total_steps=13, emit=lines.append)
  assert progress.every == 2  # (13 - 1) // PROGRESS_LINES
  for step in range(13):
    progress.feed(_TRAIN.format(step=step, loss=float(10 - step)))
    if step == 5:
      progress.feed(_EVAL)
  progress.feed("I1121 unrelated line, loss: 3.0")
  train_lines = [line for line in lines if "train loss" in line]
  assert len(train_lines) == 6  # steps 2, 4, ..., 12 (the last)
  assert "step    2" in train_lines[0] and "mean of the last 3:  9.000" in train_lines[0]  # steps 0-2
  assert "step   12" in train_lines[-1] and "(100%)" in train_lines[-1] and "0.25 s/step" in train_lines[-1]
  assert any("eval after step 75: loss 7.480" in line for line in lines)
  assert (progress.last_step, progress.last_loss, progress.last_eval) == (12, -2.0, 7.48)


def test_progress_reads_a_nan_loss():
  progress = quickstart.RunProgress(name="x", total_steps=2, emit=lambda _: None)
  progress.feed(_TRAIN.format(step=1, loss="nan"))
  assert progress.last_step == 1 and progress.last_loss != progress.last_loss


def test_corpus_check_accepts_only_an_intact_build(tmp_path):
  assert not quickstart.corpus_is_built(tmp_path / "missing")
  lib = tmp_path / "lib"
  (lib / "pkg").mkdir(parents=True)
  for i in range(40):
    (lib / "pkg" / f"m{i}.py").write_text(f"x_{i} = {i}\n", encoding="utf-8")
  out = tmp_path / "corpus"
  corpus.build_corpus(out, root=lib, eval_fraction=0.3)
  assert quickstart.corpus_is_built(out)
  (out / "eval.parquet").write_bytes(b"truncated")
  assert not quickstart.corpus_is_built(out)
  (out / corpus.MANIFEST_NAME).write_text("{not json", encoding="utf-8")
  assert not quickstart.corpus_is_built(out)


def test_format_seconds():
  assert [quickstart.format_seconds(s) for s in (4.4, 59.6, 75.2, 3600)] == ["4s", "1m00s", "1m15s", "60m00s"]


def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys):
  assert quickstart.main(["--steps", "0", "--out", str(tmp_path)]) == 2
  assert capsys.readouterr().err.strip() == "error: --steps must be >= 1, got 0"
  assert quickstart.main(["--config", str(tmp_path / "nope.yml")]) == 2
  assert "does not exist" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    quickstart.main(["--precisions", "int8"])


def test_the_config_sets_what_the_progress_lines_need():
  assert quickstart._config_steps(quickstart.DEFAULT_CONFIG) > 100  # pylint: disable=protected-access


@pytest.mark.slow
def test_smoke_run_writes_the_report(tmp_path):
  """`scripts/quickstart.py --smoke`: two precisions, 4 steps with evals, then the comparison (about 30 s)."""
  out = tmp_path / "out"
  proc = subprocess.run(
      [sys.executable, "scripts/quickstart.py", "--smoke", "--out", str(out), "--corpus", str(tmp_path / "corpus")],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  text = proc.stdout
  assert "quickstart: built the corpus" in text
  for i, name in enumerate(quickstart.SMOKE_PRECISIONS, 1):
    assert f"quickstart: [{i}/2] {name}: " in text and f"quickstart: [{i}/2] {name} finished in " in text
  assert "train loss" in text and "eval after step 2" in text
  assert "| bf16 | baseline | 4 |" in text and "| te_nvfp4 | ok | 4 |" in text
  for name in ("report.json", "report.md", "loss.png", "throughput.png"):
    assert (out / name).stat().st_size > 0, name
  assert "| te_nvfp4 | ok | 4 |" in (out / "report.md").read_text(encoding="utf-8")
  report = read_report(out / "report.json")
  assert report.baseline == "bf16" and [r.name for r in report.runs] == ["bf16", "te_nvfp4"]
  # The runs evaluate, so maxtext truncated metrics.jsonl; every training step still comes from TensorBoard.
  assert all(r.source is MetricsSource.TENSORBOARD and r.num_steps == 4 for r in report.runs)
  (c,) = report.comparisons
  assert c.status is Status.OK and c.common_steps == 4
  assert c.step0.within_tolerance  # same initial weights: the bf16 baseline keeps a quant object
  assert json.loads((out / "report.json").read_text(encoding="utf-8"))["comparisons"][0]["final_eval_step"] == 2
  assert (out / "runs" / "te_nvfp4" / "train.log").read_text(encoding="utf-8").count("completed step:") == 4
