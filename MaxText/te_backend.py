# Copyright 2026 The NVFP4-for-MaxText Authors. Licensed under the Apache License, Version 2.0.
"""The TransformerEngine backend: TE's NVFP4 (and FP8 current scaling) dense GEMMs as DenseGeneral modules.

Real code for TE 2.20.2 (transformer_engine.jax): `transformer_engine.jax.dense.dense` with a quantizer set
built from `NVFP4BlockScaling(disable_rht=..., disable_stochastic_rounding=..., disable_2d_quantization=...)`
or `Float8CurrentScaling()`, as TE's own `make_dot_general_cls` does, plus what maxtext's TE wrapper leaves
out: inputs cast to bf16 (TE's RHT kernel takes bf16 only) and a per-step stochastic-rounding key.
It needs a Blackwell GPU and cannot run on the machines this project is tested on: only the recipe
arguments, the selection and the errors around it are tested there (see README).
transformer_engine is imported when a TE module class is first built, never at import time.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp

from MaxText.nvfp4.gemm import QUANTIZATION_NAME, GemmRecipe
from MaxText.policy import Precision
from MaxText.sr import sr_key

#: maxtext's collection for TE quantizer metadata (NVFP4 and current scaling create none in it).
_TE_META_COLLECTION = "_overwrite_with_gradient"


def nvfp4_recipe_kwargs(recipe: GemmRecipe) -> dict[str, bool]:
  """Constructor arguments of TE's NVFP4BlockScaling for our recipe switches.

  Passed explicitly because constructor arguments win over TE's NVTE_NVFP4_* environment variables, which
  TE reads once at import.
  """
  return {
      "disable_rht": not recipe.rht,
      "disable_stochastic_rounding": not recipe.stochastic_rounding,
      "disable_2d_quantization": not recipe.weight_2d,
  }


def implementation_name(precision: Precision) -> str:
  if precision is Precision.NVFP4:
    return "TransformerEngine NVFP4BlockScaling dense"
  return "TransformerEngine Float8CurrentScaling dense"


def _te_recipe(precision: Precision, recipe: GemmRecipe) -> Any:
  from transformer_engine.common import recipe as te_recipe  # pylint: disable=import-outside-toplevel

  if precision is Precision.NVFP4:
    return te_recipe.NVFP4BlockScaling(**nvfp4_recipe_kwargs(recipe))
  if precision is Precision.FP8:
    return te_recipe.Float8CurrentScaling()
  raise ValueError(f"te_backend: no TE recipe for precision {precision.value!r} (bf16 GEMMs are not quantized).")


@functools.cache
def dot_general_cls(precision: Precision, recipe: GemmRecipe) -> type:
  """A Linen module class running one DenseGeneral's GEMM through TE's dense with the given precision."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  from transformer_engine.jax import dense as te_dense  # pylint: disable=import-outside-toplevel
  from transformer_engine.jax.flax.module import TransformerEngineBase  # pylint: disable=import-outside-toplevel

  te_recipe = _te_recipe(precision, recipe)

  class TeDotGeneral(TransformerEngineBase):
    """TE dense for DenseGeneral: contracting dims trailing on x and leading on the kernel, no batch dims."""

    def make_rng(self, name: str = "params") -> jax.Array:
      # TE draws its stochastic-rounding state from make_rng("sr_rng"), which maxtext never provides (flax would
      # fall back to "params", constant across steps under scan_layers). Serve it our per-layer, per-step key.
      # TE asks once per forward (for the output-gradient quantizer), so the call counter advances once per call.
      return sr_key(self) if name == "sr_rng" else super().make_rng(name)

    def generate_quantizer_set(self, postfix: str = "", variable_collection: str | None = None,
                               quantization_checkpoint_name: str | None = None, fp8_recipe: Any = None,
                               n_groups: int | None = None) -> Any:
      del variable_collection, quantization_checkpoint_name, fp8_recipe
      return super().generate_quantizer_set(
          postfix=postfix, variable_collection=_TE_META_COLLECTION,
          quantization_checkpoint_name=QUANTIZATION_NAME, fp8_recipe=te_recipe, n_groups=n_groups)

    @nn.compact
    def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
      del precision, preferred_element_type
      contracting_dims, batch_dims = dimension_numbers
      if batch_dims != ((), ()):
        raise NotImplementedError(f"TE dense has no batch dimensions; got {batch_dims}.")
      out_dtype = lhs.dtype
      quantizer_set = self.generate_quantizer_set()
      y = te_dense.dense(lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16), contracting_dims=contracting_dims,
                         quantizer_set=quantizer_set)
      return y.astype(out_dtype)

  TeDotGeneral.__name__ = f"TeDotGeneral_{precision.value}"
  return TeDotGeneral
