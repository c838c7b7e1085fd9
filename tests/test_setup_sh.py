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

"""setup.sh's interpreter search, run on a copy in a temp dir with fake interpreters (the real .venv is never touched)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT

# What setup.sh needs from PATH before it gives up on finding Python; nothing else is visible to it, so no real
# interpreter on this machine can be found.
_TOOLS = ("dirname", "cat", "sha256sum", "cut", "ls", "sort", "sed", "rm")


def _fake_python(path: pathlib.Path, body: str) -> pathlib.Path:
  path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
  path.chmod(0o755)
  return path


@pytest.fixture()
def sandbox(tmp_path: pathlib.Path) -> dict[str, pathlib.Path]:
  """A copy of setup.sh and its requirement files, a PATH of basic tools plus fake interpreters, an empty pyenv."""
  repo = tmp_path / "repo"
  repo.mkdir()
  for name in ("setup.sh", "requirements.txt", "requirements-tfds.txt", "requirements-gpu.txt"):
    shutil.copy2(REPO_ROOT / name, repo / name)
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for tool in _TOOLS:
    found = shutil.which(tool)
    assert found, f"test needs {tool} on PATH"
    (bin_dir / tool).symlink_to(found)
  # Interpreters that run but are too old, and one that does not run at all.
  _fake_python(bin_dir / "python3", 'echo "3.11"')
  _fake_python(bin_dir / "python3.13", 'echo "3.11"')
  _fake_python(bin_dir / "python3.12", "exit 1")
  pyenv = tmp_path / "pyenv"
  (pyenv / "versions").mkdir(parents=True)
  return {"repo": repo, "bin": bin_dir, "pyenv": pyenv, "home": tmp_path}


def _run_setup(sandbox: dict[str, pathlib.Path], *args: str) -> subprocess.CompletedProcess[str]:
  env = {
      "PATH": str(sandbox["bin"]),
      "PYTHON": str(sandbox["bin"] / "python3"),
      "PYENV_ROOT": str(sandbox["pyenv"]),
      "HOME": str(sandbox["home"]),
  }
  bash = shutil.which("bash")
  assert bash
  return subprocess.run(
      [bash, str(sandbox["repo"] / "setup.sh"), *args], env=env, capture_output=True, text=True, timeout=60, check=False
  )


def test_refuses_python_older_than_3_12(sandbox: dict[str, pathlib.Path]) -> None:
  real_venv = REPO_ROOT / ".venv"
  before = real_venv.stat().st_mtime_ns if real_venv.exists() else None
  proc = _run_setup(sandbox)
  assert proc.returncode != 0, proc.stdout + proc.stderr
  assert "no Python >= 3.12 found" in proc.stderr, proc.stderr
  assert "PYTHON=" in proc.stderr and "Python 3.11" in proc.stderr, proc.stderr  # Says why $PYTHON was skipped.
  assert "Install Python 3.12" in proc.stderr, proc.stderr  # Says what to do.
  assert not (sandbox["repo"] / ".venv").exists()
  assert (real_venv.stat().st_mtime_ns if real_venv.exists() else None) == before


def test_rejects_unknown_arguments(sandbox: dict[str, pathlib.Path]) -> None:
  proc = _run_setup(sandbox, "--cpu")
  assert proc.returncode == 2
  assert "unknown argument '--cpu' (valid: --gpu)" in proc.stderr
