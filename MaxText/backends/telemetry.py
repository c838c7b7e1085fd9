# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Per-GEMM quantization statistics inside a GEMM module (nvfp4_stats_interval), on both backends.

Each NVFP4 GEMM module holds its latest statistics in a `nvfp4_stats` variable of maxtext's
`_overwrite_with_gradient` collection (5 operands x 4 statistics, float32; stacked along the layer axis under
scan). maxtext's train_step differentiates the loss with respect to that collection too and then overwrites each
such variable with its gradient (the route FP8 delayed scaling uses for its amax history); the GEMM makes the
statistics that gradient (MaxText.nvfp4.stats.gemm_with_operand_stats), so the backward operand dY is measured
without leaving the custom VJP. On steps that are not statistics steps the gradient is the variable's own value,
and nothing is computed (`lax.cond` on the traced step). The integration layer reads the variables after each
step into maxtext's metrics (MaxText.integration.telemetry).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from MaxText.backends.flags import current_step
from MaxText.nvfp4.gemm import DimensionNumbers, GemmRecipe
from MaxText.nvfp4.stats import empty_gemm_stats, gemm_with_operand_stats

__all__ = ["STATS_COLLECTION", "STATS_NAME", "stats_flag", "with_stats"]

#: maxtext's collection whose variables the train step overwrites with their gradient.
STATS_COLLECTION = "_overwrite_with_gradient"
STATS_NAME = "nvfp4_stats"


def stats_flag(interval: int) -> jax.Array | None:
  """Inside a traced train/eval step: whether this step measures (`step % interval == 0`); None outside one."""
  step = current_step()
  return None if step is None or not interval else (step % interval) == 0


def with_stats(module: Any, gemm: Callable[[jax.Array, jax.Array, Any], jax.Array], extra: Any,
               dimension_numbers: DimensionNumbers, recipe: GemmRecipe,
               interval: int) -> tuple[Callable[[jax.Array, jax.Array, Any], jax.Array], Any]:
  """Inside a Linen GEMM module: (`tapped`, `tapped_extra`) such that `tapped(lhs, rhs, tapped_extra)` is
  `gemm(lhs, rhs, extra)` reporting its operands' statistics every `interval` steps (0: no statistics, no variable).

  The statistics leave as the cotangent of the module's variable, so its value travels in `tapped_extra` (with
  `extra`) as an explicit argument: a caller may wrap `tapped` in a custom VJP of its own (the TE backend's
  non-finite guard), which must not close over a value being differentiated. Outside a train/eval step (model init,
  abstract builds) the variable is created and `gemm` runs untapped.
  """
  if not interval:
    return gemm, extra
  sink = module.variable(STATS_COLLECTION, STATS_NAME, empty_gemm_stats)
  flag = stats_flag(interval)
  if flag is None or module.is_initializing():
    return gemm, extra

  def tapped(lhs: jax.Array, rhs: jax.Array, extra_and_sink: tuple[Any, jax.Array]) -> jax.Array:
    inner, sink_value = extra_and_sink
    return gemm_with_operand_stats(gemm, lhs, rhs, inner, sink_value, flag, dimension_numbers, recipe)

  return tapped, (extra, sink.value)
