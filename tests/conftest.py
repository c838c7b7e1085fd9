# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""Shared pytest setup: repository paths, the GPU gate, and a helper that runs an entry point in a subprocess."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "configs"
TINY_YML = CONFIGS_DIR / "tiny.yml"


def _has_gpu() -> bool:
  """True when jax sees a GPU; imported lazily so CPU-only collections never pay for it."""
  import jax  # pylint: disable=import-outside-toplevel

  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  """Skips `gpu_only` tests where there is no GPU, so the default run is CPU-only and green."""
  del config
  gpu_items = [item for item in items if item.get_closest_marker("gpu_only")]
  if gpu_items and not _has_gpu():
    skip = pytest.mark.skip(reason="gpu_only: no GPU visible to jax")
    for item in gpu_items:
      item.add_marker(skip)


_SESSION_START = time.monotonic()
_SLOW: dict[str, str] = {}  # nodeid of each `slow` test -> its place in the run, "7/250"
_REPORTER: list = []  # pytest's terminal reporter, once collection is done


def pytest_collection_finish(session: pytest.Session) -> None:
  """Remembers where the `slow` tests sit in the run, for `pytest_runtest_logstart`."""
  _SLOW.update({it.nodeid: f"{i}/{len(session.items)}" for i, it in enumerate(session.items, 1)
                if it.get_closest_marker("slow")})  # fmt: skip
  _REPORTER[:] = [r for r in [session.config.pluginmanager.get_plugin("terminalreporter")] if r is not None]


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
  """Names each `slow` test as it starts (before its fixtures), with its place in the run and the elapsed time.

  Why: a slow test and the module fixtures it builds can keep `pytest -q` silent for minutes, which reads as a hang.
  This hook runs outside output capture, so the line reaches the terminal at once.
  """
  del location
  if nodeid in _SLOW and _REPORTER:
    elapsed = (time.monotonic() - _SESSION_START) / 60
    # A line of its own: in -q mode the reporter does not know whether a row of dots is open, so always break it.
    _REPORTER[0].write_line(f"\n[test {_SLOW[nodeid]}, {elapsed:.1f} min in] slow, running: {nodeid}")


@dataclasses.dataclass(frozen=True)
class Run:
  """A finished subprocess: exit status, captured streams, wall time in seconds."""

  returncode: int
  stdout: str
  stderr: str
  seconds: float


@pytest.fixture(scope="session")
def jax_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  """A compilation cache private to this test session, so tests never write to ~/jax_cache."""
  return tmp_path_factory.mktemp("jax_cache")


def read_losses(metrics_file: pathlib.Path) -> list[float]:
  """The per-step `learning/loss` values of a maxtext `metrics_file` (one JSON object per line), from step 0."""
  rows = [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines() if line.strip()]
  assert [int(r["step"]) for r in rows] == list(range(len(rows))), rows
  return [float(r["learning/loss"]) for r in rows]


def train_cli(
    overrides: list[str],
    jax_cache_dir: pathlib.Path,
    as_file: bool = False,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> Run:
  """Runs the training CLI on configs/tiny.yml, on CPU, in a subprocess.

  `as_file` runs `python MaxText/train.py` (the historic form) instead of `python -m MaxText.train`; `env`
  adds environment variables (e.g. XLA_FLAGS for simulated devices).
  """
  entry = ["MaxText/train.py"] if as_file else ["-m", "MaxText.train"]
  args = [*entry, str(TINY_YML.relative_to(REPO_ROOT)), f"jax_cache_dir={jax_cache_dir}", *overrides]
  start = time.monotonic()
  proc = subprocess.run(
      [sys.executable, *args],
      cwd=REPO_ROOT,
      env=dict(os.environ, JAX_PLATFORMS="cpu", **(env or {})),
      capture_output=True,
      text=True,
      timeout=timeout,
      check=False,
  )
  seconds = time.monotonic() - start
  print(f"[{seconds:.1f}s] python {' '.join(args)}")
  return Run(proc.returncode, proc.stdout, proc.stderr, seconds)


@pytest.fixture()
def run_train(jax_cache_dir: pathlib.Path):
  """Returns `run(overrides, as_file=False, timeout=300) -> Run`: `train_cli` with this session's jax cache."""
  return lambda overrides, as_file=False, timeout=300: train_cli(overrides, jax_cache_dir, as_file, timeout)
