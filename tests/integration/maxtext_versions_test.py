# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The quickstart config's te_nvfp4 losses, pinned bit for bit, on every maxtext release the plugin supports.

Pinned: the first 20 training losses of `configs/quickstart.yml` with quantization=te_nvfp4 on the local corpus,
as the code before the layered tree computed them (commit 380fefb, measured on this project's machine), so that
no refactoring changes what a user trains. The same numbers must come out of maxtext 0.2.4 (set up by ./setup.sh
in .venv/maxtext-0.2.4-site, first on PYTHONPATH) and of the lock's 0.2.5: the declared range, tested.
The corpus is built from the interpreter's standard library, so the pin holds for its sha256 (Python 3.13.0);
the test says so first where the corpus differs.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from MaxText.data import corpus
from MaxText.integration import seam
from tests.helpers import CONFIGS_DIR, REPO_ROOT, read_losses, train_cli

OLD_SITE = pathlib.Path(sys.prefix) / "maxtext-0.2.4-site"
#: maxtext 0.2.4 imports its Google Cloud integrations unless told it runs decoupled.
_ENV = {"0.2.4": {"PYTHONPATH": str(OLD_SITE), "DECOUPLE_GCLOUD": "TRUE"}, "0.2.5": {}}
#: The corpus the pin was measured on (corpus.json's train sha256).
PINNED_TRAIN_SHA256 = "729f281d91ef7ea8b769fd098abb2ed9ad37ad9c04d1ebd2bd0c3e96acb0f9a6"
PINNED_LOSSES = [10.835951805114746, 10.749749183654785, 10.6123685836792, 10.446878433227539, 9.712462425231934,
                 8.941229820251465, 8.450754165649414, 8.918411254882812, 8.135196685791016, 7.973445415496826,
                 7.529220104217529, 7.403043270111084, 7.398935317993164, 6.897843837738037, 7.038048267364502,
                 6.520351886749268, 6.549365043640137, 6.524877548217773, 6.968984127044678, 7.987475395202637]


def test_the_range_is_declared_once():
  """pyproject's requirement is the seam's supported range (the oldest is what setup.sh installs beside the lock)."""
  pyproject = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
  low, high = seam.SUPPORTED_MAXTEXT[0], seam.SUPPORTED_MAXTEXT[-1]
  assert f'"maxtext>={low},<={high}"' in pyproject
  assert f"maxtext=={low}" in (REPO_ROOT / f"requirements-maxtext-{low}.txt").read_text(encoding="utf-8")
  assert f"maxtext=={high}" in (REPO_ROOT / "requirements.txt").read_text(encoding="utf-8")
  assert list(_ENV) == list(seam.SUPPORTED_MAXTEXT)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> pathlib.Path:
  built = tmp_path_factory.mktemp("corpus")
  corpus.build_corpus(built)
  return built


@pytest.mark.slow
@pytest.mark.parametrize("version", list(_ENV))
def test_quickstart_losses_are_pinned_on_every_supported_maxtext(version, corpus_dir, tmp_path, jax_cache_dir):
  env = {**os.environ, **_ENV[version]}
  if version != "0.2.5":
    assert OLD_SITE.is_dir(), f"{OLD_SITE} is missing: run ./setup.sh"
  probe = subprocess.run(  # the maxtext this run imports, and the seam's check against it
      [sys.executable, "-c", "import importlib.metadata as m; from MaxText.integration import seam; seam.check(); "
       "print(m.version('maxtext'))"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
  assert probe.returncode == 0 and probe.stdout.strip().splitlines()[-1] == version, probe.stdout + probe.stderr
  sha = json.loads((corpus_dir / corpus.MANIFEST_NAME).read_text())["splits"]["train"]["sha256"]
  assert sha == PINNED_TRAIN_SHA256, ("the corpus differs from the one the losses were pinned on (another Python's "
                                      "standard library?): pin this machine's losses again")
  metrics = tmp_path / "metrics.jsonl"
  run = train_cli([f"run_name={version}", f"base_output_directory={tmp_path}", "quantization=te_nvfp4", "steps=20",
                   "eval_interval=-1", f"metrics_file={metrics}", *corpus.corpus_overrides(corpus_dir)],
                  jax_cache_dir, env=_ENV[version], config=CONFIGS_DIR / "quickstart.yml")
  assert run.returncode == 0, run.stderr[-3000:]
  assert read_losses(metrics) == PINNED_LOSSES
