# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The operand table: one order for every per-GEMM array, and what the recipe switches change in it."""

import itertools

import pytest

from MaxText.nvfp4 import operands, stats
from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.nvfp4.quantize import Scaling

_RECIPES = [GemmRecipe(rht=r, stochastic_rounding=s, weight_2d=w) for r, s, w in itertools.product((True, False), repeat=3)]


def test_the_rows_are_the_five_operands_split_by_the_pass_that_knows_them():
  assert operands.GEMM_OPERANDS == ("fprop_x", "fprop_w", "dgrad_dy", "wgrad_x", "wgrad_dy")
  assert operands.FORWARD_ROWS == (0, 1, 3) and operands.BACKWARD_ROWS == (2, 4)
  # The stats use the table's objects, not copies of them (nothing else defines them).
  assert stats.GEMM_OPERANDS is operands.GEMM_OPERANDS and stats.FORWARD_ROWS is operands.FORWARD_ROWS
  assert stats.BACKWARD_ROWS is operands.BACKWARD_ROWS


@pytest.mark.parametrize("recipe", _RECIPES, ids=str)
def test_each_switch_changes_only_its_operands(recipe):
  table = {o.name: o for o in operands.gemm_operands(recipe)}
  assert tuple(table) == operands.GEMM_OPERANDS
  assert [table[n].rht for n in operands.GEMM_OPERANDS] == [False, False, False, recipe.rht, recipe.rht]
  sr = recipe.stochastic_rounding
  assert [table[n].stochastic for n in operands.GEMM_OPERANDS] == [False, False, sr, False, sr]
  w = table["fprop_w"]
  assert (w.scaling, w.axis) == ((Scaling.TWO_D, -1) if recipe.weight_2d else (Scaling.ONE_D, 0))
