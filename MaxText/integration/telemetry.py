# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Per-GEMM quantization statistics into maxtext's metrics: `nvfp4/layer_03/mlp/wo/wgrad_dy/underflow`.

The GEMMs leave their latest statistics in `nvfp4_stats` variables of the train state
(MaxText.backends.pipeline). After maxtext's train_step, inside the same compiled step, `stats_metrics` reads
them into the step's scalar metrics, one scalar per decoder layer, GEMM, operand and statistic; maxtext then
writes them where it writes every scalar (TensorBoard, `metrics_file`, GCS, W&B). The values are the same arrays
on every step, refreshed only on statistics steps (Settings.is_stats_step), so `filter_written_metrics` drops them on
the host from every other step's record (and from eval records): a statistic appears at steps 0, N, 2N, ... only.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from MaxText.backends.experts import EXPERT_GEMMS
from MaxText.backends.pipeline import AUDIT_NAME, STATS_NAME
from MaxText.integration import artifacts
from MaxText.integration import audit as audit_findings
from MaxText.integration.layers import layer_indices
from MaxText.integration.settings import settings_of
from MaxText.nvfp4 import audit
from MaxText.nvfp4.stats import GEMM_OPERANDS, STAT_NAMES
from MaxText.precision.modes import is_nvfp4
from MaxText.precision.settings import Settings

__all__ = ["PREFIX", "filter_written_metrics", "stats_metrics"]

#: Every statistic's metric name starts with it (MaxText.integration.artifacts: the tools read the same names).
PREFIX = artifacts.STATS_PREFIX
#: Statistics an expert stack also reports for its worst expert.
_WORST = ("underflow", "rel_error")


@dataclasses.dataclass(frozen=True)
class _Tap:
  """One measurement the GEMMs leave in a variable of the state, as metrics: its variable, how a cell is named, its
  columns, how an expert stack's experts are reduced, and which steps carry it (Settings' rule)."""

  variable: str
  name: Callable[[int, str, str, str], str]  # (layer, gemm, operand, column) -> metric name
  columns: tuple[str, ...]
  is_step: Callable[[Settings, int], Any]
  counts: bool  # cells are counts (the audit): an expert stack reports their sum; else means (and the worst)


_TAPS = (
    _Tap(STATS_NAME, artifacts.stat_name, STAT_NAMES, Settings.is_stats_step, counts=False),
    _Tap(AUDIT_NAME, artifacts.audit_name, audit.COLUMNS, Settings.is_audit_step, counts=True),
)


def _model_path(path: tuple[Any, ...]) -> tuple[str, ...]:
  """A state leaf's path as names, rooted at the model (from "decoder" on), without nnx's trailing `value`."""
  names = tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
  if names and names[-1] == "value":
    names = names[:-1]
  return names[names.index("decoder"):] if "decoder" in names else names


def stats_metrics(state: Any, settings: Settings, first_num_dense_layers: int = 0) -> dict[str, jax.Array]:
  """{metric name: float32 scalar} for every NVFP4 GEMM statistics and audit variable in `state` (traced or
  concrete): `nvfp4/layer_03/mlp/wo/wgrad_dy/rel_error`, `nvfp4/audit/layer_03/mlp/wo/dgrad_dy/codes`.

  A GEMM is named by the modules between its decoder layer and the GEMM module (e.g. mlp/wi_0); decoder layers
  that run BF16 throughout (nvfp4_bf16_first/last_layers, nvfp4_bf16_layers) quantize nothing and are left out.
  """
  taps = {tap.variable: tap for tap in _TAPS}
  metrics: dict[str, jax.Array] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    names = _model_path(path)
    if not names or names[-1] not in taps:
      continue
    tap = taps[names[-1]]
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
          metrics.update(_expert_stack_metrics(tap, layer, f"{gemm}/experts/{name}", values[g]))
        continue
      for i, operand in enumerate(GEMM_OPERANDS):
        for j, column in enumerate(tap.columns):
          metrics[tap.name(layer, gemm, operand, column)] = values[i, j]
  return metrics


def _expert_stack_metrics(tap: _Tap, layer: int, gemm: str, values: jax.Array) -> dict[str, jax.Array]:
  """One expert GEMM's cells over its experts (values: experts x operands x columns). Counts (the audit): their sum.
  Statistics: amax the largest, the others the mean over experts, and `<stat>_worst`, the largest expert's, for
  underflow and rel_error. An expert that received no token in the step reports zeros and pulls the mean down."""
  out = {}
  for i, operand in enumerate(GEMM_OPERANDS):
    for j, column in enumerate(tap.columns):
      cells = values[:, i, j]
      if tap.counts:
        out[tap.name(layer, gemm, operand, column)] = jnp.sum(cells)
        continue
      out[tap.name(layer, gemm, operand, column)] = jnp.max(cells) if column == "amax" else jnp.mean(cells)
      if column in _WORST:
        out[tap.name(layer, gemm, operand, f"{column}_worst")] = jnp.max(cells)
  return out


def _tap_of(name: str) -> _Tap | None:
  """The tap a written metric belongs to (audit names start with the statistics' prefix too: checked first)."""
  if name.startswith(artifacts.AUDIT_PREFIX):
    return _TAPS[1]
  return _TAPS[0] if name.startswith(PREFIX) else None


def filter_written_metrics(write: Callable[..., Any]) -> Callable[..., Any]:
  """Wraps maxtext's MetricLogger.write_metrics: `nvfp4/` statistics are written only for statistics steps and
  `nvfp4/audit/` counts only for audit steps (MaxText.integration.audit acts on what the audit found)."""
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
      if train and settings.is_audit_step(int(step)):
        audit_findings.act(settings, int(step), {k: v for k, v in kept.items() if _tap_of(k) is _TAPS[1]})
    return write(*bound.args, **bound.kwargs)

  return wrapped
