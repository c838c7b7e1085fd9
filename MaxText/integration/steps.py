# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The training step, seen by the GEMMs: maxtext's train_step/eval_step wrapped so the state's step is current,
and a train step's metrics carrying the GEMMs' statistics and audit counts (nvfp4_stats_interval, nvfp4_audit_interval;
MaxText.integration.telemetry).

The late switch (nvfp4_bf16_from_step, nvfp4_bf16_forward_from_step) compares the traced step of the state being
trained with the switch step (MaxText.backends.flags). maxtext's `train_step(model, config, state_mesh_shardings,
params_shardings, state, data, ...)` and `eval_step(model, config, state, data, ...)` are wrapped by the seam;
the state is found by its parameter name (`inspect.signature(...).bind`), never by position.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from MaxText.backends.flags import step_scope
from MaxText.integration import audit
from MaxText.integration.run_keys import maxtext_keys
from MaxText.integration.settings import settings_of
from MaxText.integration.telemetry import stats_metrics
from MaxText.precision.modes import is_nvfp4
from MaxText.precision.settings import Settings

__all__ = ["wrap_iteration", "wrap_step"]

_LOG = logging.getLogger(__name__)
_switch_logged: set[tuple[str, int]] = set()
#: The parameters of train_step/eval_step holding maxtext's NNX train state and the config.
STATE_PARAM = "state"
CONFIG_PARAM = "config"


def _state_step(state: Any) -> jax.Array | None:
  """The optimizer step of maxtext's NNX train state (a pure nnx.State), or None if it has none."""
  try:
    step = state["optimizer"]["step"]
  except (KeyError, TypeError):
    step = getattr(getattr(state, "optimizer", None), "step", None)
  if step is None:
    return None
  return jnp.asarray(step.get_value() if hasattr(step, "get_value") else step)


def wrap_step(step_fn: Callable[..., Any]) -> Callable[..., Any]:
  """Wraps maxtext's train_step/eval_step so the GEMMs traced inside see the state's step."""
  signature = inspect.signature(step_fn)

  @functools.wraps(step_fn)
  def wrapped(*args: Any, **kwargs: Any) -> Any:
    arguments = signature.bind(*args, **kwargs).arguments
    step = _state_step(arguments.get(STATE_PARAM))
    if step is None:
      return step_fn(*args, **kwargs)
    with step_scope(step):
      out = step_fn(*args, **kwargs)
    return _with_stats_metrics(out, arguments.get(CONFIG_PARAM))

  return wrapped


def _with_stats_metrics(out: Any, config: Any) -> Any:
  """A train step's (state, metrics) with the GEMMs' tap measurements added to the scalars (a tap on: statistics,
  audit, ...; MaxText.precision.taps); anything else (eval metrics, other modes, every tap off) unchanged."""
  if not (is_nvfp4(maxtext_keys(config).quantization) and isinstance(out, tuple) and len(out) == 2
          and isinstance(out[1], dict) and isinstance(out[1].get("scalar"), dict)):
    return out
  settings = settings_of(config)
  if not settings.taps_on:
    return out
  state, metrics = out
  scalars = {**metrics["scalar"], **stats_metrics(state, settings, maxtext_keys(config).first_num_dense_layers)}
  return state, {**metrics, "scalar": scalars}


def wrap_iteration(iteration: Callable[..., Any]) -> Callable[..., Any]:
  """Wraps maxtext's `training_loop_iteration` (host side, once per step) to log a switch step when reached, and to
  end the run on a recorded audit mismatch under nvfp4_audit_action=stop (MaxText.integration.audit).

  Host side on purpose: a `jax.debug.callback` in the step would block ahead-of-time lowering for another
  platform (train_compile, our CUDA lowering tests) and add a host round trip per step.
  """
  signature = inspect.signature(iteration)

  @functools.wraps(iteration)
  def wrapped(*args: Any, **kwargs: Any) -> Any:
    bound = signature.bind(*args, **kwargs).arguments
    config = bound["immutable_data"].get("config")
    if is_nvfp4(maxtext_keys(config).quantization):  # once per step, host side: other modes pay nothing more
      audit.raise_pending(bound["python_vars"].get("checkpoint_manager"))  # nvfp4_audit_action=stop
      _log_when_reached(settings_of(config), int(bound["python_vars"]["step"]))
    return iteration(*args, **kwargs)

  return wrapped


def _log_when_reached(settings: Settings, step: int) -> None:
  """Logs, once per process and switch, that training reached a switch step (at it, or resumed past it)."""
  switches = settings.switches
  for key, at, what in (("nvfp4_bf16_from_step", switches.from_step, "all NVFP4 GEMMs (forward and backward)"),
                        ("nvfp4_bf16_forward_from_step", switches.forward_from_step, "the forward NVFP4 GEMMs")):
    if at is not None and step >= at and (key, at) not in _switch_logged:
      _switch_logged.add((key, at))
      _LOG.warning("NVFP4: from step %d on (%s=%d), %s run in BF16", step, key, at, what)
