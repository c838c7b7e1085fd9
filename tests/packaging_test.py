# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""The package as a container user installs it: `pip install --no-deps .`, then used from another directory.

Installed with --target into a temp folder (the environment's maxtext/jax stay as they are, like a container's),
then run from an unrelated directory with only that folder added to the path: the installed copy, not this
checkout, is imported; its configs are there and their base_config chain loads; the entry points run.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tomllib

import pytest

from tests.helpers import REPO_ROOT


def test_every_package_is_listed_in_pyproject():
  """pyproject.toml lists packages explicitly (MaxText/configs is a data folder): a new subpackage must be added."""
  listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
  found = {".".join(p.parent.relative_to(REPO_ROOT).parts) for p in (REPO_ROOT / "MaxText").rglob("__init__.py")
           if "configs" not in p.parts}
  assert found <= listed, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"
  assert (REPO_ROOT / "MaxText" / "configs" / "tiny.yml").is_file()  # the symlink to configs/
  data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
  folders = {".".join(("MaxText", "configs", *p.parent.relative_to(REPO_ROOT / "configs").parts))
             for p in (REPO_ROOT / "configs").rglob("*.yml")}
  assert {f for f in folders if "*.yml" in data.get(f, [])} == folders, f"package-data lacks {folders - set(data)}"


@pytest.mark.slow
def test_no_deps_install_runs_from_another_directory(tmp_path: pathlib.Path):
  target, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
  elsewhere.mkdir()
  # A clean copy of the checkout (tracked and new files, as git sees them): setuptools builds in the source tree
  # and reuses an existing build/, which could hide a file the package no longer ships.
  source = tmp_path / "source"
  listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO_ROOT, capture_output=True,
                          text=True, check=True).stdout.splitlines()
  for rel in listed:
    src, dst = REPO_ROOT / rel, source / rel
    if src.is_symlink() or src.is_file():
      dst.parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, dst, follow_symlinks=False)
  pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        str(source)], cwd=elsewhere, capture_output=True, text=True, timeout=600, check=False)
  assert pip.returncode == 0, pip.stderr[-3000:]
  installed = target / "MaxText"
  # The wheel pip built carries every YAML under configs/, in the same layout.
  shipped = sorted(str(p.relative_to(installed / "configs")) for p in (installed / "configs").rglob("*.yml"))
  assert shipped == sorted(str(p.relative_to(REPO_ROOT / "configs")) for p in (REPO_ROOT / "configs").rglob("*.yml"))
  assert not (installed / "configs").is_symlink()  # real files in the installed copy
  assert list(target.glob("maxtext_nvfp4-*.dist-info/licenses/LICENSE"))
  env = {**os.environ, "PYTHONPATH": str(target)}

  def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=300, check=False)

  where = run("-c", "import MaxText; print(MaxText.__file__)")
  assert where.returncode == 0 and where.stdout.strip() == str(installed / "__init__.py"), where.stdout + where.stderr
  # The installed tiny.yml -> base.yml -> maxtext's base.yml chain loads; then the bad key value is named (exit 2).
  bad = run("-m", "MaxText.train", str(installed / "configs" / "tiny.yml"), "run_name=t", "nvfp4_backend=bogus",
            f"base_output_directory={tmp_path / 'out'}")
  assert bad.returncode == 2, bad.stderr[-3000:]
  assert "nvfp4_backend='bogus' is not a valid choice" in bad.stderr, bad.stderr[-3000:]
  compare = run("-m", "MaxText.compare", "--help")
  assert compare.returncode == 0 and "--baseline" in compare.stdout, compare.stderr[-2000:]
