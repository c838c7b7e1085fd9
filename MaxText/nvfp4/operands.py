# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The operands one NVFP4 GEMM quantizes, as one table (docs/numerics.md#which-operand-gets-what).

Why a module of its own: the statistics (stats.py), the audit (audit.py), the training pipeline's taps and the
self-check all describe the same five operands, in the same order, as rows of their arrays; this table is that order
and what each operand is, so none of them writes it again.

For y = x W (x: M x K, W: K x N, dY: M x N):
  fprop_x   x 1D along K                        fprop_w   W 16x16 tiles (or 1D along K)
  dgrad_dy  dY 1D along N, stochastic           wgrad_x   x^T 1D along M, RHT
  wgrad_dy  dY^T 1D along M, RHT, stochastic
(dgrad's W is fprop's tiles; with 1D weights it is W 1D along N, which no table row describes.)
"""

from __future__ import annotations

import dataclasses

from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.nvfp4.quantize import Scaling

__all__ = ["BACKWARD_ROWS", "FORWARD_ROWS", "GEMM_OPERANDS", "Operand", "gemm_operands"]


@dataclasses.dataclass(frozen=True)
class Operand:
  """One operand of an NVFP4 GEMM y = x W (x: M x K, W: K x N, dY: M x N) as the recipe quantizes it."""

  name: str  # one of GEMM_OPERANDS: fprop_x, fprop_w, dgrad_dy, wgrad_x, wgrad_dy
  source: str  # the tensor it is made from: "x", "w" or "dy"
  scaling: Scaling
  axis: int  # the axis of the 2-D tensor its 1D blocks run along: -1 (K of x, N of dY) or 0 (M, or K of a 1D W)
  rht: bool
  stochastic: bool


def gemm_operands(recipe: GemmRecipe) -> tuple[Operand, ...]:
  """The five operands one GEMM quantizes under `recipe`, in GEMM_OPERANDS order."""
  w_scaling, w_axis = (Scaling.TWO_D, -1) if recipe.weight_2d else (Scaling.ONE_D, 0)
  sr = recipe.stochastic_rounding
  return (Operand("fprop_x", "x", Scaling.ONE_D, -1, False, False),
          Operand("fprop_w", "w", w_scaling, w_axis, False, False),
          Operand("dgrad_dy", "dy", Scaling.ONE_D, -1, False, sr),
          Operand("wgrad_x", "x", Scaling.ONE_D, 0, recipe.rht, False),
          Operand("wgrad_dy", "dy", Scaling.ONE_D, 0, recipe.rht, sr))


_TABLE = gemm_operands(GemmRecipe())

#: The operands' names, in the order of the rows of every per-GEMM array (statistics, audit counts).
GEMM_OPERANDS = tuple(o.name for o in _TABLE)
#: Rows known in the forward pass (made from x and W) and in the backward pass (made from dY).
FORWARD_ROWS = tuple(i for i, o in enumerate(_TABLE) if o.source != "dy")
BACKWARD_ROWS = tuple(i for i, o in enumerate(_TABLE) if o.source == "dy")
