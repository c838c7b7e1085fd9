# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The backend table (MaxText.backends.table): each backend's GEMM modules, expert GEMMs and facts, a toy backend
added as one entry, and the TE recipe arguments (no TE needed)."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
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
  candidate = run._candidate(ours, toy, te_runs=False, fault=None)  # pylint: disable=protected-access
  assert isinstance(candidate, Fused) and candidate.gemm_name == "toy block GEMM"


def test_the_table_has_every_backend_and_nothing_else():
  from MaxText.backends import table  # pylint: disable=import-outside-toplevel

  assert set(table.TABLE) == set(Backend) - {Backend.AUTO}
  with pytest.raises(ValueError, match="nvfp4_backend=auto: no implementation"):
    table.implementation(Backend.AUTO)


#: One GEMM as a DenseGeneral calls it: x (M, K) . W (K, N), bf16.
_DIMS = (((1,), (0,)), ((), ()))


def _operands() -> tuple[jax.Array, jax.Array, jax.Array]:
  x = jax.random.normal(jax.random.key(0), (64, 128), jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (128, 32), jnp.bfloat16)
  return x, w, jax.random.normal(jax.random.key(2), (64, 32), jnp.bfloat16)


def test_the_fused_backends_dense_gemm_multiplies_with_its_block_scaled_gemm(monkeypatch):
  """The fused backend's dense module hands our codes and scales to the block-scaled GEMM the table names, in
  fprop, dgrad and wgrad. Without it the module is the emulated one under the fused name, and on CPU nothing else
  tells: both multiply the same quantized values exactly (tests/train_runs_test.py's equal losses). The TE group
  checks the same on Blackwell as three te_gemm_v2_ffi calls (tests/te/compile_test.py); here the GEMM is swapped
  through the table for one that records its calls, and the unswapped module's program holds three
  jax.nn.scaled_matmul, the emulated one's none."""
  from MaxText.backends import environment, table  # pylint: disable=import-outside-toplevel
  from MaxText.nvfp4.block_scaled import BlockCodes  # pylint: disable=import-outside-toplevel
  from MaxText.nvfp4.gemm import scaled_matmul_gemm  # pylint: disable=import-outside-toplevel
  from tests.backends.helpers import gemm_program  # pylint: disable=import-outside-toplevel

  x, w, dy = _operands()
  step = jnp.int32(0)

  def scaled_matmuls(backend: Backend) -> int:
    variables, run = gemm_program(module_class(Precision.NVFP4, backend, settings())(), x, w, _DIMS)
    return len(re.findall(r"\bscaled_matmul\w*\[", str(jax.make_jaxpr(run)(variables, step, x, w, dy))))

  with environment.answering(environment.Environment(te_error="not in this test", gpu_capabilities=())):
    assert table.implementation(Backend.FUSED).block_gemm()[0] is scaled_matmul_gemm  # where TE cannot run
    assert (scaled_matmuls(Backend.FUSED), scaled_matmuls(Backend.EMULATED)) == (3, 0)

  calls = []

  def recording(a, a_axis, b, b_axis, out_dtype):
    calls.append((type(a), type(b), a_axis, b_axis))
    return scaled_matmul_gemm(a, a_axis, b, b_axis, out_dtype)

  monkeypatch.setattr(table, "fused_gemm", lambda: (recording, "recording GEMM"))
  module = module_class(Precision.NVFP4, Backend.FUSED, settings())()
  assert isinstance(module, Nvfp4DotGeneral) and module.block_gemm is recording
  variables, run = gemm_program(module, x, w, _DIMS)
  run(variables, step, x, w, dy)
  assert {(a, b) for a, b, _, _ in calls} == {(BlockCodes, BlockCodes)}, calls
  assert {(a_axis, b_axis) for _, _, a_axis, b_axis in calls} == {(1, 0), (1, 1), (0, 0)}, calls  # fprop, dgrad, wgrad


@pytest.mark.parametrize("backend", [Backend.TE, Backend.EMULATED, Backend.FUSED])
def test_a_precision_no_backend_implements_is_an_error_not_fp8(backend):
  """A new block format's precision reaching the table before any backend implements it (here a plain "mxfp4"): one
  ValueError naming it and what the backends run, never maxtext's fp8 module (each entry tells NVFP4 from the rest)."""
  from MaxText.backends import table  # pylint: disable=import-outside-toplevel

  for ask in (lambda: module_class("mxfp4", backend, settings()), lambda: table.implementation_name("mxfp4", backend)):
    with pytest.raises(ValueError, match=r"'mxfp4': no backend implements it; the backends run nvfp4, fp8, bf16"):
      ask()
