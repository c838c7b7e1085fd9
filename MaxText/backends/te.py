# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The TransformerEngine backend: TE's NVFP4 (and FP8 current scaling) dense GEMMs as DenseGeneral modules.

Real code for TE 2.20.2 (transformer_engine.jax): `transformer_engine.jax.dense.dense` with a quantizer set
built from `NVFP4BlockScaling(disable_rht=..., disable_stochastic_rounding=..., disable_2d_quantization=...)`
or `Float8CurrentScaling()`, as TE's own `make_dot_general_cls` does, plus what maxtext's TE wrapper leaves
out: inputs cast to bf16 (TE's RHT kernel takes bf16 only) and a per-step stochastic-rounding key.
Two things TE 2.20.2 does not do on its own, added here:
  - 1D-scaled weights (nvfp4_2d_weight_scaling=false) with RHT: TE's quantize config turns RHT on for every
    1D-scaled NVFP4 operand it quantizes column-wise, the kernel included, and its GEMM then refuses the mix. The
    recipe applies RHT to the weight-gradient operands only (x and dY), so the kernel quantizer's RHT is turned off.
  - Non-finite operands: TE's NVFP4 amax ignores NaN (fmaxf), so a NaN in x, W or dY can vanish into a finite
    FP4 value. With nvfp4_nonfinite_check, the pipeline's guard (MaxText.backends.stages.guard) makes each GEMM's
    output (y, dx, dW) NaN when one of its operands is not finite.
It runs on Blackwell GPUs only; without one, the TE test group (tests/te, `make test-te`) traces and lowers it to
CUDA StableHLO on CPU. transformer_engine is imported when a TE module class is first built, never at import time.
"""

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from MaxText.backends import pipeline, te_quantize
from MaxText.backends.emulated import unquantized
from MaxText.backends.pipeline import OVERWRITE_COLLECTION
from MaxText.backends.sr import sr_key
from MaxText.backends.stages import Core
from MaxText.nvfp4.gemm import QUANTIZATION_NAME, GemmRecipe
from MaxText.precision.policy import Precision
from MaxText.precision.settings import Settings


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


def recipe_of(precision: Precision, recipe: GemmRecipe) -> Any:
  """TE's recipe object for a GEMM of `precision` under our recipe switches (NVFP4BlockScaling or
  Float8CurrentScaling); public for the tools that build TE's quantizers as this backend does
  (scripts/audit_overhead.py)."""
  # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, only where a TE module is built
  from transformer_engine.common import recipe as te_recipe

  if precision is Precision.NVFP4:
    return te_recipe.NVFP4BlockScaling(**nvfp4_recipe_kwargs(recipe))
  if precision is Precision.FP8:
    return te_recipe.Float8CurrentScaling()
  raise ValueError(f"te_backend: no TE recipe for precision {precision.value!r} (bf16 GEMMs are not quantized).")


def _kernel_without_rht(quantizer_set: Any) -> Any:
  """The quantizer set with RHT off for the kernel (TE turns it on for a 1D-scaled kernel; see module doc)."""
  kernel = quantizer_set.kernel
  if kernel is None or not getattr(kernel, "use_rht", False):
    return quantizer_set
  return dataclasses.replace(quantizer_set, kernel=dataclasses.replace(kernel, use_rht=False))


@functools.cache
def dot_general_cls(precision: Precision, settings: Settings) -> type:
  """A Linen module class running one DenseGeneral's GEMM through TE's dense with the given precision.

  NVFP4: TE's dense is the core of the GEMM pipeline (MaxText.backends.pipeline): the non-finite guard
  (nvfp4_nonfinite_check), the BF16 layers and late switch, the statistics (nvfp4_stats_interval: our bit-exact
  quantizer's statistics of the bf16 operands TE quantizes), the audit (nvfp4_audit_interval: TE's quantizers,
  MaxText.backends.te_quantize, against ours) and the forward-only switch around it, as `settings` asks. FP8
  (attention projections under nvfp4_attention_precision=fp8): TE's current-scaling dense alone.
  """
  # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, only where a TE module is built
  from transformer_engine.jax import dense as te_dense

  # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, as above
  from transformer_engine.jax.flax.module import TransformerEngineBase

  te_recipe = recipe_of(precision, settings.recipe)
  is_nvfp4 = precision is Precision.NVFP4  # (the module's __call__ has a `precision` argument of its own)

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
          postfix=postfix, variable_collection=OVERWRITE_COLLECTION,
          quantization_checkpoint_name=QUANTIZATION_NAME, fp8_recipe=te_recipe, n_groups=n_groups)

    @nn.compact
    def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
      del precision, preferred_element_type
      contracting_dims, batch_dims = dimension_numbers
      if batch_dims != ((), ()):
        raise NotImplementedError(f"TE dense has no batch dimensions; got {batch_dims}.")
      out_dtype = lhs.dtype
      quantizer_set = self.generate_quantizer_set()
      if is_nvfp4:
        quantizer_set = _kernel_without_rht(quantizer_set)

      def te_path(left, right, qs):  # TE's RHT kernel takes bf16 only
        return te_dense.dense(left.astype(jnp.bfloat16), right.astype(jnp.bfloat16), contracting_dims=contracting_dims,
                              quantizer_set=qs).astype(out_dtype)

      if not is_nvfp4:
        return te_path(lhs, rhs, quantizer_set)
      state, sinks = pipeline.stages_of(self, settings, guard=settings.nonfinite_check,
                                        candidate=te_quantize.candidate(settings.recipe))
      bf16 = unquantized(dimension_numbers, out_dtype)
      gemm = pipeline.assembled(state, lambda left, right: Core.from_vjp(te_path), bf16, dimension_numbers)
      return gemm(lhs, rhs, (quantizer_set, sinks))

  TeDotGeneral.__name__ = f"TeDotGeneral_{precision.value}"
  return TeDotGeneral
