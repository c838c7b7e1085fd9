# Copyright 2026 The NVFP4-for-MaxText Authors. Licensed under the Apache License, Version 2.0.
"""Chooses the NVFP4 backend: TransformerEngine on Blackwell, the pure-JAX emulation elsewhere.

`auto` never falls back silently: the choice and its reason are logged in one line. `te` where TE cannot run
is an error raised when the model is built, before anything compiles.
"""

import dataclasses
import enum
import importlib
import logging

import jax

_LOG = logging.getLogger(__name__)
_logged: set[str] = set()  # maxtext builds the model several times; say the choice once per process

#: NVFP4 needs compute capability >= 10.0 (Blackwell); TE refuses Hopper (9.0) for NVFP4.
MIN_COMPUTE_CAPABILITY = 10.0


class Backend(str, enum.Enum):
  AUTO = "auto"
  TE = "te"
  EMULATED = "emulated"


@dataclasses.dataclass(frozen=True)
class Environment:
  """What the backend choice depends on: whether TE imports (and why not) and the local GPUs' capabilities."""

  te_error: str | None  # None when transformer_engine.jax imports
  gpu_capabilities: tuple[float, ...]  # one per local GPU; empty without GPUs

  @property
  def blackwell(self) -> bool:
    return bool(self.gpu_capabilities) and min(self.gpu_capabilities) >= MIN_COMPUTE_CAPABILITY


def probe_environment() -> Environment:
  """Imports transformer_engine.jax (if installed) and reads every local GPU's compute capability."""
  try:
    importlib.import_module("transformer_engine.jax")
    te_error = None
  except Exception as e:  # pylint: disable=broad-exception-caught  # ImportError, or TE's own init errors
    te_error = f"{type(e).__name__}: {e}"
  try:
    gpus = jax.local_devices(backend="gpu")
  except RuntimeError:  # no GPU backend in this jax
    gpus = []
  return Environment(te_error, tuple(float(getattr(d, "compute_capability", 0) or 0) for d in gpus))


def _te_unavailable_reason(env: Environment) -> str | None:
  if env.te_error is not None:
    return f"transformer_engine.jax does not import ({env.te_error}); ./setup.sh --gpu installs it"
  if not env.gpu_capabilities:
    return "no GPU is visible to jax"
  if not env.blackwell:
    caps = ", ".join(f"{c:.1f}" for c in env.gpu_capabilities)
    return f"NVFP4 needs compute capability >= {MIN_COMPUTE_CAPABILITY:.1f} (Blackwell) on every GPU; found {caps}"
  return None


def resolve_backend(requested: Backend | str, env: Environment | None = None) -> Backend:
  """Returns TE or EMULATED for the configured `nvfp4_backend`.

  Raises:
    ValueError: nvfp4_backend=te where TE cannot run (names the reason and the emulated alternative).
  """
  requested = Backend(requested)
  if requested is Backend.EMULATED:
    return Backend.EMULATED
  env = env or probe_environment()
  reason = _te_unavailable_reason(env)
  if requested is Backend.TE:
    if reason:
      raise ValueError(f"nvfp4_backend=te cannot run here: {reason}. Use nvfp4_backend=emulated (pure JAX, any "
                       "hardware) or nvfp4_backend=auto.")
    return Backend.TE
  chosen = Backend.EMULATED if reason else Backend.TE
  line = f"nvfp4_backend=auto -> {chosen.value} ({reason or 'TransformerEngine imports and every GPU is Blackwell'})"
  if line not in _logged:
    _logged.add(line)
    _LOG.warning(line)
  return chosen
