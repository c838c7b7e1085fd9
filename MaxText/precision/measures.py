# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What each built-in tap measures (jax code): the measurements the tap registry (MaxText.precision.taps, jax-free
declarations) names by "module:function", resolved when a GEMM is built with the tap on.

Why apart from the declarations: the registry is read by the tools that must not load jax (the comparison of runs,
the run record's schema: MaxText.precision.keys, MaxText.integration.artifacts); only the training pipeline measures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from MaxText.nvfp4 import audit
from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.nvfp4.operands import BACKWARD_ROWS, FORWARD_ROWS, GEMM_OPERANDS, Operand, gemm_operands
from MaxText.nvfp4.stats import STAT_NAMES, backward_operand_stats, forward_operand_stats, weight_gradient_stats

__all__ = ["BackendQuantizer", "Measure", "auditing", "calibrating", "operand_rows", "statistics"]

#: A backend's quantizer as the audit holds it against ours: (2-D tensor, operand) -> (codes, scales, amax) as bits
#: in the operand's blocked orientation (MaxText.nvfp4.audit.Encoded's layout).
BackendQuantizer = Callable[[jax.Array, Operand], tuple[jax.Array, jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class Measure:
  """What a tap measures of one GEMM's operands, as rows of a float32 array (rows x columns).

  forward(x, w): the rows known in the forward pass, from x (M x K) and W (K x N) as the GEMM sees them.
  backward(dy): the rows known in the backward pass, from dY (M x N).
  forward_rows / backward_rows: where those rows go in the whole array; `empty()` is the array before any step.
  gradient(dw, contracting): the tap's weight-gradient row (1 x Tap.gradient columns) from dW in the weight's own
    layout, `contracting` its axes the GEMM contracts; None for a tap without one (Tap.gradient).
  """

  forward: Callable[[jax.Array, jax.Array], jax.Array]
  backward: Callable[[jax.Array], jax.Array]
  forward_rows: tuple[int, ...]
  backward_rows: tuple[int, ...]
  empty: Callable[[], jax.Array]
  gradient: Callable[[jax.Array, tuple[int, ...]], jax.Array] | None = None


def operand_rows(columns: tuple[str, ...], forward: Callable[[jax.Array, jax.Array], jax.Array],
                 backward: Callable[[jax.Array], jax.Array]) -> Measure:
  """A Measure from its forward rows (of x and W) and backward rows (of dY), placed by the operand table
  (GEMM_OPERANDS, FORWARD_ROWS, BACKWARD_ROWS), `columns` wide."""
  return Measure(forward=forward, backward=backward, forward_rows=FORWARD_ROWS, backward_rows=BACKWARD_ROWS,
                 empty=lambda: jnp.zeros((len(GEMM_OPERANDS), len(columns)), jnp.float32))


def statistics(recipe: GemmRecipe, candidate: BackendQuantizer) -> Measure:
  """The per-GEMM statistics (MaxText.nvfp4.stats: the operands as the recipe quantizes them; nearest rounding
  stands in for dY's stochastic rounding), and the shares of the weight gradient that are exactly zero."""
  operands = operand_rows(STAT_NAMES, lambda x, w: forward_operand_stats(x, w, recipe),
                          lambda dy: backward_operand_stats(dy, recipe))
  return dataclasses.replace(operands, gradient=lambda dw, contracting: weight_gradient_stats(dw, contracting)[None])


def auditing(recipe: GemmRecipe, candidate: BackendQuantizer) -> Measure:
  """Each operand the GEMM quantizes, quantized by the backend's `candidate` and by ours (MaxText.nvfp4.audit), the
  mismatches counted; rows in GEMM_OPERANDS order, as the statistics'."""
  operands = gemm_operands(recipe)

  def rows(tensors: dict[str, jax.Array], rows: tuple[int, ...]) -> jax.Array:
    names = {GEMM_OPERANDS[i] for i in rows}
    return jnp.stack([audit.audited(tensors[o.source], o, *candidate(tensors[o.source], o))
                      for o in operands if o.name in names])

  return operand_rows(audit.COLUMNS, lambda x, w: rows({"x": x, "w": w}, FORWARD_ROWS),
                      lambda dy: rows({"dy": dy}, BACKWARD_ROWS))


def _amax(t: jax.Array) -> jax.Array:
  return jnp.max(jnp.abs(t)).astype(jnp.float32)


def calibrating(recipe: GemmRecipe, candidate: BackendQuantizer) -> Measure:
  """Each operand's amax as the GEMM receives it, before any quantization or RHT: x (fprop and wgrad rows), W, dY.
  Why raw: a serving format's input scale is set from the activation's amax (docs/export.md#activations)."""
  del recipe, candidate  # nothing quantized
  return operand_rows(("amax",), lambda x, w: jnp.stack([_amax(x), _amax(w), _amax(x)])[:, None],
                      lambda dy: jnp.stack([_amax(dy), _amax(dy)])[:, None])
