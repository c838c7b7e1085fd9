# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The emulated backend's dense GEMM module: MaxText.nvfp4's pure-JAX NVFP4 GEMM for one DenseGeneral.

maxtext's DenseGeneral instantiates the class its quant object hands it with no arguments, wraps it in ToNNX and
calls it as `dot_general(inputs, kernel, dimension_numbers, precision=None)` with only the "aqt" collection
mutable; `UnquantizedDotGeneral` is the same call without quantization (BF16 GEMMs of an NVFP4 run), and
`MeasuredDotGeneral` that call with its weight gradient measured (the BF16 MLP GEMMs of a run with
nvfp4_mlp_precision=bf16 and the statistics on). The NVFP4 GEMM goes through the pipeline
(MaxText.backends.pipeline) with `core` as its core.
"""

from __future__ import annotations

from typing import Any, Protocol

import flax.linen as nn
import jax

from MaxText.backends import pipeline
from MaxText.backends.sr import sr_key
from MaxText.backends.stages import Core
from MaxText.nvfp4 import audit
from MaxText.nvfp4.gemm import BlockScaledGemm, DimensionNumbers, GemmRecipe, nvfp4_dot_general, nvfp4_matmul
from MaxText.precision.settings import Settings

__all__ = ["DotGeneralModule", "MeasuredDotGeneral", "Nvfp4DotGeneral", "UnquantizedDotGeneral", "core",
           "unquantized"]


class DotGeneralModule(Protocol):
  """What DenseGeneral calls: `module(inputs, kernel, dimension_numbers, precision=None)`."""

  def __call__(self, lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any, precision: Any = None) -> jax.Array:
    ...


def unquantized(dimension_numbers: Any, out_dtype: Any = None) -> Any:
  """The GEMM a BF16 layer (or a step past a switch) runs instead: `lax.dot_general` cast to lhs's dtype."""
  return lambda left, right: jax.lax.dot_general(left, right, dimension_numbers).astype(out_dtype or left.dtype)


def core(lhs: jax.Array, rhs: jax.Array, dimension_numbers: DimensionNumbers, recipe: GemmRecipe,
         block_gemm: BlockScaledGemm | None = None) -> Core:
  """The pure-JAX NVFP4 GEMM of lhs . rhs as the pipeline's core; its `extra` is the stochastic-rounding key. Its VJP
  parts are the numerics' own (Nvfp4Matmul), so after the forward-only switch only the BF16 forward GEMM runs.
  `block_gemm`: None for the emulated backend's dot on dequantized operands, or the fused backend's block-scaled
  GEMM."""
  parts = nvfp4_matmul(lhs, rhs, dimension_numbers, recipe, block_gemm)
  return Core(call=lambda left, right, key: nvfp4_dot_general(left, right, dimension_numbers, key=key, recipe=recipe,
                                                              block_gemm=block_gemm),
              residuals=parts.residuals, fprop=parts.fprop, backward=parts.backward)


class Nvfp4DotGeneral(nn.Module):
  """Pure-JAX NVFP4 GEMM (MaxText.nvfp4.gemm) for one DenseGeneral, through the pipeline: the emulated backend's
  (block_gemm None: a dot on dequantized operands) or the fused backend's (codes and scales into a block-scaled
  GEMM: TE's on Blackwell, jax.nn.scaled_matmul elsewhere)."""

  settings: Settings
  block_gemm: BlockScaledGemm | None = None

  @nn.compact
  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    del precision, preferred_element_type  # NVFP4 fixes both: FP4 operands, f32 accumulation, lhs dtype out
    recipe = self.settings.recipe
    key = sr_key(self) if recipe.stochastic_rounding else None
    state, sinks = pipeline.stages_of(self, self.settings, guard=False, candidate=audit.emulated)
    bf16 = unquantized(dimension_numbers)
    def nvfp4_core(left, right):
      return core(left, right, dimension_numbers, recipe, self.block_gemm)

    gemm = pipeline.assembled(state, nvfp4_core, bf16, dimension_numbers)
    return gemm(lhs, rhs, (key, sinks))


class UnquantizedDotGeneral(nn.Module):
  """The GEMM as maxtext computes it without quantization: lax.dot_general in the operands' dtype."""

  @nn.compact
  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)


class MeasuredDotGeneral(nn.Module):
  """UnquantizedDotGeneral whose weight gradient the statistics measure (Settings.bf16_mlp_taps: the zero shares of
  a BF16 MLP GEMM, to hold beside an NVFP4 run's): the same lax.dot_general, so the same outputs and gradients, with
  the weight passed through the gradient stage (MaxText.backends.stages.measured_weight) on its way in."""

  settings: Settings

  @nn.compact
  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    state, sinks = pipeline.stages_of(self, self.settings, guard=False, candidate=audit.emulated, quantized=False)
    rhs = pipeline.measured_weight(state, sinks, rhs, tuple(dimension_numbers[0][1]))
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
