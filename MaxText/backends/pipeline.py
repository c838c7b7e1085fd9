# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Every NVFP4 GEMM through one pipeline: a backend's core GEMM and the cross-cutting stages, in one order.

From the operands inward (MaxText.backends.stages defines each stage once):
  1. guard           TE backend, nvfp4_nonfinite_check: a non-finite operand poisons the outputs that read it. The
                     outermost stage, so its checks fuse into the operands' producers and its poison into the
                     outputs' consumers, around the conditionals below (the emulated quantizer needs none: its
                     GEMM operands make a block holding a NaN or Inf NaN).
  2. select_bf16     a BF16 decoder layer (nvfp4_bf16_first/last_layers, nvfp4_bf16_layers) or a step past
                     nvfp4_bf16_from_step: the unquantized GEMM instead, forward and backward (`lax.cond`).
  3. taps            the periodic measurements of the operands the GEMM quantizes, each every nvfp4_<tap>_interval
                     steps (MaxText.precision.taps: the statistics, the audit of the backend's quantizer, ...), and
                     of its weight gradient (Tap.gradient: the statistics' zero shares).
  4. forward_switch  past nvfp4_bf16_forward_from_step: the BF16 forward output, the core's gradients.
  5. the core        the emulated NVFP4 GEMM (MaxText.nvfp4.gemm), TE's dense, or one expert's GEMM. Its
                     stochastic-rounding key (sr.sr_key: per layer, per step) travels in the core's `extra`.
Expert GEMMs run 3-5 per expert (vmapped by MaxText.nvfp4.grouped), and 1-2 around all experts at once.

What the stages need per call (`Stages`) is read off the Linen module that runs the GEMM (`stages_of`): the switch
flags (flags.gemm_flags: this GEMM's decoder layer, the training step), each tap's variable and whether this step
measures (Tap.is_step: the one rule the host uses too). A BF16 MLP GEMM of a run whose MLP runs BF16 measures its
weight gradient alone (`stages_of(..., quantized=False)`, `measured_weight`): the baseline's figures.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from MaxText.backends import stages
from MaxText.backends.flags import current_step, gemm_flags
from MaxText.nvfp4.gemm import DimensionNumbers, as_matrices
from MaxText.precision.measures import BackendQuantizer, Measure
from MaxText.precision.settings import Settings

__all__ = ["OVERWRITE_COLLECTION", "Stages", "assembled", "inner", "measured_weight", "outer", "stages_of"]

#: maxtext's collection whose variables its train step overwrites with their gradient (FP8 delayed scaling's amax
#: history uses it; so do the taps' sinks, and TE's quantizer metadata, of which NVFP4 has none).
OVERWRITE_COLLECTION = "_overwrite_with_gradient"


@dataclasses.dataclass(frozen=True)
class Stages:
  """The per-call state of the stages around one GEMM (traced values; None where a stage does not apply).

  all_bf16: select_bf16's flag. forward_bf16: forward_switch's flag. guard: whether to guard (TE, NVFP4).
  taps: (measure, flag) of each tap, in order; gradients: (Measure.gradient, flag) of each tap that measures the
  weight gradient too. Their sinks travel in the GEMM's `extra` (they are differentiated): the taps' first, then the
  gradients'.
  """

  all_bf16: jax.Array | None
  forward_bf16: jax.Array | None
  guard: bool
  taps: tuple[tuple[Measure, jax.Array], ...]
  gradients: tuple[tuple[Callable[[jax.Array, tuple[int, ...]], jax.Array], jax.Array], ...] = ()


def stages_of(module: Any, settings: Settings, guard: bool, candidate: BackendQuantizer,
              sink_shape: tuple[int, ...] = (), quantized: bool = True) -> tuple[Stages, tuple[jax.Array, ...]]:
  """(Stages, sink values) of one NVFP4 GEMM module (or one RoutedMoE layer's expert state), inside its compact call.

  Creates the module's variables of each tap the run measures with (Settings.taps_on, MaxText.precision.taps; a
  tap's weight-gradient variable too where it has one; `sink_shape` leading axes before each array: (expert GEMMs,
  experts) for an expert layer); `candidate` is the backend's quantizer the audit holds against ours. Outside a
  train/eval step (model init, abstract builds) no tap applies: the variables are created and the GEMM runs untapped.
  `quantized=False`: a BF16 MLP GEMM (Settings.bf16_mlp_taps): no switch, only the weight-gradient variables.
  """
  all_bf16, forward_bf16 = gemm_flags(module, settings.switches) if quantized else (None, None)
  taps, gradients, sinks, gradient_sinks = [], [], [], []
  step = current_step()
  live = step is not None and not module.is_initializing()
  for tap in settings.taps_on if quantized else settings.bf16_mlp_taps:
    measure = tap.measure_of(settings.recipe, candidate)
    flag = tap.is_step(settings, step) if live else None
    if quantized:
      sink = module.variable(OVERWRITE_COLLECTION, tap.variable,
                             lambda m=measure: jnp.broadcast_to(m.empty(), (*sink_shape, *m.empty().shape)))
      if live:
        taps.append((measure, flag))
        sinks.append(sink.value)
    if tap.gradient:
      sink = module.variable(OVERWRITE_COLLECTION, tap.gradient_variable,
                             lambda t=tap: jnp.zeros((*sink_shape, 1, len(t.gradient)), jnp.float32))
      if live:
        gradients.append((measure.gradient, flag))
        gradient_sinks.append(sink.value)
  state = Stages(all_bf16=all_bf16, forward_bf16=forward_bf16, guard=guard, taps=tuple(taps),
                 gradients=tuple(gradients))
  return state, (*sinks, *gradient_sinks)


def measured_weight(state: Stages, sinks: tuple[jax.Array, ...], w: jax.Array, contracting: tuple[int, ...],
                    experts: bool = False) -> jax.Array:
  """`w` with its weight gradient measured by each of `state`'s gradients (stages.measured_weight) into the last
  len(state.gradients) of `sinks`: the gradient stage of a GEMM outside the pipeline (BF16 MLP GEMMs).
  `contracting`: w's axes the GEMM contracts; `experts`: w is a stack of experts (axis 0), each measured alone,
  `contracting` then counted within one expert's weight."""
  for (gradient, flag), sink in zip(state.gradients, sinks[len(sinks) - len(state.gradients):]):
    measure = functools.partial(gradient, contracting=contracting)
    w = stages.measured_weight(w, jax.vmap(measure) if experts else measure, sink, flag)
  return w


def inner(core: stages.Core, state: Stages, bf16: Callable[[jax.Array, jax.Array], jax.Array],
          dimension_numbers: DimensionNumbers) -> stages.Gemm:
  """Stages 3-4 around the core: `gemm(lhs, rhs, (core_extra, sinks))`. For expert GEMMs this runs per expert."""
  switched = stages.forward_switch(core, bf16, state.forward_bf16)

  contracting = tuple(dimension_numbers[0][1])  # rhs's contracting axes: dW's K, the rest its output channels

  def gemm(lhs, rhs, extra):
    core_extra, sinks = extra
    run = switched
    for (measure, flag), sink in zip(state.taps, sinks):
      run = stages.tap(run, measure, lambda left, right: as_matrices(left, right, dimension_numbers), sink, flag)
    for (gradient, flag), sink in zip(state.gradients, sinks[len(state.taps):]):
      run = stages.gradient_tap(run, functools.partial(gradient, contracting=contracting), sink, flag)
    return run(lhs, rhs, core_extra)

  return gemm


def outer(gemm: Callable[..., jax.Array], state: Stages, bf16: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
  """Stages 1-2 around a GEMM (a dense GEMM's `inner`, or all experts' GEMMs of one layer): `gemm(*operands, extra)`
  (the operands it is differentiated in: (x, w), or (x, w, group_sizes) for the grouped expert GEMM)."""

  def selected(*operands_and_extra):
    *operands, extra = operands_and_extra
    return stages.select_bf16(state.all_bf16, bf16, lambda *ops: gemm(*ops, extra), *operands)

  if not state.guard:
    return selected
  return stages.guard(selected)


def assembled(state: Stages, core: Callable[[jax.Array, jax.Array], stages.Core],
              bf16: Callable[[jax.Array, jax.Array], jax.Array], dimension_numbers: DimensionNumbers, *,
              over_experts: Callable[[stages.Gemm], Callable[..., jax.Array]] | None = None,
              bf16_all: Callable[..., jax.Array] | None = None) -> Callable[..., jax.Array]:
  """The whole pipeline around a backend's core, in the module docstring's order: `gemm(*operands, extra)` with
  extra = (the core's extra, the taps' sinks). Every backend builds its GEMM here (emulated, TE, experts).

  core(lhs, rhs): the backend's core for one GEMM's operands (their shapes); bf16: that GEMM unquantized.
  over_experts(inner) -> gemm(*operands, extra): maps the inner stages (3-4, per expert) over all experts of a layer
  (MaxText.nvfp4.grouped); `bf16_all(*operands)` is then the unquantized GEMM of all of them, for stages 1-2.
  """

  def one(lhs: jax.Array, rhs: jax.Array, extra: Any) -> jax.Array:
    return inner(core(lhs, rhs), state, bf16, dimension_numbers)(lhs, rhs, extra)

  if over_experts is None:
    return outer(one, state, bf16)
  return outer(over_experts(one), state, bf16 if bf16_all is None else bf16_all)
