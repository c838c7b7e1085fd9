# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""What many test modules share: repository paths, loading a config, a Blackwell machine, a training subprocess.

Imported as `from tests import helpers` (a module of its own, not conftest: pytest owns conftest's import).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "configs"
TINY_YML = CONFIGS_DIR / "tiny.yml"
#: The most binades between the leading bits of a 1x16 run's nonzero bf16 terms for which its RHT sums are exact in
#: f32 in any order: 8 significant bits per term and 4 bits of growth over 16 terms leave 12 of f32's 24
#: (docs/numerics.md#random-hadamard-transform, "Exact where the sums are").
EXACT_RUN_BINADES = 12
#: The learning-rate schedule of the tiny model's training runs wherever a test needs no other: maxtext bakes the
#: schedule (which follows `steps` unless set) into the compiled step, so runs of different lengths on one schedule
#: share one program, compiled once per suite run (the run's compilation cache, tests/conftest.py).
TINY_SCHEDULE = "learning_rate_schedule_steps=20"
#: A tiny Mixtral-style MoE (overrides on the tiny model): 4 routed experts, top 2; every MLP GEMM is an expert's.
#: The expert dim is the tiny model's base_mlp_dim: maxtext wants them equal when every layer is MoE.
MIXTRAL_EXPERTS = 4
MIXTRAL = ["decoder_block=mixtral", f"num_experts={MIXTRAL_EXPERTS}", "num_experts_per_tok=2", "base_moe_mlp_dim=256"]


def examples(full: int) -> int:
  """A property test's hypothesis examples: `full` in `make test-cpu` and CI; at most the loaded profile's count
  under `--hypothesis-profile=fast` (`make test-fast`, tests/conftest.py): the same properties, fewer examples."""
  import hypothesis  # pylint: disable=import-outside-toplevel  # only the property tests need it

  return min(full, hypothesis.settings.default.max_examples)


def plugin_defaults() -> dict[str, Any]:
  """The plugin's keys with their defaults, as the schema declares them (configs/base.yml repeats them; config_test)."""
  from MaxText.precision.keys import PluginKeys  # pylint: disable=import-outside-toplevel  # pydantic only

  return PluginKeys().model_dump(mode="json")


def run_cache() -> list[str]:
  """maxtext's jax_cache_dir override for a config loaded in this process: the run's compilation cache
  (tests/conftest.py), since maxtext points jax's cache at that key on every load (its default: ~/jax_cache)."""
  cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  return [f"jax_cache_dir={cache}"] if cache else []


#: Where in-process config loads point maxtext's output directory (nothing is written there by a load).
CONFIG_OUTPUT_DIR = "/tmp/nvfp4-config-test"


def load_config(yml: pathlib.Path | str = TINY_YML, *overrides: str) -> Any:
  """maxtext's own `pyconfig.initialize` with the plugin registered, as its trainer calls it (argv[0] unused).

  run_name, base_output_directory and jax_cache_dir (run_cache) get test defaults unless `overrides` set them
  (maxtext refuses a key twice).
  """
  import MaxText  # pylint: disable=import-outside-toplevel  # maxtext costs seconds: only tests that load configs

  MaxText.register()
  from maxtext.configs import pyconfig  # pylint: disable=import-outside-toplevel  # after register(), as above

  given = {o.split("=", 1)[0] for o in overrides}
  defaults = [f"{k}={v}" for k, v in (("run_name", "t"), ("base_output_directory", CONFIG_OUTPUT_DIR)) if k not in given]
  defaults += [o for o in run_cache() if "jax_cache_dir" not in given]
  return pyconfig.initialize(["train", str(yml), *defaults, *overrides])


def settings(**fields: Any) -> Any:
  """Settings of a te_nvfp4 run with the schema's defaults (no decoder layers), `fields` replaced: what a GEMM module
  or a tool is handed, e.g. settings(recipe=GemmRecipe(rht=False), switches=Switches(from_step=3)). A tap's interval
  is given by its name, as `stats_interval=10` (into Settings.intervals)."""
  # pylint: disable-next=import-outside-toplevel  # jax: only tests that build GEMMs (the TE group sets its platform)
  from MaxText.precision.keys import PluginKeys
  from MaxText.precision.settings import Settings  # pylint: disable=import-outside-toplevel  # as above

  base = Settings.of(PluginKeys(), quantization="te_nvfp4", num_layers=0)
  for name in [name for name in fields if f"nvfp4_{name}" in dict(base.intervals)]:
    base = base.with_interval(f"nvfp4_{name}", fields.pop(name))
  return dataclasses.replace(base, **fields)


def blackwell_environment(gpus: int = 1, te_nvfp4_error: str | None = None) -> Any:
  """What the backend probe reports on a Blackwell node with TransformerEngine: `gpus` GPUs of capability 10.0
  (and TE's own NVFP4 support verdict, where a test asks TE)."""
  from MaxText.backends import environment  # pylint: disable=import-outside-toplevel  # jax: only where used

  return environment.Environment(te_error=None, gpu_capabilities=(10.0,) * gpus, te_nvfp4_error=te_nvfp4_error)


#: The same, as source for a subprocess that imports `environment` from MaxText.backends.
BLACKWELL_SOURCE = ("from MaxText.backends import environment; environment.probe_environment = lambda: "
                    "environment.Environment(te_error=None, gpu_capabilities=(10.0,) * 4)")


@dataclasses.dataclass(frozen=True)
class Run:
  """A finished subprocess: exit status, captured streams, wall time in seconds."""

  returncode: int
  stdout: str
  stderr: str
  seconds: float


def read_losses(metrics_file: pathlib.Path) -> list[float]:
  """The per-step `learning/loss` values of a maxtext `metrics_file` (one JSON object per line), from step 0."""
  rows = [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines() if line.strip()]
  assert [int(r["step"]) for r in rows] == list(range(len(rows))), rows
  return [float(r["learning/loss"]) for r in rows]


def last_checkpoint(run_dir: pathlib.Path) -> pathlib.Path:
  """The `items` folder of a maxtext run's last saved step (`<base_output_directory>/<run_name>/checkpoints/N`)."""
  steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
  return run_dir / "checkpoints" / str(steps[-1]) / "items"


def read_checkpoint(items: pathlib.Path) -> dict[str, Any]:
  """A checkpoint's arrays (numpy) by '/'-joined path: weights under params/, Adam's moments under opt_state/, the
  plugin's variables under nnx_aux/; PRNG keys as their key data, so that any two compare with np.array_equal."""
  # pylint: disable=import-outside-toplevel  # jax, orbax and flax: only the tests that read checkpoints pay them
  import jax
  import numpy as np
  import orbax.checkpoint as ocp
  from flax import traverse_util
  # pylint: enable=import-outside-toplevel

  def plain(value):
    key = jax.dtypes.issubdtype(getattr(value, "dtype", np.float32), jax.dtypes.prng_key)
    return np.asarray(jax.random.key_data(value) if key else value)

  return {k: plain(v) for k, v in traverse_util.flatten_dict(ocp.PyTreeCheckpointer().restore(items), sep="/").items()}


def arrays_that_differ(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
  """The keys only one side has, then those whose arrays differ in any bit. Bytes are compared: == would take -0 for
  0 and find no NaN equal to itself. Empty when the two are the same bit for bit."""
  import numpy as np  # pylint: disable=import-outside-toplevel  # only the tests that read checkpoints pay it
  return sorted(before.keys() ^ after.keys()) + sorted(
      k for k in before.keys() & after.keys() if not np.array_equal(before[k].view(np.uint8), after[k].view(np.uint8)))


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
  """This process's environment on the CPU for a subprocess, with `extra`; an `extra` XLA_FLAGS (e.g. simulated
  devices) is added to the caller's own, not put in their place."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", **(extra or {}))
  if extra and "XLA_FLAGS" in extra and os.environ.get("XLA_FLAGS"):
    env["XLA_FLAGS"] = f"{os.environ['XLA_FLAGS']} {extra['XLA_FLAGS']}"
  return env


def train_cli(
    overrides: list[str],
    jax_cache_dir: pathlib.Path,
    as_file: bool = False,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    config: pathlib.Path = TINY_YML,
    repo: pathlib.Path = REPO_ROOT,
    fresh: bool = False,
) -> Run:
  """Runs the training CLI on `config` (configs/tiny.yml), on CPU, in a process of its own.

  `as_file` runs `python MaxText/train.py` (the historic form) instead of `python -m MaxText.train`; `env`
  adds environment variables (e.g. XLA_FLAGS for simulated devices); `repo` runs another tree of this project
  (an earlier commit's code, first on sys.path as the working directory), with `config` at the same relative path.

  The process is forked from a warm one that has the CLI's imports done (tests/warm_cli.py: about 8 s less per run),
  unless `fresh` asks for a new interpreter, as the CLI's own tests do (its import-time output, its one-line errors),
  or the run needs one: `as_file`, another `repo`, or an environment that differs in what is read at start-up.
  """
  from tests import warm_cli  # pylint: disable=import-outside-toplevel  # multiprocessing: only runs that train

  cli = [str(config.relative_to(REPO_ROOT)), f"jax_cache_dir={jax_cache_dir}", *overrides]
  args = [*(["MaxText/train.py"] if as_file else ["-m", "MaxText.train"]), *cli]
  full_env = subprocess_env(env)
  start = time.monotonic()
  fresh = fresh or os.environ.get("NVFP4_TESTS_FRESH_PROCESSES") == "1"  # every run in a new interpreter, as before
  if fresh or as_file or repo != REPO_ROOT or not warm_cli.can_run(full_env):
    proc = subprocess.run([sys.executable, *args], cwd=repo, env=full_env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    returncode, stdout, stderr, how = proc.returncode, proc.stdout, proc.stderr, "python"
  else:
    returncode, stdout, stderr = warm_cli.run("MaxText.train", cli, full_env, repo, timeout)
    how = "forked: python"
  seconds = time.monotonic() - start
  print(f"[{seconds:.1f}s] {how} {' '.join(args)}")
  return Run(returncode, stdout, stderr, seconds)


def resumed_losses(root: pathlib.Path, run_name: str, keep_through: int, overrides: list[str],
                   jax_cache_dir: pathlib.Path) -> dict[int, float]:
  """Resumes run `run_name` under `root` from its checkpoint of step `keep_through` (later ones are deleted) with
  `overrides`; returns the resumed run's step -> loss (checkpoint N holds the state after step N, so it starts at
  N + 1). Why here: resume is checked in several layouts, each against its own straight run."""
  checkpoints = root / run_name / "checkpoints"
  saved = sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
  assert keep_through in saved, saved
  for step in saved:
    if step > keep_through:
      shutil.rmtree(checkpoints / str(step))
  metrics = root / f"{run_name}-resumed.jsonl"
  run = train_cli([f"run_name={run_name}", f"base_output_directory={root}", f"metrics_file={metrics}", *overrides],
                  jax_cache_dir)
  assert run.returncode == 0, run.stderr[-4000:]
  rows = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
  resumed = {int(r["step"]): float(r["learning/loss"]) for r in rows}
  assert min(resumed) == keep_through + 1, sorted(resumed)
  return resumed


def gate_group(items: list[Any], folder: pathlib.Path, available: Callable[[], bool], required_env: str,
               reason: str) -> None:
  """A test group that needs an environment of its own (tests/te: TransformerEngine; tests/export: .venv-export):
  where `available()` is false its tests are skipped with `reason`, or the run fails when `required_env` is
  `required` (make test-te, make test-export), so that CI never skips a group it was asked to run."""
  import pytest  # pylint: disable=import-outside-toplevel  # only conftest files call this

  mine = [item for item in items if str(item.fspath).startswith(f"{folder}{os.sep}")]
  if not mine or available():
    return
  if os.environ.get(required_env) == "required":
    raise pytest.UsageError(f"{required_env}=required but {reason}")
  for item in mine:
    item.add_marker(pytest.mark.skip(reason=reason))
