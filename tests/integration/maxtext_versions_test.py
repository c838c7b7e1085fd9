# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The declared maxtext range, tested: the seam checks out and a tiny te_nvfp4 run trains on maxtext 0.2.4 (set up
by ./setup.sh in .venv/maxtext-0.2.4-site, first on PYTHONPATH) exactly as on the lock's 0.2.5."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from MaxText.integration import seam
from tests.helpers import REPO_ROOT, read_losses, train_cli

OLD_SITE = pathlib.Path(sys.prefix) / "maxtext-0.2.4-site"
#: maxtext 0.2.4 imports its Google Cloud integrations unless told it runs decoupled.
OLD_ENV = {"PYTHONPATH": str(OLD_SITE), "DECOUPLE_GCLOUD": "TRUE"}


def test_the_range_is_declared_once():
  """pyproject's requirement is the seam's supported range (the oldest is what setup.sh installs beside the lock)."""
  pyproject = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
  low, high = seam.SUPPORTED_MAXTEXT[0], seam.SUPPORTED_MAXTEXT[-1]
  assert f'"maxtext>={low},<={high}"' in pyproject
  assert f"maxtext=={low}" in (REPO_ROOT / f"requirements-maxtext-{low}.txt").read_text(encoding="utf-8")
  assert f"maxtext=={high}" in (REPO_ROOT / "requirements.txt").read_text(encoding="utf-8")


@pytest.mark.slow
def test_maxtext_024_passes_the_seam_check_and_trains_like_025(tmp_path, jax_cache_dir):
  assert OLD_SITE.is_dir(), f"{OLD_SITE} is missing: run ./setup.sh"
  probe = subprocess.run(
      [sys.executable, "-c", "import importlib.metadata as m; from MaxText.integration import seam; seam.check(); "
       "print(m.version('maxtext'))"],
      cwd=REPO_ROOT, env={**os.environ, **OLD_ENV}, capture_output=True, text=True, timeout=300, check=False)
  assert probe.returncode == 0 and probe.stdout.strip().splitlines()[-1] == "0.2.4", probe.stdout + probe.stderr
  losses = {}
  for version, env in (("0.2.4", OLD_ENV), ("0.2.5", {})):
    metrics = tmp_path / version / "metrics.jsonl"
    run = train_cli([f"run_name={version}", f"base_output_directory={tmp_path}", "quantization=te_nvfp4", "steps=3",
                     f"metrics_file={metrics}"], jax_cache_dir, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    losses[version] = read_losses(metrics)
  assert losses["0.2.4"] == losses["0.2.5"], losses  # measured: bit-identical (6.0760, 5.7483, 5.5691)
