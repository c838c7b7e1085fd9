# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The emulated backend's dense GEMM module: MaxText.nvfp4's pure-JAX NVFP4 GEMM for one DenseGeneral.

maxtext's DenseGeneral instantiates the class its quant object hands it with no arguments, wraps it in ToNNX and
calls it as `dot_general(inputs, kernel, dimension_numbers, precision=None)` with only the "aqt" collection
mutable; `UnquantizedDotGeneral` is the same call without quantization (BF16 GEMMs of an NVFP4 run).
"""

from __future__ import annotations

from typing import Any, Protocol

import flax.linen as nn
import jax

from MaxText.backends.flags import gemm_flags
from MaxText.backends.sr import sr_key
from MaxText.backends.telemetry import with_stats
from MaxText.nvfp4.gemm import GemmRecipe, nvfp4_dot_general, select_bf16
from MaxText.precision.switches import Switches

__all__ = ["DotGeneralModule", "Nvfp4DotGeneral", "UnquantizedDotGeneral", "unquantized"]


class DotGeneralModule(Protocol):
  """What DenseGeneral calls: `module(inputs, kernel, dimension_numbers, precision=None)`."""

  def __call__(self, lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any, precision: Any = None) -> jax.Array:
    ...


def unquantized(dimension_numbers: Any, out_dtype: Any = None) -> Any:
  """The GEMM a BF16 layer (or a step past a switch) runs instead: `lax.dot_general` cast to lhs's dtype."""
  return lambda l, r: jax.lax.dot_general(l, r, dimension_numbers).astype(out_dtype or l.dtype)


class Nvfp4DotGeneral(nn.Module):
  """Emulated NVFP4 GEMM (pure JAX, MaxText.nvfp4.gemm) for one DenseGeneral."""

  recipe: GemmRecipe = GemmRecipe()
  switches: Switches = Switches()
  stats_interval: int = 0  # nvfp4_stats_interval: operand statistics every N steps (MaxText.backends.telemetry)

  @nn.compact
  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    del precision, preferred_element_type  # NVFP4 fixes both: FP4 operands, f32 accumulation, lhs dtype out
    key = sr_key(self) if self.recipe.stochastic_rounding else None
    all_bf16, forward_bf16 = gemm_flags(self, self.switches)

    def nvfp4(lhs, rhs, extra):
      key, forward_bf16 = extra
      return nvfp4_dot_general(lhs, rhs, dimension_numbers, key=key, recipe=self.recipe,
                               forward_bf16=False if forward_bf16 is None else forward_bf16)

    nvfp4, extra = with_stats(self, nvfp4, (key, forward_bf16), dimension_numbers, self.recipe,
                              self.stats_interval)
    # A BF16 layer, or past nvfp4_bf16_from_step: the GEMM UnquantizedDotGeneral runs, forward and backward.
    return select_bf16(all_bf16, unquantized(dimension_numbers), lambda l, r: nvfp4(l, r, extra), lhs, rhs)


class UnquantizedDotGeneral(nn.Module):
  """The GEMM as maxtext computes it without quantization: lax.dot_general in the operands' dtype."""

  @nn.compact
  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
