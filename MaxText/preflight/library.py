# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What the pre-flight's command line, the self-check and the scripts share: a run's config loaded as MaxText.train
loads it, the environment the backend choice sees on N GPUs of a described target, the run's step compiled for them,
and whether the run's MLP GEMMs are NVFP4 on TransformerEngine there.

Why a module of its own: the command line (`python -m MaxText.preflight`) only parses and prints, so the self-check
(`--compile-only`) and scripts/audit_overhead.py and scripts/predict_speedup.py import this instead of a command line.
Bad input found here is what the pre-flight says about it: one line on stderr prefixed MaxText.preflight, exit 2
(MaxText.integration.cli.fail), whoever called; no process-wide state is set at import (no JAX_PLATFORMS: the
self-check loads configs through it on a node with GPUs).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from MaxText.backends import environment, table
from MaxText.integration import cli, loading
from MaxText.integration.settings import backend_of, settings_of
from MaxText.preflight import PROG, deviceless, programs, report
from MaxText.preflight.targets import TARGETS

__all__ = ["BARE_OVERRIDES", "DEFAULTS", "compile_step", "fail", "load_config", "mem_fraction", "target_environment",
           "te_nvfp4"]

#: The keys switched off for the comparison program: everything the plugin adds around TE's dense that is not
#: the recipe itself (the switches and BF16 layers are the recipe a user chose, so they stay).
BARE_OVERRIDES = ("nvfp4_nonfinite_check=false", *programs.TAPS_OFF)
#: Keys the pre-flight's configs get unless the run's overrides set them: loading a config writes nothing, but
#: maxtext wants an output directory.
DEFAULTS: Mapping[str, str] = {"base_output_directory": "/tmp/maxtext-preflight"}


def fail(line: str) -> NoReturn:
  """Bad input: one line on stderr and exit 2."""
  cli.fail(PROG, line)


def load_config(config_path: str, overrides: Sequence[str], devices: int | None = None, *, prog: str = PROG,
                defaults: Mapping[str, str] = DEFAULTS) -> Any:
  """The run's config for the pre-flight (and the self-check): MaxText.integration.loading.load_config with the
  pre-flight's DEFAULTS; `devices`: compile for this many GPUs that are not here, None: for this node's."""
  return loading.load_config(config_path, overrides, prog=prog, defaults=defaults, devices=devices)


def target_environment(target: str, devices: int) -> environment.Environment:
  """What the backend choice sees on `devices` GPUs of `target`: TE imported without a driver (if installed) with its
  device queries answered for the target (MaxText.preflight.deviceless), and TE's own NVFP4 verdict there."""
  capability = TARGETS[target].capability[0] + TARGETS[target].capability[1] / 10
  if deviceless.te_installed():
    deviceless.import_transformer_engine()
    return deviceless.target_environment(capability, devices)
  return environment.Environment(te_error="transformer_engine_jax is not installed (./setup.sh --gpu)",
                                 gpu_capabilities=(capability,) * devices)


def compile_step(config: Any, target: str, devices: int, program: str = "") -> Any:
  """The compiled step; its compile line says which `program` it is (when named). A device count the config's
  parallelism cannot use is one line, exit 2."""
  # pylint: disable-next=import-outside-toplevel  # maxtext and TE's modules: after register() and the answers
  from MaxText.preflight.compile import compile_train_step

  try:
    return compile_train_step(config, target, devices,
                              log=lambda line: print(f"{line}: {program}" if program else line, flush=True))
  except (AssertionError, ValueError) as e:
    message = " ".join(str(e).split())
    if "mesh" in message.lower() or "devices" in message.lower() or "parallelism" in message.lower():
      message = re.sub(r"NamedSharding\(mesh=Mesh\(.*?\), spec=(P\([^)]*\))[^)]*\)", r"\1", message)
      fail(f"{devices} x {target}: the config's parallelism cannot use this device count: {message[:500]}")
    raise


def mem_fraction() -> float:
  """The share of a GPU jax's allocator may use: XLA_PYTHON_CLIENT_MEM_FRACTION as the run will see it, else jax's
  default; a value that is not a fraction in (0, 1] is one line, exit 2."""
  given = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
  if given is None:
    return report.DEFAULT_MEM_FRACTION
  try:
    fraction = float(given)
  except ValueError:
    fraction = -1.0
  if not 0 < fraction <= 1:
    fail(f"XLA_PYTHON_CLIENT_MEM_FRACTION={given!r}: give the share of GPU memory jax may use, e.g. 0.9")
  return fraction


def te_nvfp4(config: Any) -> bool:
  """Whether the run's NVFP4 GEMMs (MLP, attention projections or both) run on TransformerEngine (nvfp4_backend
  resolved for the environment being answered, MaxText.integration.settings.backend_of: call it inside
  `environment.answering(target_environment(...))`)."""
  settings = settings_of(config)
  return settings.nvfp4 and settings.nvfp4_gemms and table.implementation(backend_of(config)).te_kernels
