# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The quickstart config's te_nvfp4 losses, equal bit for bit to the code before the layered tree, on every maxtext
release the plugin supports.

Pinned: the first 20 training losses of today's `configs/quickstart.yml` with quantization=te_nvfp4 on the local
corpus, as commit 380fefb (the last before the layered tree) computes them, so that no refactoring changes what a user
trains. The reference is computed here, by that commit's own code (`git archive` of it, run from its own tree)
on this machine: XLA:CPU's float results depend on the host's instruction set (this project's machines moved
from one CPU to another between sessions and every loss after step 0 moved in its last bits, old code and new
alike), so numbers written into this file would pin the machine, not the code. The same numbers must come out of
maxtext 0.2.4 (set up by ./setup.sh in .venv/maxtext-0.2.4-site, first on PYTHONPATH) and of the lock's 0.2.5:
the declared range, tested.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import io
import tarfile

import pytest

from MaxText.data import corpus
from MaxText.integration import seam
from tests.helpers import CONFIGS_DIR, REPO_ROOT, read_losses, train_cli

OLD_SITE = pathlib.Path(sys.prefix) / "maxtext-0.2.4-site"
#: maxtext 0.2.4 imports its Google Cloud integrations unless told it runs decoupled.
_ENV = {"0.2.4": {"PYTHONPATH": str(OLD_SITE), "DECOUPLE_GCLOUD": "TRUE"}, "0.2.5": {}}
#: The commit whose losses every later one must reproduce (the last before the layered tree).
PINNED_COMMIT = "380fefb8a2b4bd94c94f297984c23dd65b85aaeb"
STEPS = 20


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


def _quickstart_losses(name: str, root: pathlib.Path, corpus_dir: pathlib.Path, jax_cache_dir: pathlib.Path,
                       env: dict[str, str], repo: pathlib.Path = REPO_ROOT) -> list[float]:
  metrics = root / f"{name}.jsonl"
  run = train_cli([f"run_name={name}", f"base_output_directory={root}", "quantization=te_nvfp4", f"steps={STEPS}",
                   "eval_interval=-1", f"metrics_file={metrics}", *corpus.corpus_overrides(corpus_dir)],
                  jax_cache_dir, env=env, config=CONFIGS_DIR / "quickstart.yml", repo=repo)
  assert run.returncode == 0, f"{name} ({repo}): {run.stderr[-3000:]}"
  return read_losses(metrics)


@pytest.fixture(scope="module")
def pinned_losses(tmp_path_factory, corpus_dir, jax_cache_dir) -> list[float]:
  """The pinned commit's own losses on this machine (its tree from `git archive`, trained with maxtext 0.2.5)."""
  archive = subprocess.run(["git", "archive", "--format=tar", PINNED_COMMIT], cwd=REPO_ROOT, capture_output=True,
                           timeout=120, check=False)
  if archive.returncode:  # a shallow clone or a source tarball: nothing to compare with (said, not hidden)
    pytest.skip(f"the pinned commit {PINNED_COMMIT[:7]} is not in this checkout (a shallow clone or no git); the "
                f"comparison needs the repository's history: {archive.stderr.decode().strip()[-200:]}")
  tree = tmp_path_factory.mktemp("pinned_tree")
  with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
    tar.extractall(tree, filter="data")
  # Today's quickstart model in the old tree (it chains to tiny.yml, unchanged since): the code is pinned, not the
  # model, which has since grown to one in which NVFP4 matters (4 layers, a 1024-piece vocabulary).
  (tree / "configs" / "quickstart.yml").write_bytes((CONFIGS_DIR / "quickstart.yml").read_bytes())
  assert (tree / "configs" / "tiny.yml").read_bytes() == (CONFIGS_DIR / "tiny.yml").read_bytes()
  return _quickstart_losses("pinned", tmp_path_factory.mktemp("pinned_run"), corpus_dir, jax_cache_dir, {}, tree)


@pytest.mark.slow
@pytest.mark.parametrize("version", list(_ENV))
def test_quickstart_losses_are_pinned_on_every_supported_maxtext(version, pinned_losses, corpus_dir, tmp_path,
                                                                  jax_cache_dir):
  env = {**os.environ, **_ENV[version]}
  if version != "0.2.5":
    assert OLD_SITE.is_dir(), f"{OLD_SITE} is missing: run ./setup.sh"
  probe = subprocess.run(  # the maxtext this run imports, and the seam's check against it
      [sys.executable, "-c", "import importlib.metadata as m; from MaxText.integration import seam; seam.check(); "
       "print(m.version('maxtext'))"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
  assert probe.returncode == 0 and probe.stdout.strip().splitlines()[-1] == version, probe.stdout + probe.stderr
  losses = _quickstart_losses(version, tmp_path, corpus_dir, jax_cache_dir, _ENV[version])
  assert len(losses) == STEPS and losses == pinned_losses, (losses, pinned_losses)
