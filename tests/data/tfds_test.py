# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The cluster recipes' data wiring: maxtext's TFDS pipeline reading a tiny `c4/en:3.0.1` built here.

Why: the recipes (configs/recipes/*.yml) read C4 through `dataset_type=tfds`, like the published runs, and C4 itself
is far too large to have here. This test builds a few hundred documents in the layout and under the name and version
the recipes ask for (`<data_dir>/c4/en/3.0.1/`, features text/timestamp/url like C4's `en` config), then trains the
tiny model for 3 steps through maxtext's own TFDS input pipeline with the recipes' data keys, evaluation included.

TensorFlow comes from `.venv/tfds-site` (requirements-tfds.txt, installed there by setup.sh), put on PYTHONPATH of
the subprocesses only: maxtext's trainer imports TensorFlow whenever it can, which would slow every other run. This
file is also the builder script: `python tests/data/tfds_test.py DATA_DIR` (run with that PYTHONPATH) writes the set.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TFDS_SITE = REPO_ROOT / ".venv" / "tfds-site"
RECIPE = REPO_ROOT / "configs" / "recipes" / "llama3_8b_fp8.yml"
#: The recipe keys that choose the data; the test passes the recipe's own values, so a change there is tested here.
RECIPE_DATA_KEYS = ("dataset_type", "dataset_name", "eval_dataset_name", "train_split", "eval_split")
NUM_DOCS = {"train": 256, "validation": 32}


def _tensorflow_pythonpath() -> str | None:
  """PYTHONPATH that makes TensorFlow importable for a subprocess, or None when there is none."""
  if (TFDS_SITE / "tensorflow").is_dir() and (TFDS_SITE / "tensorflow_datasets").is_dir():
    return os.pathsep.join(p for p in (str(TFDS_SITE), os.environ.get("PYTHONPATH", "")) if p)
  if importlib.util.find_spec("tensorflow") and importlib.util.find_spec("tensorflow_datasets"):
    return os.environ.get("PYTHONPATH", "")  # e.g. a ./setup.sh --gpu venv, which has them in site-packages
  return None


def _documents(split: str) -> list[str]:
  """Real English prose, deterministic and offline: paragraphs of the stdlib's module docstrings, cycled."""
  import pydoc  # pylint: disable=import-outside-toplevel

  paragraphs = []
  for name in ("argparse", "collections", "datetime", "json", "logging", "pathlib", "re", "subprocess", "typing"):
    doc = pydoc.getdoc(__import__(name))
    paragraphs += [p.replace("\n", " ") for p in doc.split("\n\n") if len(p) > 40]
  offset = 0 if split == "train" else len(paragraphs) // 2
  return [paragraphs[(offset + i) % len(paragraphs)] for i in range(NUM_DOCS[split])]


def build_tiny_c4(data_dir: str) -> None:
  """Writes `c4/en:3.0.1` (splits train and validation) into `data_dir` with a tfds GeneratorBasedBuilder.

  `skip_registration`: tfds already registers its own C4 builder (code version 3.1.0, built with Beam). maxtext's
  `tfds.builder("c4/en:3.0.1", data_dir=...)` then finds 3.0.1 on disk and reads it from its dataset_info.json, the
  way tfds reads any generated version other than the code's.
  """
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  class C4(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A few hundred documents shaped like C4's `en` config."""

    VERSION = tfds.core.Version("3.0.1")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="en")]

    def _info(self):
      # DatasetInfo itself, not dataset_info_from_configs: that one reads metadata files next to the builder's module.
      text = tfds.features.Text()
      features = tfds.features.FeaturesDict({"text": text, "timestamp": text, "url": text})
      return tfds.core.DatasetInfo(builder=self, features=features)

    def _split_generators(self, dl_manager):
      del dl_manager  # nothing to download
      return {split: self._generate_examples(split) for split in NUM_DOCS}

    def _generate_examples(self, split):
      for i, text in enumerate(_documents(split)):
        yield f"{split}-{i}", {"text": text, "timestamp": "2019-04-25T00:00:00Z", "url": f"https://example.org/{split}/{i}"}

  C4(data_dir=data_dir, config="en").download_and_prepare()


@pytest.mark.slow
def test_recipe_tfds_wiring_trains_on_a_tiny_c4(run_train, tmp_path, monkeypatch):
  pythonpath = _tensorflow_pythonpath()
  if pythonpath is None:
    pytest.skip(f"TensorFlow/tensorflow-datasets not found in {TFDS_SITE} or the venv: run ./setup.sh "
                "(requirements-tfds.txt)")
  from MaxText.compare.metrics import load_run  # pylint: disable=import-outside-toplevel
  from MaxText.data import corpus  # pylint: disable=import-outside-toplevel

  env = dict(os.environ, PYTHONPATH=pythonpath)
  data_dir = tmp_path / "tfds"
  build = subprocess.run(
      [sys.executable, __file__, str(data_dir)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180,
      check=False,
  )  # fmt: skip
  assert build.returncode == 0, build.stderr[-3000:]
  assert (data_dir / "c4" / "en" / "3.0.1" / "dataset_info.json").is_file()

  recipe = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
  data_keys = [f"{key}={recipe[key]}" for key in RECIPE_DATA_KEYS]
  assert "dataset_type=tfds" in data_keys and "dataset_name=c4/en:3.0.1" in data_keys
  corpus.tokenizer.train([(REPO_ROOT / "README.md").read_text(encoding="utf-8")], tmp_path / corpus.TOKENIZER_NAME)
  tokenizer = [o for o in corpus.corpus_overrides(tmp_path)
               if o.split("=")[0] in ("tokenizer_path", "tokenizer_type", "vocab_size")]
  run_dir = tmp_path / "runs" / "tfds"
  run_dir.mkdir(parents=True)  # maxtext does not create metrics_file's folder
  monkeypatch.setenv("PYTHONPATH", pythonpath)  # run_train's subprocess inherits os.environ
  result = run_train(
      [
          "run_name=tfds",
          f"base_output_directory={tmp_path / 'runs'}",
          f"metrics_file={run_dir / 'metrics.jsonl'}",
          "steps=3",
          "eval_interval=2",
          "eval_steps=1",
          f"dataset_path={data_dir}",
          *data_keys,
          *tokenizer,
      ]
  )
  assert result.returncode == 0, result.stderr[-3000:]
  prepared = data_dir / "c4" / "en" / "3.0.1"
  for split in ("train", "validation"):  # tfds's own log: the tf.data pipeline read our files, for both splits
    assert f"Constructing tf.data.Dataset c4 for split {split}, from {prepared}" in result.stderr, split
  run = load_run(run_dir)
  assert list(run.steps) == [0, 1, 2]
  assert all(5.5 < loss < 8.5 for loss in run.loss)  # ~ln(1024) = 6.9 at random init on real tokens
  assert len(run.eval_steps) >= 1 and all(5.5 < loss < 8.5 for loss in run.eval_loss)


if __name__ == "__main__":
  build_tiny_c4(sys.argv[1])
