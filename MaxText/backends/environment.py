# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What a machine can run: its GPUs and whether TransformerEngine runs NVFP4 there, the facts the backend is chosen
against (MaxText.backends.table.resolve_backend: TransformerEngine on Blackwell, the pure-JAX emulation elsewhere).

An `Environment` is this machine's (`probe_environment`, probed once per process), or one a caller answers with for
a machine that is not here (`answering`: the pre-flight compiles for B200s on a CPU).
"""

import contextlib
import contextvars
import dataclasses
import functools
import importlib
from collections.abc import Iterator

import jax

#: NVFP4 needs compute capability >= 10.0 (Blackwell); TE refuses Hopper (9.0) for NVFP4.
MIN_COMPUTE_CAPABILITY = 10.0


@dataclasses.dataclass(frozen=True)
class Environment:
  """What the backend choice depends on: whether TE imports (and why not) and the local GPUs' capabilities."""

  te_error: str | None  # None when transformer_engine.jax imports
  gpu_capabilities: tuple[float, ...]  # one per local GPU; empty without GPUs
  te_nvfp4_error: str | None = None  # TE's own reason when its support check refuses NVFP4 here

  @property
  def blackwell(self) -> bool:
    return bool(self.gpu_capabilities) and min(self.gpu_capabilities) >= MIN_COMPUTE_CAPABILITY


def te_nvfp4_support_error() -> str | None:
  """TE's own verdict on NVFP4 here (transformer_engine.jax must import): None when supported, else its reason.

  TE 2.20.2's `is_scaling_mode_supported(ScalingMode.NVFP4_1D_SCALING)` checks every local GPU for compute
  capability >= 10.0, cuBLASLt >= 12.8 and CUDA >= 12.8 (and a recent enough jax): more than the capability
  alone, which is all jax reports.
  """
  try:
    # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, only where installed
    from transformer_engine.jax.quantize import ScalingMode, is_scaling_mode_supported
  except ImportError as e:  # a TE without this API: say so rather than guess
    return f"this TransformerEngine has no is_scaling_mode_supported ({e}); TE 2.20.2 is the tested version"
  supported, reason = is_scaling_mode_supported(ScalingMode.NVFP4_1D_SCALING)
  return None if supported else (reason or "TransformerEngine reports NVFP4 unsupported")


@functools.cache
def probe_environment() -> Environment:
  """Imports transformer_engine.jax (if installed), reads every local GPU's compute capability, and asks TE; once
  per process (the GPUs and the installed TE do not change while it runs)."""
  try:
    importlib.import_module("transformer_engine.jax")
    te_error = None
  except Exception as e:  # pylint: disable=broad-exception-caught  # ImportError, OSError, or TE's own init errors
    te_error = f"{type(e).__name__}: {e}"
  try:
    gpus = jax.local_devices(backend="gpu")
  except RuntimeError:  # no GPU backend in this jax
    gpus = []
  capabilities = tuple(float(getattr(d, "compute_capability", 0) or 0) for d in gpus)
  te_nvfp4_error = None
  if te_error is None and capabilities:
    try:
      te_nvfp4_error = te_nvfp4_support_error()
    except Exception as e:  # pylint: disable=broad-exception-caught  # a failing query is a reason, not a crash
      te_nvfp4_error = f"TransformerEngine's NVFP4 support check failed: {type(e).__name__}: {e}"
  return Environment(te_error, capabilities, te_nvfp4_error)


_ANSWER: contextvars.ContextVar[Environment | None] = contextvars.ContextVar("nvfp4_environment", default=None)


@contextlib.contextmanager
def answering(env: Environment) -> Iterator[Environment]:
  """Within the block, `current()` is `env` instead of this machine's: configs load and models build as they would
  on the machine `env` describes (the pre-flight's target GPUs)."""
  token = _ANSWER.set(env)
  try:
    yield env
  finally:
    _ANSWER.reset(token)


def current() -> Environment:
  """The environment backends are chosen against: the one being answered (`answering`), else this machine's."""
  answer = _ANSWER.get()
  return answer if answer is not None else probe_environment()


def te_unavailable_reason(env: Environment) -> str | None:
  """Why TransformerEngine cannot run NVFP4 in `env` (one clause), or None where it can."""
  if env.te_error is not None:
    return f"transformer_engine.jax does not import ({env.te_error}); ./setup.sh --gpu installs it"
  if not env.gpu_capabilities:
    return "no GPU is visible to jax"
  if not env.blackwell:
    caps = ", ".join(f"{c:.1f}" for c in env.gpu_capabilities)
    return f"NVFP4 needs compute capability >= {MIN_COMPUTE_CAPABILITY:.1f} (Blackwell) on every GPU; found {caps}"
  if env.te_nvfp4_error:
    return f"TransformerEngine's support check refuses NVFP4 here: {env.te_nvfp4_error}"
  return None
