# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The maxtext adapter: a `Quantization` whose `dot_general_cls` hands each DenseGeneral its policy's GEMM.

maxtext's hook (layers/linears.py): `DenseGeneral` asks `quant.dot_general_cls(mesh_axes=kernel_axes)` for a
Linen module class, instantiates it with no arguments, wraps it in ToNNX and calls it as
`dot_general(inputs, kernel, dimension_numbers, precision=None)` with only the "aqt" collection mutable.
This module holds no numerics: it maps (precision, backend) to a module class.
"""

import dataclasses
import functools
from typing import Any, ClassVar, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
from maxtext.layers import quantizations

from MaxText import moe, te_backend
from MaxText.backend import Backend
from MaxText.nvfp4.formats import BLOCK_SIZE
from MaxText.nvfp4.gemm import GemmRecipe, nvfp4_dot_general
from MaxText.policy import Precision, PrecisionPolicy
from MaxText.switches import Switches, gemm_flags, switches_from_config
from MaxText.sr import sr_key


class DotGeneralModule(Protocol):
  """What DenseGeneral calls: `module(inputs, kernel, dimension_numbers, precision=None)`."""

  def __call__(self, lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any, precision: Any = None) -> jax.Array:
    ...


class Nvfp4DotGeneral(nn.Module):
  """Emulated NVFP4 GEMM (pure JAX, MaxText.nvfp4.gemm) for one DenseGeneral."""

  recipe: GemmRecipe = GemmRecipe()
  switches: Switches = Switches()

  @nn.compact
  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    del precision, preferred_element_type  # NVFP4 fixes both: FP4 operands, f32 accumulation, lhs dtype out
    key = sr_key(self) if self.recipe.stochastic_rounding else None
    all_bf16, forward_bf16 = gemm_flags(self, self.switches)

    def nvfp4(lhs, rhs):
      return nvfp4_dot_general(lhs, rhs, dimension_numbers, key=key, recipe=self.recipe,
                               forward_bf16=False if forward_bf16 is None else forward_bf16)

    if all_bf16 is None:
      return nvfp4(lhs, rhs)
    # A BF16 layer, or past nvfp4_bf16_from_step: the GEMM UnquantizedDotGeneral runs, forward and backward.
    # lax.cond runs one branch; both are compiled once.
    return jax.lax.cond(all_bf16, lambda l, r: jax.lax.dot_general(l, r, dimension_numbers).astype(l.dtype),
                        nvfp4, lhs, rhs)


class UnquantizedDotGeneral(nn.Module):
  """The GEMM as maxtext computes it without quantization: lax.dot_general in the operands' dtype."""

  @nn.compact
  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)


def module_class(precision: Precision, backend: Backend, recipe: GemmRecipe,
                 switches: Switches = Switches(), nonfinite_check: bool = True) -> type[nn.Module]:
  """The one table from (precision, backend) to the Linen module that runs the GEMM.

  `switches` (BF16 layers, late BF16 steps) apply to the NVFP4 GEMMs only.
  """
  if precision is Precision.BF16:
    return UnquantizedDotGeneral
  if backend is Backend.TE:
    return te_backend.dot_general_cls(precision, recipe, nonfinite_check, switches)
  if precision is Precision.NVFP4:
    return functools.partial(Nvfp4DotGeneral, recipe=recipe, switches=switches)
  return nn.Fp8DirectDotGeneralOp  # maxtext's own fp8 (delayed scaling), as quantization=fp8 uses


def implementation_name(precision: Precision, backend: Backend) -> str:
  """Human name of what module_class picks, for the precision plan."""
  if precision is Precision.BF16:
    return "lax.dot_general (unquantized)"
  if backend is Backend.TE:
    return te_backend.implementation_name(precision)
  return "MaxText.nvfp4 emulation" if precision is Precision.NVFP4 else "maxtext fp8 (flax Fp8DirectDotGeneralOp)"


@dataclasses.dataclass(eq=False)
class Nvfp4Quantization(quantizations.Quantization):
  """maxtext's quant object for te_nvfp4 / te_nvfp4_no_rht: the policy decides per DenseGeneral."""

  policy: PrecisionPolicy = PrecisionPolicy()
  backend: Backend = Backend.EMULATED
  switches: Switches = Switches()
  nonfinite_check: bool = True  # TE backend: NaN outputs for non-finite operands (nvfp4_nonfinite_check)
  quant_mode: str = "train"  # maxtext's in_serve_mode() reads it
  experts: Precision = Precision.BF16  # routed-expert GEMMs (MaxText.moe): nvfp4 with MLP nvfp4, nvfp4_moe_experts=nvfp4
  experts_opted_out: bool = False  # nvfp4_moe_experts=bf16 was set explicitly (the plan then accepts BF16 experts)
  # maxtext's sparse MoE path reads these for megablox's own int8/fp8 quantization: none (MaxText.moe runs NVFP4).
  quant_dg: ClassVar[None] = None
  quantize_dtype: ClassVar[None] = None
  needs_apply_rngs: ClassVar[bool] = True  # stochastic rounding draws from the rng streams at apply time

  def get_block_size(self) -> int:
    """Rows of DenseGeneral's dummy init input: a multiple of NVFP4's block (TE's RHT kernel wants 128)."""
    return 128 if self.backend is Backend.TE else BLOCK_SIZE

  def dot_general_cls(self, mesh_axes: tuple[str | None, ...] = ()) -> type[nn.Module]:
    return module_class(self.policy.precision_for(tuple(mesh_axes)), self.backend, self.policy.recipe, self.switches,
                        self.nonfinite_check)

  def einsum(self, mesh_axes: tuple[str | None, ...] = (), dtype: Any = jnp.float32) -> Any:
    """maxtext's MoE hook, called as `quant.einsum(mesh_axes=rhs_axes)` (RoutedMoE.get_einsum, sparse_matmul=false):
    NVFP4 expert einsums for expert kernels when experts are NVFP4, jnp.einsum otherwise (MaxText.moe)."""
    del dtype
    return moe.expert_einsum(tuple(mesh_axes)) if self.experts is Precision.NVFP4 else jnp.einsum

  def expert_plan(self) -> tuple[Precision, str]:
    """(precision, implementation) of the routed-expert GEMMs, for the precision plan."""
    return moe.expert_plan(self.experts, self.backend)


def _value(setting: Any) -> str:
  """A config value as a plain string: maxtext's config holds str Enums (or plain strings after overrides)."""
  return str(getattr(setting, "value", setting))


def policy_from_config(config: Any) -> PrecisionPolicy:
  """The policy a maxtext config asks for (quantization and the nvfp4_* keys)."""
  return PrecisionPolicy(
      mlp=Precision(_value(config.nvfp4_mlp_precision)),
      attention=Precision(_value(config.nvfp4_attention_precision)),
      recipe=GemmRecipe(rht=_value(config.quantization) != "te_nvfp4_no_rht",
                        stochastic_rounding=bool(config.nvfp4_stochastic_rounding),
                        weight_2d=bool(config.nvfp4_2d_weight_scaling)),
  )


def quantization_from_config(config: Any, quant_mode_str: str = "train") -> Nvfp4Quantization:
  """maxtext's quant object for an NVFP4 mode; resolves the backend (raises before compiling if TE can't run)."""
  from MaxText.backend import resolve_backend  # pylint: disable=import-outside-toplevel

  if quant_mode_str != "train":
    raise NotImplementedError(f"quantization={config.quantization} supports training only; got quant_mode "
                              f"{quant_mode_str!r} (serve/convert). Serve the trained BF16/FP32 weights instead.")
  backend = resolve_backend(_value(config.nvfp4_backend))
  switches = switches_from_config(config)
  if backend is Backend.TE and switches.forward_from_step is not None:
    raise ValueError("nvfp4_bf16_forward_from_step is implemented for the emulated backend only so far; with "
                     "nvfp4_backend=te use nvfp4_bf16_from_step (forward and backward in BF16) instead.")
  quant = Nvfp4Quantization(policy=policy_from_config(config), backend=backend, switches=switches,
                            nonfinite_check=bool(getattr(config, "nvfp4_nonfinite_check", True)))
  return moe.with_experts(quant, config)
