# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The precision policy, the backend choice, the module table and the TE recipe arguments (no TE needed)."""

import flax.linen as nn
import pytest

from MaxText import te_backend
from MaxText.adapter import Nvfp4DotGeneral, Nvfp4Quantization, UnquantizedDotGeneral, module_class
from MaxText.backend import Backend, Environment, resolve_backend
from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.policy import GemmClass, Precision, PrecisionPolicy, classify

_AXES = {
    "wi_0/wi_1": (("embed", "mlp"), GemmClass.MLP),
    "fused wi": (("embed", "num_activations", "mlp"), GemmClass.MLP),
    "wo": (("mlp", "embed"), GemmClass.MLP),
    "query": (("embed_attn", "q_heads", "kv"), GemmClass.ATTENTION),
    "key/value": (("embed_attn", "kv_heads", "kv_head_dim"), GemmClass.ATTENTION),
    "qkv": (("embed_attn", "heads", "kv"), GemmClass.ATTENTION),
    "out": (("heads", "kv", "embed_attn"), GemmClass.ATTENTION),
    "qwen3-hybrid out": (("mlp", "embed_attn"), GemmClass.ATTENTION),
    "logits": (("embed_vocab", "vocab"), GemmClass.OTHER),
    "context-parallel axes": ((None, None, None), GemmClass.OTHER),
}


@pytest.mark.parametrize("name", sorted(_AXES))
def test_classify_maxtext_kernel_axes(name):
  axes, want = _AXES[name]
  assert classify(axes) is want


@pytest.mark.parametrize("attention", [Precision.BF16, Precision.FP8])
def test_policy_precision_per_class(attention):
  policy = PrecisionPolicy(attention=attention)
  assert policy.precision_for(("embed", "mlp")) is Precision.NVFP4
  assert policy.precision_for(("heads", "kv", "embed_attn")) is attention
  assert policy.precision_for(("embed_vocab", "vocab")) is Precision.BF16


def test_policy_rejects_fp4_attention_and_fp8_mlp():
  with pytest.raises(ValueError, match="never FP4"):
    PrecisionPolicy(attention=Precision.NVFP4)
  with pytest.raises(ValueError, match="'nvfp4' or 'bf16'"):
    PrecisionPolicy(mlp=Precision.FP8)


_NO_TE = Environment(te_error="ModuleNotFoundError: No module named 'transformer_engine'", gpu_capabilities=())
_HOPPER = Environment(te_error=None, gpu_capabilities=(9.0,) * 8)
_BLACKWELL = Environment(te_error=None, gpu_capabilities=(10.0,) * 4)
_MIXED = Environment(te_error=None, gpu_capabilities=(10.0, 9.0))


@pytest.mark.parametrize("env,want", [(_NO_TE, Backend.EMULATED), (_HOPPER, Backend.EMULATED),
                                      (_MIXED, Backend.EMULATED), (_BLACKWELL, Backend.TE)])
def test_auto_backend(env, want):
  assert resolve_backend("auto", env) is want


@pytest.mark.parametrize("env,reason", [(_NO_TE, "does not import"), (_HOPPER, "found 9.0"),
                                        (Environment(None, ()), "no GPU")])
def test_te_backend_where_it_cannot_run_is_a_clear_error(env, reason):
  with pytest.raises(ValueError, match=f"nvfp4_backend=te cannot run here: .*{reason}.*Use nvfp4_backend=emulated"):
    resolve_backend("te", env)


def test_emulated_and_te_on_blackwell():
  assert resolve_backend("emulated", _NO_TE) is Backend.EMULATED
  assert resolve_backend("te", _BLACKWELL) is Backend.TE
  with pytest.raises(ValueError, match="'cuda' is not a valid Backend"):
    resolve_backend("cuda", _NO_TE)


def test_this_machine_resolves_auto_to_emulated():
  """CI has neither TE nor a GPU: auto must pick the emulation."""
  assert resolve_backend("auto") is Backend.EMULATED


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
  nvfp4 = module_class(Precision.NVFP4, Backend.EMULATED, recipe)()
  assert isinstance(nvfp4, Nvfp4DotGeneral) and nvfp4.recipe == recipe
  assert module_class(Precision.BF16, Backend.EMULATED, recipe) is UnquantizedDotGeneral
  assert module_class(Precision.BF16, Backend.TE, recipe) is UnquantizedDotGeneral  # never asks TE for bf16
  assert module_class(Precision.FP8, Backend.EMULATED, recipe) is nn.Fp8DirectDotGeneralOp


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
      te_backend.dot_general_cls(Precision.NVFP4, GemmRecipe())
    if isinstance(import_error, ImportError):
      assert "transformer_engine" in str(raised.value)
  else:
    pytest.skip("transformer_engine.jax imports here (the TE group, tests/te, covers this case)")


def test_quant_object_routes_by_kernel_axes():
  quant = Nvfp4Quantization(policy=PrecisionPolicy(attention=Precision.FP8), backend=Backend.EMULATED)
  assert isinstance(quant.dot_general_cls(mesh_axes=("embed", "mlp"))(), Nvfp4DotGeneral)
  assert quant.dot_general_cls(mesh_axes=("embed_attn", "q_heads", "kv")) is nn.Fp8DirectDotGeneralOp
  assert quant.get_block_size() % 16 == 0 and quant.quant_mode == "train" and quant.needs_apply_rngs
  assert callable(quant.einsum())  # MoE expert einsums are served now (MaxText/moe.py, tested in tests/test_moe.py)
