# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""`make quickstart`'s machinery: progress parsing, the corpus check, arguments, and a `--smoke` run end to end."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from MaxText import quickstart, study
from MaxText.data import corpus
from tests.helpers import REPO_ROOT

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
  progress = study.RunProgress(name="fp8", total_steps=13, emit=lines.append)
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


def test_progress_prints_at_least_every_progress_seconds_on_a_slow_machine():
  now = [0.0]
  lines: list[str] = []
  progress = study.RunProgress(name="bf16", total_steps=301, emit=lines.append, clock=lambda: now[0])
  for step in range(1, 10):  # every = 50: no step-count line before step 50
    now[0] += study.PROGRESS_SECONDS / 2 + 0.01  # a slow machine: a new line every second step
    progress.feed(_TRAIN.format(step=step, loss=5.0))
  assert [line.split("(")[0].split()[-1] for line in lines] == ["2", "4", "6", "8"]
  assert "mean of the last 2:" in lines[1]


def test_progress_reads_a_nan_loss():
  progress = study.RunProgress(name="x", total_steps=2, emit=lambda _: None)
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
  assert [study.format_seconds(s) for s in (4.4, 59.6, 75.2, 3600)] == ["4s", "1m00s", "1m15s", "60m00s"]


def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys):
  assert quickstart.main(["--steps", "0", "--out", str(tmp_path)]) == 2
  assert capsys.readouterr().err.strip() == "error: --steps must be >= 1, got 0"
  assert quickstart.main(["--config", str(tmp_path / "nope.yml")]) == 2
  assert "does not exist" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    quickstart.main(["--precisions", "int8"])


def test_set_changes_the_candidates_and_set_baseline_the_baseline():
  args = quickstart._parse_args(  # pylint: disable=protected-access
      ["--set", "nvfp4_attention_precision=fp8", "--set-baseline", "remat_policy=full",
       "--set-all", "learning_rate=1e-3"]  # fmt: skip
  )
  by_name = {p.name: quickstart.run_overrides(p, args) for p in study.PRECISIONS}
  assert by_name["bf16"] == ["learning_rate=1e-3", "remat_policy=full"]
  for name in ("fp8", "te_nvfp4", "te_nvfp4_no_rht"):
    assert by_name[name] == ["learning_rate=1e-3", "nvfp4_attention_precision=fp8"]


def test_a_users_key_replaces_the_precisions_own():
  """The NVFP4 runs log statistics every STATS_INTERVAL steps; `--set nvfp4_stats_interval=5` replaces that (maxtext
  refuses a key given twice), and keys the user does not set stay."""
  (nvfp4,) = [p for p in study.PRECISIONS if p.name == "te_nvfp4"]
  assert f"nvfp4_stats_interval={study.STATS_INTERVAL}" in nvfp4.overrides
  not_overridden = quickstart.not_overridden  # integration.cli's, as the quickstart uses it
  assert not_overridden(nvfp4.overrides, ["nvfp4_stats_interval=5"]) == ["quantization=te_nvfp4"]
  assert not_overridden(nvfp4.overrides, ["learning_rate=1e-3"]) == list(nvfp4.overrides)


def test_study_is_six_precisions_over_three_seeds_named_for_compare():
  """`make study`: every precision once per seed, seed by seed with the baseline first (compare's --baseline is the
  first run), named NAME@SEED with both seeds set; results/study unless --out."""
  args = quickstart._parse_args(["--study"])  # pylint: disable=protected-access
  runs = quickstart.planned_runs(args)
  assert [r.name for r in runs[:6]] == [f"{n}@0" for n in study.STUDY_NAMES] and len(runs) == 18
  assert runs[0].name == "bf16@0" and [r.name for r in runs[6:8]] == ["bf16@1", "fp8@1"]
  assert runs[7].seed_overrides() == ("data_shuffle_seed=1", "init_weights_seed=1")
  assert quickstart.output_dir(args) == quickstart.STUDY_OUT
  assert quickstart.config_path(args) == quickstart.DEFAULT_CONFIG
  plain = quickstart.planned_runs(quickstart._parse_args([]))  # pylint: disable=protected-access
  assert [r.name for r in plain] == list(study.PRECISION_NAMES) and plain[0].seed_overrides() == ()
  seeded = quickstart._parse_args(["--seeds", "7", "--precisions", "te_nvfp4"])  # pylint: disable=protected-access
  assert [r.name for r in quickstart.planned_runs(seeded)] == ["bf16@7", "te_nvfp4@7"]
  gpu = quickstart._parse_args(["--study", "--device", "gpu"])  # pylint: disable=protected-access
  assert quickstart.config_path(gpu) == quickstart.GPU_CONFIG and quickstart.DEVICE_OVERRIDES["gpu"] == ("hardware=gpu",)


def test_late_switch_step_scales_with_the_run():
  (late,) = [p for p in study.STUDY_PRECISIONS if p.name == "te_nvfp4_late_fwd"]
  assert late.overrides_for(451)[-1] == "nvfp4_bf16_forward_from_step=361"  # 80% of the steps
  assert late.overrides_for(4)[-1] == "nvfp4_bf16_forward_from_step=3" and late.overrides_for(2)[-1].endswith("=1")
  (plain,) = [p for p in study.STUDY_PRECISIONS if p.name == "te_nvfp4"]
  assert plain.overrides_for(451) == plain.overrides


def test_the_attention_study_names_its_five_precisions():
  """`make study-attention`'s runs: bf16 first, then fp8, the MLP-only recipe and the two attention precisions, per
  seed; the attention runs set the key their name says."""
  args = quickstart._parse_args(["--study", "--precisions", *study.ATTENTION_STUDY_NAMES])  # pylint: disable=protected-access
  runs = quickstart.planned_runs(args)
  assert [r.name for r in runs[:5]] == [f"{n}@0" for n in study.ATTENTION_STUDY_NAMES] and len(runs) == 15
  keys = {p.name: p.overrides for p in study.ATTENTION_PRECISIONS}
  assert "nvfp4_attention_precision=nvfp4" in keys["te_nvfp4_all"]
  assert "nvfp4_attention_precision=fp8" in keys["te_nvfp4_fp8attn"]


@pytest.mark.parametrize("precision", study.ALL_PRECISIONS, ids=lambda p: p.name)
def test_every_study_precision_loads_with_the_quickstart_config(load_config, precision):
  """Each precision's keys are real plugin/maxtext keys with valid values for the quickstart model (4 layers)."""
  config = load_config(quickstart.DEFAULT_CONFIG, "vocab_size=1024", *precision.overrides_for(451))
  assert config.steps == 451


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seeds", "1", "1"], "names a seed twice"),
        (["--study", "--smoke"], "--smoke checks the machinery on one seed"),
    ],
)
def test_bad_study_arguments_exit_2(capsys, argv, message):
  assert quickstart.main(argv) == 2
  assert message in capsys.readouterr().err


def test_smoke_writes_to_its_own_folder(tmp_path):
  parse = quickstart._parse_args  # pylint: disable=protected-access
  assert quickstart.output_dir(parse([])) == quickstart.DEFAULT_OUT
  assert quickstart.output_dir(parse(["--smoke"])) == pathlib.Path("results/quickstart-smoke")
  assert quickstart.output_dir(parse(["--smoke", "--out", str(tmp_path / "x")])) == tmp_path / "x-smoke"


def test_rerun_clears_stale_run_folders_and_report_files(tmp_path):
  for name in ("bf16", "fp8", "te_nvfp4_no_rht"):
    (tmp_path / "runs" / name).mkdir(parents=True)
    (tmp_path / "runs" / name / "metrics.jsonl").write_text("{}\n", encoding="utf-8")
  (tmp_path / "jax_cache").mkdir()
  for name in ("report.md", "report.json", "loss.png", "throughput.png", "notes.txt"):
    (tmp_path / name).write_text("old", encoding="utf-8")
  assert quickstart.clear_stale(tmp_path, ["bf16", "te_nvfp4"]) == ["fp8", "te_nvfp4_no_rht"]
  assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["bf16"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["jax_cache", "notes.txt", "runs"]
  assert quickstart.clear_stale(tmp_path / "fresh", ["bf16"]) == []  # nothing there yet


def test_the_config_sets_what_the_progress_lines_need():
  assert quickstart._config_steps(quickstart.DEFAULT_CONFIG) > 100  # pylint: disable=protected-access


def test_suite_names_each_slow_test_as_it_starts(tmp_path):
  """tests/conftest.py prints `[test i/n, t min in] slow, running: <nodeid>` before a slow test's fixtures run."""
  shutil.copy(REPO_ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
  (tmp_path / "tests").mkdir()  # conftest's fixtures import tests.helpers
  shutil.copy(REPO_ROOT / "tests" / "helpers.py", tmp_path / "tests" / "helpers.py")
  (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: x\n", encoding="utf-8")
  (tmp_path / "test_x.py").write_text(
      "import pytest\n\ndef test_fast():\n  pass\n\n@pytest.mark.slow\ndef test_slow():\n  pass\n", encoding="utf-8"
  )
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"),
       str(tmp_path / "test_x.py")],
      cwd=tmp_path, env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")},
                         "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=120, check=False,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "[test 2/2, " in proc.stdout and "min in] slow, running: test_x.py::test_slow" in proc.stdout
  assert "test_fast" not in proc.stdout
