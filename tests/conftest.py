# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""Shared pytest setup: one compilation cache per run, the GPU gate, progress lines for slow tests, and the shared
fixtures (helpers in helpers.py)."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

import hypothesis
import pytest

from tests import helpers

# `make test-fast` runs the property tests with `--hypothesis-profile=fast`: each test's examples capped at 10
# (helpers.examples); everything else (make test-cpu, CI) runs each test's full count.
hypothesis.settings.register_profile("fast", max_examples=10)


def _has_gpu() -> bool:
  """True when jax sees a GPU; imported lazily so CPU-only collections never pay for it."""
  import jax  # pylint: disable=import-outside-toplevel

  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


#: jax's persistent compilation cache for one pytest run, in the environment of every process of the run: both
#: pytest-xdist workers inherit it from the controller, every training subprocess from its worker (helpers.train_cli
#: also names it as maxtext's jax_cache_dir), and jax reads these variables when it is imported. Minimum compile time
#: 0 and entry size 0: the suite's programs are tiny, and jax's defaults (1 s) would cache almost none of them. The
#: same tiny program compiled by several tests or processes is then compiled once per run. Per run, never shared
#: between runs: a run's timings and its results never depend on an earlier run's leftovers.
CACHE_LIMITS = {"jax_persistent_cache_min_compile_time_secs": 0.0, "jax_persistent_cache_min_entry_size_bytes": 0}
#: LLVM's optimisation off for what the tests compile in their own process (pytest's, or each xdist worker's): most
#: of XLA:CPU's compile time is LLVM's, and those programs are tiny, so they compile in about 0.6x the time and still
#: run in milliseconds. XLA's own HLO passes (fusion, layout, sharding: what the pre-flight reads) are unchanged, and
#: XLA never enables fast-math unless asked (xla_cpu_enable_fast_math): the suite's bit-exact tests hold at this level
#: as at the default. A whole train step's losses do move between the levels (7.4237 against 7.4233 at step 0 of a
#: tiny DeepSeek-style run, 2026-11-29): compare runs compiled at one level. Not for the training subprocesses: their
#: 20-step runs execute long enough that the optimised code pays for its compile, so they inherit the environment
#: as it was.
FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0"
_OWNED_CACHE: list[str] = []  # the directory this process made (the controller, or a run without xdist)


def _fast_compiles_in_this_process() -> None:
  """Starts jax's CPU backend with FAST_COMPILE_FLAG (XLA reads XLA_FLAGS once, when the backend starts), then puts
  XLA_FLAGS back, so subprocesses do not inherit the flag."""
  flags = os.environ.get("XLA_FLAGS")
  if flags is not None and "xla_backend_optimization_level" in flags:
    return
  os.environ["XLA_FLAGS"] = f"{flags or ''} {FAST_COMPILE_FLAG}".strip()
  try:
    import jax  # pylint: disable=import-outside-toplevel  # only where tests run

    # The cache too, in case jax was imported before pytest_configure set its variables (it reads them at import).
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    for option, value in CACHE_LIMITS.items():
      jax.config.update(option, value)
    jax.monitoring.register_event_listener(_count_cache_event)
    jax.monitoring.register_event_duration_secs_listener(_count_cache_seconds)
    jax.devices()
  finally:
    if flags is None:
      del os.environ["XLA_FLAGS"]
    else:
      os.environ["XLA_FLAGS"] = flags


#: This process's compilation-cache events (jax.monitoring): compile requests that used the cache, hits, misses,
#: and the compile seconds the hits saved. Written beside the cache at the end; the run's owner sums every process's.
_CACHE_EVENTS: collections.Counter = collections.Counter()
_EVENT_PREFIX = "/jax/compilation_cache/"


def _count_cache_event(event: str, **kwargs) -> None:
  del kwargs
  if event.startswith(_EVENT_PREFIX):
    _CACHE_EVENTS[event.removeprefix(_EVENT_PREFIX)] += 1


def _count_cache_seconds(event: str, duration: float, **kwargs) -> None:
  del kwargs
  if event == _EVENT_PREFIX + "compile_time_saved_sec":
    _CACHE_EVENTS["compile_seconds_saved"] += duration


def pytest_configure(config: pytest.Config) -> None:
  """Makes the run's compilation cache (module comment at CACHE_LIMITS) unless this is an xdist worker (which
  inherited its controller's) or the caller set one; and, where tests run in this process (not an xdist
  controller), starts jax with FAST_COMPILE_FLAG."""
  worker = bool(os.environ.get("PYTEST_XDIST_WORKER"))
  if not worker and not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    directory = tempfile.mkdtemp(prefix="nvfp4-tests-jax-cache-")
    _OWNED_CACHE.append(directory)
    os.environ.update({option.upper(): str(value) for option, value in CACHE_LIMITS.items()})
    os.environ["JAX_COMPILATION_CACHE_DIR"] = directory
  if worker or not getattr(config.option, "numprocesses", None):
    _fast_compiles_in_this_process()


def pytest_unconfigure(config: pytest.Config) -> None:
  """Writes this process's cache events beside the cache; where this process made the cache, reports the run's
  programs and the test processes' hits (training subprocesses use the cache too, uncounted), then removes it."""
  cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if cache and _CACHE_EVENTS and os.path.isdir(cache):
    pathlib.Path(cache, f"events-{os.getpid()}.json").write_text(json.dumps(_CACHE_EVENTS), encoding="utf-8")
  for directory in _OWNED_CACHE:
    found = list(pathlib.Path(directory).iterdir())
    events: collections.Counter = collections.Counter()
    for path in found:
      if path.name.startswith("events-"):
        events.update(json.loads(path.read_text(encoding="utf-8")))
    programs = sum(1 for p in found if p.name.endswith("-cache"))
    requests, hits = events["compile_requests_use_cache"], events["cache_hits"]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
      saved = events["compile_seconds_saved"]
      reporter.write_line(
          f"jax compilation cache: {programs} programs compiled in this run; in the test processes {hits} of "
          f"{requests} compiles were hits ({hits / max(requests, 1):.0%}), {saved:+.0f} s of compiling net of reading "
          f"them ({directory}, removed)")
    shutil.rmtree(directory, ignore_errors=True)


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
def jax_cache_dir() -> pathlib.Path:
  """The run's compilation cache (CACHE_LIMITS), for maxtext's `jax_cache_dir` key: tests never write to
  ~/jax_cache, and a program one process compiled every other process of the run reuses."""
  return pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"])


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
  """Returns `run(overrides, as_file=False, timeout=300) -> Run`: `train_cli` with this session's jax cache, in a
  fresh interpreter (the CLI's tests: its exit status, stderr and import-time behaviour as a user sees them)."""
  return lambda overrides, as_file=False, timeout=300: helpers.train_cli(overrides, jax_cache_dir, as_file, timeout,
                                                                         fresh=True)
