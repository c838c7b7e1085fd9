# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""`load_parameters_path` into an NVFP4 run: the checkpoint's weights load, the plugin's own state starts fresh.

Why: an NVFP4 model holds a few variables of the plugin's beside its weights (each GEMM's stochastic-rounding counter,
its decoder layer index, the taps' latest measurements, a MoE layer's expert state). maxtext's params-only load
(`checkpointing.load_params_from_path`) asks the checkpoint for every variable of the model and refuses one it lacks,
so a bf16 (or fp8, or even a te_nvfp4) checkpoint could not start an NVFP4 run: the common way to use NVFP4 is to
fine-tune or continue pretraining an existing model.

These variables are not weights: they are counters and measurements that a new run starts from its own init (as
a resume under a new precision does, MaxText.integration.run_record). So the hook asks maxtext's loader for the
model's variables less the plugin's; maxtext's own check then still holds every weight (a missing or mis-shaped one
fails with maxtext's message, unchanged), and maxtext's trainer keeps the init value of each variable the load did
not return (its params-only overlay). One log line names what starts fresh. Nothing is written anywhere.

Only an NNX params state (maxtext's default, `pure_nnx=true`) is filtered: a Linen train state (`pure_nnx=false`)
replaces its whole params with what the load returns, so a variable left out would vanish; there the load goes to
maxtext unchanged.
"""

from __future__ import annotations

import collections
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

from flax import nnx

from MaxText.backends.flags import LAYER_NAME
from MaxText.backends.sr import SR_COUNT_NAME
from MaxText.integration.moe import STATE_ATTR
from MaxText.precision.taps import TAPS

__all__ = ["plugin_variable", "plugin_variable_names", "split_plugin_state", "wrap_load_params_from_path"]

_LOG = logging.getLogger(__name__)


def plugin_variable_names() -> frozenset[str]:
  """The names of the plugin's own (non-weight) variables and state subtrees in an NVFP4 model."""
  return frozenset({SR_COUNT_NAME, LAYER_NAME, STATE_ATTR, *(v for tap in TAPS for v in tap.variables)})


def plugin_variable(path: tuple[Any, ...]) -> str | None:
  """The plugin name a state path runs through (the variable, or the MoE expert-state subtree), or None for a
  maxtext variable."""
  names = plugin_variable_names()
  return next((str(p) for p in path if str(p) in names), None)


def split_plugin_state(state: nnx.State) -> tuple[nnx.State, collections.Counter[str]]:
  """(the state less the plugin's variables, how many leaves of each plugin name were left out)."""
  dropped: collections.Counter[str] = collections.Counter()
  for path, _ in nnx.to_flat_state(state):
    name = plugin_variable(tuple(path))
    if name is not None:
      dropped[name] += 1
  if not dropped:
    return state, dropped
  return state.filter(lambda path, _: plugin_variable(tuple(path)) is None), dropped


def fresh_line(path: Any, dropped: collections.Counter[str]) -> str:
  """The one line a load says about the plugin's variables it did not take from the checkpoint."""
  names = ", ".join(f"{name} ({count})" for name, count in sorted(dropped.items()))
  return (f"NVFP4: load_parameters_path={path}: the weights come from the checkpoint; the plugin's own state starts "
          f"fresh, not loaded: {names}")


def wrap_load_params_from_path(original: Callable[..., Any]) -> Callable[..., Any]:
  """maxtext's params-only load, asked for the model's variables less the plugin's (module docstring)."""
  signature = inspect.signature(original)

  @functools.wraps(original)
  def load_params_from_path(*args: Any, **kwargs: Any) -> Any:
    bound = signature.bind(*args, **kwargs)
    abstract = bound.arguments["abstract_unboxed_params"]
    if not isinstance(abstract, nnx.State):
      return original(*args, **kwargs)
    weights, dropped = split_plugin_state(abstract)
    if not dropped:
      return original(*args, **kwargs)
    _LOG.warning("%s", fresh_line(bound.arguments["load_parameters_from_path"], dropped))
    bound.arguments["abstract_unboxed_params"] = weights
    return original(*bound.args, **bound.kwargs)

  return load_params_from_path
