# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The periodic measurements of the NVFP4 GEMMs' operands (taps), declared once: one `Tap` entry each.

Why one registry: a tap reaches every layer of the plugin. Its interval is a config key (MaxText.precision.keys builds
one `nvfp4_<name>_interval` per entry), the GEMM pipeline runs its `measure` on its steps and keeps the result in a
variable of the state (MaxText.backends.pipeline), telemetry writes that variable as maxtext metrics under its prefix
(MaxText.integration.telemetry), the config checks refuse it where it cannot measure, the run record stores its
interval and says what a resume starts afresh, and the pre-flight prices it (MaxText.preflight.programs). Each of
those reads this registry and names no tap: a new measurement is one entry here, or one outside the package.

Extension point: an installed distribution may declare taps under the entry-point group `maxtext_nvfp4.taps`
(`name = module:TAP`, a `Tap`). They join the registry when this module is first imported, before the config schema is
built from it, so their keys load like the built-in ones (tests/integration/taps_test.py declares one that way).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import importlib.metadata
import re
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["AUDIT", "CALIBRATION", "ENTRY_POINT_GROUP", "GRADIENT_ROW", "STATISTICS", "TAPS", "ExpertReduction",
           "Schedule", "Tap"]

#: The entry-point group other distributions declare their taps under (module docstring).
ENTRY_POINT_GROUP = "maxtext_nvfp4.taps"
#: The row name of a tap's weight-gradient figures in metric names (`Tap.gradient`): `.../mlp/wo/wgrad/zero`, beside
#: the operand rows (fprop_x, ..., wgrad_dy), which describe the wgrad GEMM's inputs where this describes its output.
GRADIENT_ROW = "wgrad"
#: Where the built-in taps' measurements live (jax code, imported only when a GEMM measures).
_MEASURES = "MaxText.precision.measures"


class Schedule(Protocol):
  """What a tap reads of MaxText.precision.settings.Settings (which imports this module, so not by name)."""

  def interval(self, key: str) -> int: ...

  def every(self, interval: int, step: Any) -> Any: ...


class ExpertReduction(enum.Enum):
  """How a routed-expert GEMM's cells (one per expert) become one metric."""

  SUM = "sum"  # counts (the audit's mismatches): their total over experts
  MAX = "max"  # the largest over experts (calibration's amax: one input scale every expert of the GEMM shares)
  MEAN = "mean"  # statistics: the mean over experts; `amax` the largest; the tap's `worst` columns also their largest


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tap:
  """One periodic measurement of every NVFP4 GEMM's operands.

  name: its config key is `nvfp4_<name>_interval` and its state variable `nvfp4_<name>`.
  what: what it is, for messages ("the statistics").
  description: the config key's description (every N training steps, 0 off, what it writes).
  prefix: its metric names are `<prefix>layer_03/mlp/wo/<operand>/<column>` (telemetry finds a tap by it).
  columns: what it measures of each operand, in the order of its array's columns.
  experts: how an expert stack's experts reduce to one metric; worst: columns also reported for the worst expert.
  measure: (recipe, the backend's candidate quantizer) -> Measure (MaxText.precision.measures), rows in
    GEMM_OPERANDS order; or its "module:function" name, imported when a GEMM first measures (the built-in taps: so
    that this registry loads without jax).
  gradient: what it also measures of the GEMM's weight gradient dW (the Measure's `gradient`), one row named
    GRADIENT_ROW kept in a second variable (`gradient_variable`). Why apart from the operand rows: dW is not
    quantized, so a BF16 GEMM has it too; with nvfp4_mlp_precision=bf16 the MLP GEMMs (dense and routed experts)
    report these columns alone, the baseline's figures beside an NVFP4 run's. () for none.
  """

  name: str
  what: str
  description: str
  prefix: str
  columns: tuple[str, ...]
  experts: ExpertReduction
  measure: Callable[[Any, Any], Any] | str
  worst: tuple[str, ...] = ()
  gradient: tuple[str, ...] = ()

  def measure_of(self, recipe: Any, candidate: Any) -> Any:
    """Its Measure for a GEMM of `recipe` whose backend quantizes with `candidate` (`measure`, imported if named)."""
    measure = self.measure
    if isinstance(measure, str):
      module, _, function = measure.partition(":")
      measure = getattr(importlib.import_module(module), function)
    return measure(recipe, candidate)

  @property
  def key(self) -> str:
    """Its config key: the interval in training steps (0: off)."""
    return f"nvfp4_{self.name}_interval"

  @property
  def variable(self) -> str:
    """The variable each NVFP4 GEMM module keeps its latest measurement in (operands x columns)."""
    return f"nvfp4_{self.name}"

  @property
  def gradient_variable(self) -> str:
    """The variable a GEMM module keeps its latest weight-gradient row in (1 x gradient columns), when `gradient`."""
    return f"{self.variable}_{GRADIENT_ROW}"

  @property
  def variables(self) -> tuple[str, ...]:
    """Every variable a GEMM module may hold for this tap."""
    return (self.variable, self.gradient_variable) if self.gradient else (self.variable,)

  def metric(self, layer: int, gemm: str, operand: str, column: str) -> str:
    """The metric name of one cell: `<prefix>layer_03/mlp/wo/wgrad_dy/<column>`."""
    return f"{self.prefix}layer_{layer:02d}/{gemm}/{operand}/{column}"

  def parse(self, metric: str) -> tuple[int, str, str, str] | None:
    """(layer, gemm, operand, column) of one of this tap's metric names (`metric` inverted), None for any other."""
    found = re.match(rf"^{re.escape(self.prefix)}layer_(-?\d+)/(.+)/([a-z_]+)/([a-z_]+)$", metric)
    return None if found is None else (int(found[1]), found[2], found[3], found[4])

  def owns(self, metric: str) -> bool:
    """Whether a written metric is one of this tap's (its prefix, then a layer)."""
    return metric.startswith(f"{self.prefix}layer_")

  def interval(self, settings: Schedule) -> int:
    """Its interval under `settings` (0: off)."""
    return settings.interval(self.key)

  def is_step(self, settings: Schedule, step: Any) -> Any:
    """Whether training step `step` measures (Settings.every's rule: one rule for the host and the traced step)."""
    return settings.every(self.interval(settings), step)


STATISTICS = Tap(
    name="stats", what="the statistics", prefix="nvfp4/", experts=ExpertReduction.MEAN,
    columns=("amax", "underflow", "rel_error", "subnormal_scales"),  # MaxText.nvfp4.stats.STAT_NAMES (taps_test)
    gradient=("zero", "zero_channels"),  # MaxText.nvfp4.stats.WGRAD_STAT_NAMES (taps_test)
    worst=("underflow", "rel_error"), measure=f"{_MEASURES}:statistics",
    description="Every N training steps (step 0 included), each NVFP4 GEMM reports amax, underflow, relative error"
    " and subnormal block scales of every operand it quantizes, and the shares of its weight gradient's entries and"
    " output channels that are exactly zero, as maxtext metrics named nvfp4/layer_XX/...; with"
    " nvfp4_mlp_precision=bf16 the BF16 MLP GEMMs report the weight-gradient shares. 0: off (the program is the one"
    " without statistics). Losses are the same either way.")

AUDIT = Tap(
    name="audit", what="the audit", prefix="nvfp4/audit/", experts=ExpertReduction.SUM,
    columns=("codes", "scales", "amax"),  # MaxText.nvfp4.audit.COLUMNS (taps_test)
    measure=f"{_MEASURES}:auditing",
    description="Every N training steps (step 0 included), each NVFP4 GEMM also quantizes its operands with the"
    " plugin's bit-exact quantizer and compares them with the backend's (TE's kernels on the TE backend; the"
    " emulated backend compares its quantizer with itself, always 0): mismatching codes, block scales and amax per"
    " layer, GEMM and operand as maxtext metrics named nvfp4/audit/layer_XX/...; dY's stochastically rounded codes"
    " are checked to be one of their two E2M1 neighbours. 0: off. Losses are the same either way.")


CALIBRATION = Tap(
    name="calibration", what="the calibration", prefix="nvfp4/calibration/", columns=("amax",),
    experts=ExpertReduction.MAX, measure=f"{_MEASURES}:calibrating",
    description="Every N training steps (step 0 included), each NVFP4 GEMM records the amax of its operands as it"
    " receives them (x, W, dY; before quantization) as maxtext metrics named nvfp4/calibration/layer_XX/...: what"
    " `python -m MaxText.export --activations calibrate` reads for the W4A4 input scales. 0: off. Losses are the"
    " same either way.")


def _installed() -> tuple[Tap, ...]:
  """The taps other distributions declare (ENTRY_POINT_GROUP), each checked to be a Tap."""
  found = []
  for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
    tap = point.load()
    if not isinstance(tap, Tap):
      raise TypeError(f"entry point {point.name} = {point.value} in group {ENTRY_POINT_GROUP} is a "
                      f"{type(tap).__name__}, not a MaxText.precision.taps.Tap")
    found.append(tap)
  return tuple(found)


def _checked(taps: tuple[Tap, ...]) -> tuple[Tap, ...]:
  """Refuses two taps with one name (one key, one variable) or one prefix (telemetry could not tell them apart), or
  one variable name (a tap's weight-gradient variable is another's)."""
  for field in ("name", "prefix"):
    values = [getattr(t, field) for t in taps]
    if (twice := sorted({v for v in values if values.count(v) > 1})):
      raise ValueError(f"two taps declare {field}={twice[0]!r}; each tap needs its own {field}")
  variables = [v for t in taps for v in t.variables]
  if (twice := sorted({v for v in variables if variables.count(v) > 1})):
    raise ValueError(f"two taps keep a variable named {twice[0]!r} (a name, or a name's weight-gradient variable "
                     "name_wgrad); rename one")
  return taps


#: Every tap, built-in first: the statistics, the audit, the calibration, then the installed ones in entry-point order.
TAPS: tuple[Tap, ...] = _checked((STATISTICS, AUDIT, CALIBRATION, *_installed()))
