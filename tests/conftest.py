# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""Shared pytest setup: the GPU gate, progress lines for slow tests, and the shared fixtures (helpers in helpers.py)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
import time

import pytest

from tests import helpers


def _has_gpu() -> bool:
  """True when jax sees a GPU; imported lazily so CPU-only collections never pay for it."""
  import jax  # pylint: disable=import-outside-toplevel

  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  """Runs the files with the most `slow` tests first; skips `gpu_only` tests where there is no GPU.

  Why the order: with pytest-xdist each file goes to one worker (--dist loadfile) in collection order, and the
  files that train in subprocesses take minutes; started first, they do not leave one core idle at the end. The
  order is a pure function of the collected items, so every worker agrees on it.
  """
  del config
  slow = {}
  for item in items:
    slow[item.path] = slow.get(item.path, 0) + bool(item.get_closest_marker("slow"))
  position = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
  items.sort(key=lambda item: (-slow[item.path], position[item.path]))  # stable: tests keep their order in a file
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
  if nodeid not in _SLOW:
    return
  elapsed = (time.monotonic() - _SESSION_START) / 60
  worker = os.environ.get("PYTEST_XDIST_WORKER")
  # A line of its own: in -q mode the reporter does not know whether a row of dots is open, so always break it.
  line = f"\n[test {_SLOW[nodeid]}{f' on {worker}' if worker else ''}, {elapsed:.1f} min in] slow, running: {nodeid}"
  if worker:  # pytest-xdist: a worker's terminal reporter is not shown, its stderr is
    sys.__stderr__.write(line + "\n")
    sys.__stderr__.flush()
  elif _REPORTER:
    _REPORTER[0].write_line(line)


@pytest.fixture(scope="session")
def jax_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  """A compilation cache private to this test session, so tests never write to ~/jax_cache; shared by the
  pytest-xdist workers (their temp folders sit side by side), so a program one compiled the other reuses."""
  base = tmp_path_factory.getbasetemp()
  shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jax_cache"
  shared.mkdir(exist_ok=True)
  return shared


@pytest.fixture()
def load_config():
  """Returns `load(yml=tiny.yml, *overrides)`: maxtext's pyconfig.initialize with the plugin registered."""
  return helpers.load_config


@pytest.fixture()
def blackwell():
  """Backends are chosen as on a Blackwell node with TE (4 GPUs) for this test (`environment.answering`); yields
  `set(env)` to answer with another environment."""
  from MaxText.backends import environment  # pylint: disable=import-outside-toplevel

  with contextlib.ExitStack() as stack:

    def answer(env=None) -> None:
      stack.enter_context(environment.answering(env or helpers.blackwell_environment(4)))

    answer()
    yield answer


@pytest.fixture()
def run_train(jax_cache_dir: pathlib.Path):
  """Returns `run(overrides, as_file=False, timeout=300) -> Run`: `train_cli` with this session's jax cache."""
  return lambda overrides, as_file=False, timeout=300: helpers.train_cli(overrides, jax_cache_dir, as_file, timeout)
