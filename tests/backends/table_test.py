# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The backend table (MaxText.backends.table): each backend's GEMM modules, expert GEMMs and facts, a toy backend
added as one entry, and the TE recipe arguments (no TE needed)."""

import flax.linen as nn
import jax
import pytest

from MaxText.backends import te as te_backend
from MaxText.backends.emulated import Nvfp4DotGeneral, UnquantizedDotGeneral
from MaxText.backends.table import module_class
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


class _ToyGemm(nn.Module):
  """A toy backend's GEMM module: lax.dot_general under another name."""

  @nn.compact
  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)


def test_a_fourth_backend_is_one_entry_and_everything_asks_the_table(monkeypatch):
  """A toy backend added as one entry of TABLE: the dense module, the plan's names, the expert GEMMs, the backend
  choice, the quant object's init rows and the self-check's candidate all come from it (red where a consumer still
  compares backends by name)."""
  from MaxText.backends import environment, experts, table  # pylint: disable=import-outside-toplevel
  from MaxText.integration.quant import Nvfp4Quantization  # pylint: disable=import-outside-toplevel
  from MaxText.selfcheck import run  # pylint: disable=import-outside-toplevel
  from MaxText.selfcheck.candidates import Fused  # pylint: disable=import-outside-toplevel

  def toy_gemm(*args, **kwargs):
    raise AssertionError("not called here")

  toy = "toy"
  monkeypatch.setitem(table.TABLE, toy, table.Implementation(
      dense=lambda precision, settings: _ToyGemm, dense_name=lambda precision: f"toy {precision.value} GEMM",
      experts=lambda: experts.EMULATED, anywhere=True, block_gemm=lambda: (toy_gemm, "toy block GEMM")))
  ours = settings(backend=toy)
  assert module_class(Precision.NVFP4, toy, ours) is _ToyGemm
  assert module_class(Precision.BF16, toy, ours) is UnquantizedDotGeneral
  assert table.implementation_name(Precision.FP8, toy) == "toy fp8 GEMM"
  assert table.expert_plan(Precision.NVFP4, toy) == (Precision.NVFP4, experts.EMULATED.name)
  assert table.resolve_backend(toy, environment.current()) == toy
  quant = Nvfp4Quantization(settings=ours, backend=toy)
  assert quant.get_block_size() == 16 and quant.dot_general_cls(("embed", "mlp")) is _ToyGemm
  candidate = run._candidate(ours, environment.current(), te_runs=False, fault=None)  # pylint: disable=protected-access
  assert isinstance(candidate, Fused) and candidate.gemm_name == "toy block GEMM"


def test_the_table_has_every_backend_and_nothing_else():
  from MaxText.backends import table  # pylint: disable=import-outside-toplevel

  assert set(table.TABLE) == set(Backend) - {Backend.AUTO}
  with pytest.raises(ValueError, match="nvfp4_backend=auto: no implementation"):
    table.implementation(Backend.AUTO)
