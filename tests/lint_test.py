# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The tree is clean under ruff's linter, as configured in pyproject.toml ([tool.ruff]: pycodestyle, pyflakes and
import order, 125-column lines); `.venv/bin/ruff check MaxText tests scripts` by hand (docs/development.md)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from tests.helpers import REPO_ROOT


def test_ruff_check_is_clean():
  """`ruff check MaxText tests scripts` exits 0; its findings, one a line, are the failure message."""
  ruff = pathlib.Path(sys.executable).with_name("ruff")
  assert ruff.is_file(), f"no ruff next to {sys.executable}: ./setup.sh installs the pinned one (requirements.txt)"
  proc = subprocess.run([str(ruff), "check", "--no-cache", "--output-format", "concise", "MaxText", "tests", "scripts"],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
