# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The taps' per-GEMM measurements into maxtext's metrics: `nvfp4/layer_03/mlp/wo/wgrad_dy/underflow`.

The GEMMs leave each tap's latest measurement (MaxText.precision.taps: the statistics, the audit, ...) in a variable of
the train state named by the tap (MaxText.backends.pipeline). After maxtext's train_step, inside the same compiled
step, `stats_metrics` reads them into the step's scalar metrics, one scalar per decoder layer, GEMM, operand and
column, named under the tap's prefix; maxtext then writes them where it writes every scalar (TensorBoard,
`metrics_file`, GCS, W&B). The values are the same arrays on every step, refreshed only on the tap's steps
(Tap.is_step), so `filter_written_metrics` drops them on the host from every other step's record (and from eval
records): a tap with interval N appears at steps 0, N, 2N, ... only.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from MaxText.backends.experts import EXPERT_GEMMS
from MaxText.integration import artifacts
from MaxText.integration.layers import layer_indices
from MaxText.integration.settings import settings_of
from MaxText.nvfp4.operands import GEMM_OPERANDS
from MaxText.precision.modes import is_nvfp4
from MaxText.precision.settings import Settings
from MaxText.precision.taps import GRADIENT_ROW, TAPS, ExpertReduction, Tap

__all__ = ["PREFIX", "filter_written_metrics", "on_written", "stats_metrics"]

#: Every statistic's metric name starts with it (MaxText.integration.artifacts: the tools read the same names).
PREFIX = artifacts.STATS_PREFIX


#: Host-side actions on a tap's written metrics: tap name -> act(settings, step, that tap's metrics). The module
#: that owns the action registers it (MaxText.integration.audit: nvfp4_audit_action); telemetry names no tap.
_ACTIONS: dict[str, Callable[[Settings, int, dict[str, Any]], None]] = {}


def on_written(tap: Tap, act: Callable[[Settings, int, dict[str, Any]], None]) -> None:
  """Calls `act(settings, step, metrics)` on every step where `tap` measures, with the tap's written metrics."""
  _ACTIONS[tap.name] = act


def _model_path(path: tuple[Any, ...]) -> tuple[str, ...]:
  """A state leaf's path as names, rooted at the model (from "decoder" on), without nnx's trailing `value`."""
  names = tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
  if names and names[-1] == "value":
    names = names[:-1]
  return names[names.index("decoder"):] if "decoder" in names else names


def stats_metrics(state: Any, settings: Settings, first_num_dense_layers: int = 0) -> dict[str, jax.Array]:
  """{metric name: float32 scalar} for every NVFP4 GEMM tap variable in `state` (traced or concrete):
  `nvfp4/layer_03/mlp/wo/wgrad_dy/rel_error` (statistics), `nvfp4/audit/layer_03/mlp/wo/dgrad_dy/codes` (audit).

  A tap's weight-gradient variable (Tap.gradient) is one row more, named GRADIENT_ROW:
  `nvfp4/layer_03/mlp/wo/wgrad/zero`; a BF16 MLP GEMM measured with nvfp4_mlp_precision=bf16 holds only that one.

  A GEMM is named by the modules between its decoder layer and the GEMM module (e.g. mlp/wi_0); decoder layers
  that run BF16 throughout (nvfp4_bf16_first/last_layers, nvfp4_bf16_layers) quantize nothing and are left out.
  """
  variables: dict[str, tuple[Tap, tuple[str, ...], tuple[str, ...]]] = {}  # variable -> (tap, rows, columns)
  for tap in TAPS:
    variables[tap.variable] = (tap, GEMM_OPERANDS, tap.columns)
    if tap.gradient:
      variables[tap.gradient_variable] = (tap, (GRADIENT_ROW,), tap.gradient)
  metrics: dict[str, jax.Array] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    names = _model_path(path)
    if not names or names[-1] not in variables:
      continue
    tap, rows, columns = variables[names[-1]]
    expert = leaf.ndim in (4, 5)  # a RoutedMoE layer's (expert GEMMs, experts, operands, columns)
    stacked = leaf.ndim in (3, 5)  # a leading layer axis under scan
    indices = layer_indices(names, leaf.shape if stacked else (), first_num_dense_layers) or [-1]
    gemm = "/".join(names[2:-2])  # after decoder/<stack>, before <GEMM module>/<variable>
    for slot, layer in enumerate(indices):
      if layer >= 0 and settings.switches.bf16_layer(layer):
        continue
      values = leaf[slot] if stacked else leaf
      if expert:
        for g, name in enumerate(EXPERT_GEMMS):
          metrics.update(_expert_stack_metrics(tap, layer, f"{gemm}/experts/{name}", values[g], rows, columns))
        continue
      for i, operand in enumerate(rows):
        for j, column in enumerate(columns):
          metrics[tap.metric(layer, gemm, operand, column)] = values[i, j]
  return metrics


def _expert_stack_metrics(tap: Tap, layer: int, gemm: str, values: jax.Array, rows: tuple[str, ...],
                          columns: tuple[str, ...]) -> dict[str, jax.Array]:
  """One expert GEMM's cells over its experts (values: experts x rows x columns), by the tap's reduction. Counts
  (the audit): their sum. The calibration's amax: the largest. Statistics: amax the largest, the others the mean
  over experts, and `<column>_worst`, the largest expert's, for the tap's `worst` columns. An expert that received
  no token in the step reports zeros and pulls the mean down (its weight gradient: all zero, a share of 1)."""
  out = {}
  for i, operand in enumerate(rows):
    for j, column in enumerate(columns):
      cells = values[:, i, j]
      if tap.experts is not ExpertReduction.MEAN:
        out[tap.metric(layer, gemm, operand, column)] = (jnp.sum if tap.experts is ExpertReduction.SUM else jnp.max)(
            cells)
        continue
      out[tap.metric(layer, gemm, operand, column)] = jnp.max(cells) if column == "amax" else jnp.mean(cells)
      if column in tap.worst:
        out[tap.metric(layer, gemm, operand, f"{column}_worst")] = jnp.max(cells)
  return out


def _tap_of(name: str) -> Tap | None:
  """The tap a written metric belongs to (Tap.owns: its prefix, then a layer)."""
  return next((tap for tap in TAPS if tap.owns(name)), None)


def filter_written_metrics(write: Callable[..., Any]) -> Callable[..., Any]:
  """Wraps maxtext's MetricLogger.write_metrics: each tap's metrics are written only for the steps it measures on
  (train records of an NVFP4 run), and a tap's registered action (`on_written`) sees them on those steps."""
  signature = inspect.signature(write)

  @functools.wraps(write)
  def wrapped(*args: Any, **kwargs: Any) -> Any:
    bound = signature.bind(*args, **kwargs)
    metrics, step = bound.arguments.get("metrics"), bound.arguments.get("step")
    scalars = metrics.get("scalar") if isinstance(metrics, dict) else None
    if scalars and any(_tap_of(k) for k in scalars):
      config = bound.arguments["self"].config
      train = bound.arguments.get("metric_type", "train") == "train" and is_nvfp4(config.quantization)
      settings = settings_of(config)
      kept = {k: v for k, v in scalars.items()
              if (tap := _tap_of(k)) is None or (train and tap.is_step(settings, int(step)))}
      bound.arguments["metrics"] = {**metrics, "scalar": kept}
      for tap in settings.taps_on if train else ():
        if tap.name in _ACTIONS and tap.is_step(settings, int(step)):
          _ACTIONS[tap.name](settings, int(step), {k: v for k, v in kept.items() if _tap_of(k) is tap})
    return write(*bound.args, **bound.kwargs)

  return wrapped
