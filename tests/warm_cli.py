# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""Training runs in processes forked from a warm one: the CLI's own code in a fresh process, without its imports.

Why: a training subprocess spends about 8 s importing maxtext, jax and transformers before it reads its config, and
the suite starts dozens of them. Python's forkserver (multiprocessing) imports them once per test process and forks
a child for each run. The child is a process of its own, as `python -m MaxText.train` would be: it takes the run's
environment (XLA_FLAGS included: XLA reads it when the child starts its backend, which the warm process never does),
its working directory and argv, runs `MaxText.train` as `__main__` through runpy, writes its streams to files and
exits with the CLI's status; at its end it runs the atexit handlers a normal exit would run.

What it does not reproduce, so helpers.train_cli keeps a real subprocess for it: what happens while the CLI imports
(its import-time messages; PYTHONPATH and other variables read at start-up), another tree of this repository, the
`python MaxText/train.py` form, and the CLI's one-line errors and exit codes, whose tests check the whole stderr.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pathlib
import runpy
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence

#: What the warm process imports once: the CLI's own imports (maxtext's trainer pulls in jax, flax, transformers),
#: not the CLI module itself, which each run executes as `__main__` (as `python -m` does, and without runpy's
#: warning about a module already imported).
PRELOAD = ["absl.app", "MaxText.integration.seam", "MaxText.integration.cli", "MaxText.integration.audit",
           "maxtext.trainers.pre_train.train"]
#: Variables a run may set differently from the warm process's start: XLA reads XLA_FLAGS when a backend starts,
#: after the fork; pytest changes PYTEST_CURRENT_TEST at every test. Any other difference takes a real subprocess.
RUNTIME_VARIABLES = frozenset({"XLA_FLAGS", "PYTEST_CURRENT_TEST"})

_START_ENV: dict[str, str] = {}  # the warm process's environment at its start; empty until it starts


def start(env: Mapping[str, str]) -> multiprocessing.context.BaseContext:
  """This process's forkserver, started on first use with `env` as its environment (jax reads some variables when
  it is imported: JAX_PLATFORMS, the compilation cache's); later calls return it as it is."""
  context = multiprocessing.get_context("forkserver")
  if not _START_ENV:
    context.set_forkserver_preload(PRELOAD)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
      from multiprocessing import forkserver  # pylint: disable=import-outside-toplevel  # only where runs fork

      forkserver.ensure_running()
    finally:
      os.environ.clear()
      os.environ.update(saved)
    _START_ENV.update(env)
  return context


def start_environment() -> dict[str, str]:
  """The environment the warm process started with (empty before it starts): a run's changes are made from it."""
  return dict(_START_ENV)


def _changes(env: Mapping[str, str]) -> dict[str, str | None]:
  """What a run with environment `env` sets (None: removes) in the warm process's starting one."""
  return {key: env.get(key) for key in set(env) | set(_START_ENV) if env.get(key) != _START_ENV.get(key)}


def can_run(env: Mapping[str, str]) -> bool:
  """Whether a run with environment `env` can fork from this process's warm one (started with the first run's):
  it changes nothing but RUNTIME_VARIABLES."""
  return not _START_ENV or set(_changes(env)) <= RUNTIME_VARIABLES


def _child(module: str, argv: list[str], changes: dict[str, str | None], cwd: str, stdout: str, stderr: str) -> None:
  """In the forked child: the run's environment (its `changes` from the warm process's start: what the imports
  themselves set stays, as in a new interpreter), directory and streams, then `python -m module *argv`."""
  for key, value in changes.items():
    if value is None:
      os.environ.pop(key, None)
    else:
      os.environ[key] = value
  os.chdir(cwd)
  sys.path[0:0] = [cwd]  # as `python -m` puts the working directory first
  for fd, path in ((1, stdout), (2, stderr)):
    with open(path, "wb") as stream:
      os.dup2(stream.fileno(), fd)
  sys.argv = [module, *argv]
  try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
  finally:
    atexit._run_exitfuncs()  # pylint: disable=protected-access  # multiprocessing's children end with os._exit


def run(module: str, argv: Sequence[str], env: Mapping[str, str], cwd: pathlib.Path,
        timeout: float) -> tuple[int, str, str]:
  """`python -m module *argv` in a child of the warm process: (exit status, stdout, stderr). A run that outlives
  `timeout` is killed and raises subprocess.TimeoutExpired, as subprocess.run does."""
  context = start(env)
  with tempfile.TemporaryDirectory(prefix="warm-cli-") as streams:
    out, err = os.path.join(streams, "stdout"), os.path.join(streams, "stderr")
    process = context.Process(target=_child, args=(module, list(argv), _changes(env), str(cwd), out, err))
    process.start()
    process.join(timeout)
    if process.exitcode is None:
      process.kill()
      process.join()
      raise subprocess.TimeoutExpired([sys.executable, "-m", module, *argv], timeout)
    return (process.exitcode,
            pathlib.Path(out).read_text(encoding="utf-8", errors="replace"),
            pathlib.Path(err).read_text(encoding="utf-8", errors="replace"))
