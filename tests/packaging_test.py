# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""The package as a container user installs it: `pip install --no-deps .`, then used from another directory.

Installed with --target into a temp folder (the environment's maxtext/jax stay as they are, like a container's),
then run from an unrelated directory with only that folder added to the path: the installed copy, not this
checkout, is imported; its configs are there and their base_config chain loads; the entry points run, the
quickstart's smoke run (two trainings and the comparison) among them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib

import pytest

from MaxText import quickstart
from MaxText.compare.report import read_report
from MaxText.compare.schema import MetricsSource, Status
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


@dataclasses.dataclass(frozen=True)
class Installed:
  """A `pip install --no-deps --target` copy of this checkout, and a directory outside the repository to run in."""

  target: pathlib.Path
  elsewhere: pathlib.Path

  def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python *args` in `elsewhere`, importing the installed copy (only it on PYTHONPATH)."""
    return subprocess.run([sys.executable, *args], cwd=self.elsewhere, env={**os.environ,
                                                                            "PYTHONPATH": str(self.target)},
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
  tmp_path = tmp_path_factory.mktemp("installed")
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
  return Installed(target, elsewhere)


@pytest.mark.slow
def test_no_deps_install_runs_from_another_directory(installed: Installed, tmp_path: pathlib.Path):
  target, run = installed.target, installed.run
  installed_package = target / "MaxText"
  # The wheel pip built carries every YAML under configs/, in the same layout.
  shipped = sorted(str(p.relative_to(installed_package / "configs"))
                   for p in (installed_package / "configs").rglob("*.yml"))
  assert shipped == sorted(str(p.relative_to(REPO_ROOT / "configs")) for p in (REPO_ROOT / "configs").rglob("*.yml"))
  assert not (installed_package / "configs").is_symlink()  # real files in the installed copy
  assert list(target.glob("maxtext_nvfp4-*.dist-info/licenses/LICENSE"))
  where = run("-c", "import MaxText; print(MaxText.__file__)")
  assert where.returncode == 0 and where.stdout.strip() == str(installed_package / "__init__.py"), \
      where.stdout + where.stderr
  # The installed tiny.yml -> base.yml -> maxtext's base.yml chain loads; then the bad key value is named (exit 2).
  bad = run("-m", "MaxText.train", str(installed_package / "configs" / "tiny.yml"), "run_name=t",
            "nvfp4_backend=bogus", f"base_output_directory={tmp_path / 'out'}")
  assert bad.returncode == 2, bad.stderr[-3000:]
  assert "nvfp4_backend='bogus' is not a valid choice" in bad.stderr, bad.stderr[-3000:]
  compare = run("-m", "MaxText.compare", "--help")
  assert compare.returncode == 0 and "--baseline" in compare.stdout, compare.stderr[-2000:]


@pytest.mark.slow
def test_quickstart_smoke_from_the_installed_copy(installed: Installed):
  """`python -m MaxText.quickstart --smoke` in a directory outside the repository, importing only the installed copy:
  its configs come from the package, the corpus is built, two precisions train 4 steps with evals, the comparison is
  written (1-3 min on 2 cores)."""
  out = installed.elsewhere / "results" / "quickstart-smoke"
  stale = out / "runs" / "fp8"
  stale.mkdir(parents=True)
  proc = installed.run("-m", "MaxText.quickstart", "--smoke", "--set", "nvfp4_attention_precision=fp8", timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  assert not (installed.elsewhere / "results" / "quickstart").exists() and not stale.exists()
  text = proc.stdout
  assert "quickstart: built the corpus" in text and "removed run folders of an earlier run" in text
  for i, name in enumerate(quickstart.SMOKE_PRECISIONS, 1):
    assert f"quickstart: [{i}/2] {name}: " in text and f"quickstart: [{i}/2] {name} finished in " in text
  assert "left for 1 more" in text  # the estimate after the first run
  assert "train loss" in text and "eval after step 2" in text
  assert "- **te_nvfp4**: " in text and "step time (s), emulation cost" in text
  assert "| bf16 | baseline | 4 |" in text and "| te_nvfp4 | ok | 4 |" in text
  for name in ("report.json", "report.md", "loss.png", "throughput.png"):
    assert (out / name).stat().st_size > 0, name
  assert "| te_nvfp4 | ok | 4 |" in (out / "report.md").read_text(encoding="utf-8")
  report = read_report(out / "report.json")
  assert report.baseline == "bf16" and [r.name for r in report.runs] == ["bf16", "te_nvfp4"]
  # The NVFP4 run logged its quantization statistics (step 0 of 4 at interval 25): ranked, and drawn. Each of the 4
  # layers' 3 MLP GEMMs reports 5 figures for each of its 4 operands and its weight gradient's 2 zero shares.
  (stats,) = report.quant_stats
  assert (stats.run, stats.step, stats.statistics) == ("te_nvfp4", 0, 4 * 3 * (5 * 4 + 2)) and stats.worst
  assert (out / stats.heatmap).stat().st_size > 0 and "## Where NVFP4 loses most" in (out / "report.md").read_text()
  # The runs evaluate, so maxtext truncated metrics.jsonl; every training step still comes from TensorBoard.
  assert all(r.source is MetricsSource.TENSORBOARD and r.num_steps == 4 for r in report.runs)
  (c,) = report.comparisons
  assert c.status is Status.OK and c.common_steps == 4
  assert c.step0.within_tolerance  # same initial weights: the bf16 baseline keeps a quant object
  assert json.loads((out / "report.json").read_text(encoding="utf-8"))["comparisons"][0]["final_eval_step"] == 2
  assert c.final_eval_gap_nats is not None and c.verdict.basis == "eval"
  # Emulated NVFP4 on CPU: a step-time ratio, never a speedup.
  assert c.speedup is None and "emulation cost" in c.speedup_withheld and "ran on CPU" in c.speedup_withheld
  runs = {r.name: r for r in report.runs}
  assert (runs["te_nvfp4"].backend, runs["te_nvfp4"].nvfp4_gemms, runs["te_nvfp4"].emulated) == ("emulated", 3, True)
  assert runs["bf16"].nvfp4_gemms == 0 and not runs["bf16"].emulated and runs["bf16"].hardware == "cpu"
