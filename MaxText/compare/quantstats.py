# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The per-GEMM quantization statistics a run logged (nvfp4_stats_interval): where NVFP4 loses most, and a heatmap.

A statistic's metric name is `nvfp4/layer_03/mlp/wo/wgrad_dy/rel_error` (MaxText.integration.telemetry): decoder
layer, GEMM (the module path inside the layer), operand, statistic. This module reads them back from a run's
scalars, ranks the layer/GEMM/operand cells by relative error at the last statistics step, and draws
`stats_<run>.png`: rel_error and underflow per decoder layer x GEMM-operand at that step (top), and each layer's
mean over its GEMM operands at every statistics step (bottom). A run whose statistics hold no quantized operand (a
BF16 baseline's weight-gradient shares alone, `.../wgrad/zero`) gets neither.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # pylint: disable=wrong-import-position
from matplotlib.figure import Figure  # pylint: disable=wrong-import-position

from MaxText.compare.metrics import RunMetrics  # pylint: disable=wrong-import-position
from MaxText.compare.schema import QuantStatsRow, QuantStatsSummary  # pylint: disable=wrong-import-position
from MaxText.integration import artifacts  # pylint: disable=wrong-import-position

__all__ = ["STANDS_OUT_MARGIN", "heatmap_file", "parse_name", "plot_all", "plot_heatmap", "summarize"]

#: How far a layer's mean relative error must exceed the other layers' median, as a fraction of that median, to stand
#: out (besides exceeding the other layers' spread). Why both: with a few layers of near-equal error the spread alone
#: can be tiny, and then any difference beats it: the quickstart's layer 0 (0.09839, its median layer 0.09804, the
#: others' spread 0.00039) was advised to BF16 for being 0.4% above the rest. Running a layer's MLP GEMMs in BF16
#: costs their NVFP4 speed, so it is advised only where that layer quantizes materially worse; 10% is a chosen bar
#: for "materially", not a measured one, and report.md states it.
STANDS_OUT_MARGIN = 0.10

#: Statistics drawn, with their color scale's label.
_DRAWN = (("rel_error", "relative error ||q(x) - x|| / ||x||"), ("underflow", "underflow: nonzero -> 0"))
_DPI = 120


def parse_name(name: str) -> tuple[int, str, str, str] | None:
  """(layer, gemm, operand, statistic) of a statistic's metric name, or None for any other metric."""
  parsed = artifacts.parse_stat_name(name)
  return None if parsed is None else (parsed.layer, parsed.gemm, parsed.operand, parsed.stat)


def heatmap_file(run_name: str) -> str:
  return f"stats_{re.sub(r'[^A-Za-z0-9_.-]+', '_', run_name)}.png"


def _grid(values: dict[str, float], stat: str) -> tuple[list[int], list[str], np.ndarray]:
  """(layers, 'gemm/operand' columns, layers x columns array of `stat`) from one step's statistics."""
  cells = {}
  for name, value in values.items():
    parsed = parse_name(name)
    if parsed is not None and parsed[3] == stat:
      cells[(parsed[0], f"{parsed[1]}/{parsed[2]}")] = value
  layers = sorted({layer for layer, _ in cells})
  columns = sorted({column for _, column in cells})
  grid = np.full((len(layers), len(columns)), np.nan)
  for (layer, column), value in cells.items():
    grid[layers.index(layer), columns.index(column)] = value
  return layers, columns, grid


def _operand_steps(run: RunMetrics) -> dict[int, dict[str, float]]:
  """The run's statistics steps that measured quantized operands (a relative error), with all their statistics."""
  return {step: values for step, values in run.quant_stats.items()
          if any((parsed := parse_name(name)) is not None and parsed[3] == "rel_error" for name in values)}


def summarize(run: RunMetrics, top: int = 5) -> QuantStatsSummary | None:
  """The `top` layer/GEMM/operand cells with the largest relative error at the run's last statistics step, with
  their underflow; and the layer whose mean relative error is largest, with the key that would run its MLP GEMMs in
  BF16 only when it stands out: when it exceeds the median of the other layers both by more than their spread (max -
  min; at least two other layers) and by more than STANDS_OUT_MARGIN of that median. A layer 0.4% above the others
  is no finding, even where their own spread is smaller still. None if the run logged no operand statistics."""
  measured = _operand_steps(run)
  if not measured:
    return None
  step = max(measured)
  values = measured[step]
  rows = []
  for name, value in values.items():
    parsed = parse_name(name)
    if parsed is None or parsed[3] != "rel_error":
      continue
    layer, gemm, operand, _ = parsed
    underflow = values.get(artifacts.stat_name(layer, gemm, operand, "underflow"))
    rows.append(QuantStatsRow(layer=layer, gemm=gemm, operand=operand, rel_error=value, underflow=underflow))
  rows.sort(key=lambda r: -r.rel_error if np.isfinite(r.rel_error) else -np.inf)
  layers = {r.layer for r in rows}
  by_layer = {layer: float(np.nanmean([r.rel_error for r in rows if r.layer == layer])) for layer in layers}
  worst_layer = max(by_layer, key=lambda layer: by_layer[layer]) if by_layer else None
  median = float(np.nanmedian(list(by_layer.values()))) if by_layer else None
  others = [v for layer, v in by_layer.items() if layer != worst_layer]
  spread = float(max(others) - min(others)) if len(others) >= 2 else None
  others_median = float(np.median(others)) if others else None
  stands_out = None
  if spread is not None:
    excess = by_layer[worst_layer] - others_median
    stands_out = bool(excess > spread and excess > STANDS_OUT_MARGIN * others_median)
  return QuantStatsSummary(
      run=run.name, step=step, statistics=len(values), heatmap=heatmap_file(run.name), worst=rows[:top],
      worst_layer=worst_layer, worst_layer_mean_rel_error=None if worst_layer is None else by_layer[worst_layer],
      median_layer_mean_rel_error=median, others_median=others_median, others_spread=spread, stands_out=stands_out,
      try_key=f"nvfp4_bf16_layers=[{worst_layer}]" if stands_out else None)


def plot_heatmap(run: RunMetrics, path: Path) -> None:
  """stats_<run>.png (see the module docstring)."""
  measured = _operand_steps(run)
  steps = sorted(measured)
  last = measured[steps[-1]]
  fig = Figure(figsize=(13, 8.5), dpi=_DPI, layout="constrained")
  axes = fig.subplots(2, 2)
  for col, (stat, label) in enumerate(_DRAWN):
    layers, columns, grid = _grid(last, stat)
    ax = axes[0, col]
    image = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_title(f"{stat} at step {steps[-1]} (last statistics step)")
    ax.set_yticks(range(len(layers)), [f"layer {i}" for i in layers])
    ax.set_xticks(range(len(columns)), columns, rotation=60, ha="right", fontsize=7)
    fig.colorbar(image, ax=ax, label=label)
    over_time = np.array([[np.nanmean(row) if np.isfinite(row).any() else np.nan
                           for row in _grid(measured[s], stat)[2]] for s in steps]).T
    ax = axes[1, col]
    image = ax.imshow(over_time, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_title(f"{stat}: mean over each layer's GEMM operands")
    ax.set_yticks(range(len(layers)), [f"layer {i}" for i in layers])
    ticks = np.unique(np.linspace(0, len(steps) - 1, min(len(steps), 10)).astype(int))
    ax.set_xticks(ticks, [str(steps[i]) for i in ticks])
    ax.set_xlabel("training step")
    fig.colorbar(image, ax=ax, label=label)
  fig.suptitle(f"NVFP4 quantization statistics: {run.name}")
  fig.savefig(path)


def plot_all(runs: Sequence[RunMetrics], out: Path) -> list[Path]:
  """A heatmap for every run that logged operand statistics; the paths written."""
  written = []
  for run in runs:
    if _operand_steps(run):
      path = out / heatmap_file(run.name)
      plot_heatmap(run, path)
      written.append(path)
  return written
