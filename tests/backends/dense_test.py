# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The module table from (precision, backend) to a GEMM module, and the TE recipe arguments (no TE needed)."""

import flax.linen as nn
import pytest

from MaxText.backends import te as te_backend
from MaxText.backends.dense import module_class
from MaxText.backends.emulated import Nvfp4DotGeneral, UnquantizedDotGeneral
from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.precision.modes import Backend
from MaxText.precision.policy import Precision
from tests.helpers import settings


@pytest.mark.parametrize("recipe,want", [
    (GemmRecipe(), dict(disable_rht=False, disable_stochastic_rounding=False, disable_2d_quantization=False)),
    (GemmRecipe(rht=False), dict(disable_rht=True, disable_stochastic_rounding=False, disable_2d_quantization=False)),
    (GemmRecipe(stochastic_rounding=False, weight_2d=False),
     dict(disable_rht=False, disable_stochastic_rounding=True, disable_2d_quantization=True)),
])
def test_te_nvfp4_recipe_arguments(recipe, want):
  assert te_backend.nvfp4_recipe_kwargs(recipe) == want


def test_module_table_emulated():
  recipe = GemmRecipe(rht=False)
  nvfp4 = module_class(Precision.NVFP4, Backend.EMULATED, settings(recipe=recipe))()
  assert isinstance(nvfp4, Nvfp4DotGeneral) and nvfp4.settings.recipe == recipe
  assert module_class(Precision.BF16, Backend.EMULATED, settings(recipe=recipe)) is UnquantizedDotGeneral
  assert module_class(Precision.BF16, Backend.TE, settings(recipe=recipe)) is UnquantizedDotGeneral  # never asks TE for bf16
  assert module_class(Precision.FP8, Backend.EMULATED, settings(recipe=recipe)) is nn.Fp8DirectDotGeneralOp


def test_te_module_needs_transformer_engine():
  """Where TE is missing, building a TE module fails on the import (never a silent fallback).

  "Missing" is any failure of `import transformer_engine.jax`: ImportError where it is not installed, OSError or
  RuntimeError where it is installed but its CUDA libraries do not load (e.g. .venv-gpu on a machine without a
  driver). Building the module must then fail the same way.
  """
  pytest.importorskip("jax")
  try:
    import transformer_engine.jax  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except Exception as import_error:  # pylint: disable=broad-exception-caught
    with pytest.raises(type(import_error)) as raised:
      te_backend.dot_general_cls(Precision.NVFP4, settings())
    if isinstance(import_error, ImportError):
      assert "transformer_engine" in str(raised.value)
  else:
    pytest.skip("transformer_engine.jax imports here (the TE group, tests/te, covers this case)")
