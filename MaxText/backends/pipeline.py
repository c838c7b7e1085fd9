# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Every NVFP4 GEMM through one pipeline: a backend's core GEMM and the cross-cutting stages, in one order.

From the operands inward (MaxText.backends.stages defines each stage once):
  1. guard           TE backend, nvfp4_nonfinite_check: a non-finite operand poisons the outputs that read it. The
                     outermost stage, so its checks fuse into the operands' producers and its poison into the
                     outputs' consumers, around the conditionals below (the emulated quantizer needs none: its
                     GEMM operands make a block holding a NaN or Inf NaN).
  2. select_bf16     a BF16 decoder layer (nvfp4_bf16_first/last_layers, nvfp4_bf16_layers) or a step past
                     nvfp4_bf16_from_step: the unquantized GEMM instead, forward and backward (`lax.cond`).
  3. taps            every nvfp4_stats_interval steps, the per-GEMM statistics of the operands the GEMM quantizes;
                     every nvfp4_audit_interval steps, the audit: the backend's quantized operands against ours.
  4. forward_switch  past nvfp4_bf16_forward_from_step: the BF16 forward output, the core's gradients.
  5. the core        the emulated NVFP4 GEMM (MaxText.nvfp4.gemm), TE's dense, or one expert's GEMM. Its
                     stochastic-rounding key (sr.sr_key: per layer, per step) travels in the core's `extra`.
Expert GEMMs run 3-5 per expert (vmapped by MaxText.nvfp4.grouped), and 1-2 around all experts at once.

What the stages need per call (`Stages`) is read off the Linen module that runs the GEMM (`stages_of`): the switch
flags (flags.gemm_flags: this GEMM's decoder layer, the training step), the statistics variable and whether this
step measures (Settings.is_stats_step: the one rule the host uses too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from MaxText.backends import stages
from MaxText.backends.flags import current_step, gemm_flags
from MaxText.nvfp4 import audit
from MaxText.nvfp4.gemm import DimensionNumbers, GemmRecipe, as_matrices
from MaxText.nvfp4.stats import (
  BACKWARD_ROWS,
  FORWARD_ROWS,
  GEMM_OPERANDS,
  backward_operand_stats,
  empty_gemm_stats,
  forward_operand_stats,
)
from MaxText.precision.settings import Settings

__all__ = ["AUDIT_NAME", "OVERWRITE_COLLECTION", "STATS_NAME", "Candidate", "Stages", "auditing", "empty_audit",
           "inner", "outer", "stages_of", "statistics"]

#: maxtext's collection whose variables its train step overwrites with their gradient (FP8 delayed scaling's amax
#: history uses it; so do the taps' sinks, and TE's quantizer metadata, of which NVFP4 has none).
OVERWRITE_COLLECTION = "_overwrite_with_gradient"
#: The statistics variable of each NVFP4 GEMM (operands x statistics; stacked along the layer axis under scan).
STATS_NAME = "nvfp4_stats"
#: The audit variable of each NVFP4 GEMM (operands x audit.COLUMNS: mismatching codes, scales, amax).
AUDIT_NAME = "nvfp4_audit"
#: A backend's quantizer as the audit holds it against ours: (2-D tensor, operand) -> (codes, scales, amax) as bits
#: in the operand's blocked orientation (MaxText.nvfp4.audit.Encoded's layout).
Candidate = Callable[[jax.Array, audit.Operand], tuple[jax.Array, jax.Array, jax.Array]]


def statistics(recipe: GemmRecipe) -> stages.Measure:
  """The per-GEMM statistics as a tap measures them (MaxText.nvfp4.stats: the operands as the recipe quantizes
  them; nearest rounding stands in for dY's stochastic rounding)."""
  return stages.Measure(forward=lambda x, w: forward_operand_stats(x, w, recipe),
                        backward=lambda dy: backward_operand_stats(dy, recipe), forward_rows=FORWARD_ROWS,
                        backward_rows=BACKWARD_ROWS, empty=empty_gemm_stats)


def empty_audit() -> jax.Array:
  """The audit array of one GEMM before any audit step: zeros, (operands, audit.COLUMNS)."""
  return jnp.zeros((len(GEMM_OPERANDS), len(audit.COLUMNS)), jnp.float32)


def auditing(recipe: GemmRecipe, candidate: Candidate) -> stages.Measure:
  """The audit as a tap measures it: each operand the GEMM quantizes, quantized by the backend's `candidate` and by
  ours (MaxText.nvfp4.audit), the mismatches counted; rows in GEMM_OPERANDS order, as the statistics'."""
  operands = audit.gemm_operands(recipe)

  def rows(tensors: dict[str, jax.Array], names: tuple[str, ...]) -> jax.Array:
    found = []
    for operand in (o for o in operands if o.name in names):
      tensor = tensors[operand.source]
      found.append(audit.audited(tensor, operand, *candidate(tensor, operand)))
    return jnp.stack(found)

  forward_names = tuple(GEMM_OPERANDS[i] for i in FORWARD_ROWS)
  backward_names = tuple(GEMM_OPERANDS[i] for i in BACKWARD_ROWS)
  return stages.Measure(forward=lambda x, w: rows({"x": x, "w": w}, forward_names),
                        backward=lambda dy: rows({"dy": dy}, backward_names), forward_rows=FORWARD_ROWS,
                        backward_rows=BACKWARD_ROWS, empty=empty_audit)


@dataclasses.dataclass(frozen=True)
class Stages:
  """The per-call state of the stages around one GEMM (traced values; None where a stage does not apply).

  all_bf16: select_bf16's flag. forward_bf16: forward_switch's flag. guard: whether to guard (TE, NVFP4).
  taps: (measure, flag) of each tap, in order; their sinks travel in the GEMM's `extra` (they are differentiated).
  """

  all_bf16: jax.Array | None
  forward_bf16: jax.Array | None
  guard: bool
  taps: tuple[tuple[stages.Measure, jax.Array], ...]


def stages_of(module: Any, settings: Settings, guard: bool, candidate: Candidate, sink_shape: tuple[int, ...] = ()
              ) -> tuple[Stages, tuple[jax.Array, ...]]:
  """(Stages, sink values) of one NVFP4 GEMM module (or one RoutedMoE layer's expert state), inside its compact call.

  Creates the module's statistics and audit variables where nvfp4_stats_interval / nvfp4_audit_interval are set
  (`sink_shape` leading axes before each array: (expert GEMMs, experts) for an expert layer); `candidate` is the
  backend's quantizer the audit holds against ours. Outside a train/eval step (model init, abstract builds) no tap
  applies: the variables are created and the GEMM runs untapped.
  """
  all_bf16, forward_bf16 = gemm_flags(module, settings.switches)
  taps, sinks = [], []
  step = current_step()
  for name, interval, measure, is_step in (
      (STATS_NAME, settings.stats_interval, lambda: statistics(settings.recipe), settings.is_stats_step),
      (AUDIT_NAME, settings.audit_interval, lambda: auditing(settings.recipe, candidate), settings.is_audit_step)):
    if not interval:
      continue
    tap = measure()
    sink = module.variable(OVERWRITE_COLLECTION, name, lambda t=tap: jnp.broadcast_to(t.empty(), (*sink_shape,
                                                                                                    *t.empty().shape)))
    if step is not None and not module.is_initializing():
      taps.append((tap, is_step(step)))
      sinks.append(sink.value)
  return Stages(all_bf16=all_bf16, forward_bf16=forward_bf16, guard=guard, taps=tuple(taps)), tuple(sinks)


def inner(core: stages.Core, state: Stages, bf16: Callable[[jax.Array, jax.Array], jax.Array],
          dimension_numbers: DimensionNumbers) -> stages.Gemm:
  """Stages 3-4 around the core: `gemm(lhs, rhs, (core_extra, sinks))`. For expert GEMMs this runs per expert."""
  switched = stages.forward_switch(core, bf16, state.forward_bf16)

  def gemm(lhs, rhs, extra):
    core_extra, sinks = extra
    run = switched
    for (measure, flag), sink in zip(state.taps, sinks):
      run = stages.tap(run, measure, lambda left, right: as_matrices(left, right, dimension_numbers), sink, flag)
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
