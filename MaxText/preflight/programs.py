# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The programs a step-time prediction compares: the run as configured, and the same config compiled as maxtext's
FP8, as BF16, and as upstream maxtext's te_nvfp4 (every GEMM in NVFP4); what each differs in, and the prediction of
each next to the run's.

Why a table: a speedup is only meaningful against a named baseline, and each baseline is one change to the run's
own config (`quantization=...`), so the comparison holds the model, batch, parallelism and remat policy fixed.
The published NVFP4 results (docs/prediction.md) compare with maxtext's `quantization=fp8`. The table itself is
MaxText.preflight.comparisons (the command line reads it before importing maxtext); this module adds the taps and
the prediction loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from MaxText.integration.cli import not_overridden
from MaxText.integration.flops import training_flops
from MaxText.integration.shapes import mlp_widths
from MaxText.precision.settings import Settings
from MaxText.precision.taps import TAPS, Tap
from MaxText.preflight import calibration, predict
from MaxText.preflight.comparisons import COMPARISONS, Comparison, against
from MaxText.preflight.kernels import Kernel
from MaxText.preflight.targets import Target

__all__ = ["COMPARISONS", "TAPS_OFF", "ActiveTap", "Comparison", "Predicted", "against", "overrides_for", "predict_all",
           "replaced", "taps"]


#: The overrides that switch every periodic tap off (MaxText.precision.taps). A comparison program compiles without
#: them: it measures a precision, not our instruments, and maxtext's own modes refuse them.
TAPS_OFF = tuple(f"{tap.key}=0" for tap in TAPS)


@dataclasses.dataclass(frozen=True)
class ActiveTap:
  """A periodic tap (MaxText.precision.taps.Tap) the run has on, with its interval in steps (>= 1)."""

  tap: Tap
  interval: int

  @property
  def key(self) -> str:
    return self.tap.key

  @property
  def what(self) -> str:
    return self.tap.what

  @property
  def off(self) -> str:
    """The override that compiles the run without it."""
    return f"{self.tap.key}=0"


def taps(settings: Settings) -> list[ActiveTap]:
  """The periodic taps `settings` switch on. The compiled step holds both branches of each tap's conditional, so a
  kernel count reads it as if it ran every step; the pre-flight compiles the run once more without it to tell what
  it adds on the steps it runs, and averages that over its interval."""
  return [ActiveTap(tap, tap.interval(settings)) for tap in settings.taps_on]


def replaced(run_overrides: Sequence[str], theirs: Sequence[str]) -> list[str]:
  """The run's overrides with `theirs` on top (a key `theirs` sets is dropped from the run's, as maxtext refuses a
  key given twice)."""
  return not_overridden(run_overrides, theirs) + list(theirs)


def overrides_for(run_overrides: Sequence[str], comparison: Comparison) -> list[str]:
  """The run's overrides with the comparison's on top and the periodic taps off."""
  return replaced(run_overrides, [*comparison.overrides, *TAPS_OFF])


@dataclasses.dataclass(frozen=True)
class Predicted:
  """The run's prediction and each comparison's, for one target."""

  run: predict.Prediction  # its mean step: each periodic tap averaged over its interval
  against: dict[str, predict.Prediction]
  tap_seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # tap key -> seconds on its steps
  factors: tuple[calibration.Factor, ...] = ()  # the calibrated model's, for the target

  def speedups(self) -> dict[str, float]:
    """The run's speedup over each comparison."""
    return {name: predict.speedup(other, self.run) for name, other in self.against.items()}

  def ceilings(self) -> dict[str, float]:
    """The run's Amdahl ceiling over each comparison (its MLP GEMMs free)."""
    return {name: predict.amdahl_ceiling(other, self.run) for name, other in self.against.items()}

  def as_dict(self) -> dict[str, Any]:
    return {"run": self.run.as_dict(), "against": {name: p.as_dict() for name, p in self.against.items()},
            "speedup": self.speedups(), "amdahl_ceiling": self.ceilings(), "tap_seconds": self.tap_seconds,
            "compared_programs": {name: {"overrides": overrides_for([], COMPARISONS[name]),
                                         "what": COMPARISONS[name].what} for name in self.against},
            "model": "calibrated step (MaxText/preflight/calibration.py), roofline as the bound (predict.py)",
            "factors": {f.name: f.as_dict() for f in self.factors}}


def predict_all(config: Any, run: Sequence[Kernel], target: Target, names: Sequence[str],
                kernels_of: Callable[[Comparison], list[Kernel] | None],
                without_taps: Sequence[tuple[ActiveTap, Sequence[Kernel]]] = ()) -> Predicted:
  """The run's prediction and that of each named comparison.

  Args:
    config: the run's loaded config (its model FLOPs and MLP widths hold for every comparison: same model).
    run: the run's kernels.
    target: the GPU predicted for.
    names: the comparisons (keys of COMPARISONS).
    kernels_of: compiles one comparison (its overrides, in its `context()`) and returns its kernels, or None to
      leave it out; the caller decides what a failure to compile does.
    without_taps: for each periodic tap the run has on, the run's kernels compiled without it (`ActiveTap.off`): the
      run's prediction is its mean step (predict.averaged), and each tap's seconds on its steps are kept.

  Raises:
    ValueError: a program the model cannot predict for this target (FP4 GEMMs on a GPU without them), named.
  """
  widths = mlp_widths(config)
  model_flops = training_flops(config)["tflops_per_device_step"] * 1e12

  def predicted(name: str, found: Sequence[Kernel]) -> predict.Prediction:
    try:
      return predict.predict(found, target, widths, model_flops)
    except ValueError as e:
      raise ValueError(f"{name}: {e}") from e

  compiled = {name: kernels_of(COMPARISONS[name]) for name in names}
  other = {name: predicted(name, found) for name, found in compiled.items() if found is not None}
  full = predicted("this run", run)
  without = [(tap, predicted(f"this run without {tap.what}", found)) for tap, found in without_taps]
  return Predicted(run=predict.averaged(full, [(p, tap.interval) for tap, p in without]), against=other,
                   tap_seconds={tap.key: full.step_seconds - p.step_seconds for tap, p in without},
                   factors=tuple(calibration.factors_for(target).table(target)))
