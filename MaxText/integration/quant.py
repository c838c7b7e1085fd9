# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""maxtext's quant object for te_nvfp4 / te_nvfp4_no_rht: the policy picks, per DenseGeneral, the GEMM module.

maxtext's hook (layers/linears.py): `DenseGeneral` asks `quant.dot_general_cls(mesh_axes=kernel_axes)` for a
Linen module class; RoutedMoE asks `quant.einsum(mesh_axes=...)` (sparse_matmul=false). This module holds no
numerics: it maps the settings to the backends' table (MaxText.backends.dense) and expert einsums.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax.numpy as jnp
from maxtext.layers import quantizations

from MaxText.backends import experts
from MaxText.backends.dense import module_class
from MaxText.backends.environment import resolve_backend
from MaxText.nvfp4.formats import BLOCK_SIZE
from MaxText.precision.modes import Backend
from MaxText.precision.policy import Precision, PrecisionPolicy
from MaxText.precision.settings import Settings
from MaxText.precision.switches import Switches

__all__ = ["Nvfp4Quantization", "quantization_from_config"]


@dataclasses.dataclass(eq=False)
class Nvfp4Quantization(quantizations.Quantization):
  """maxtext's quant object for te_nvfp4 / te_nvfp4_no_rht: the policy decides per DenseGeneral."""

  policy: PrecisionPolicy = PrecisionPolicy()
  backend: Backend = Backend.EMULATED
  switches: Switches = Switches()
  nonfinite_check: bool = True  # TE backend: NaN outputs for non-finite operands (nvfp4_nonfinite_check)
  stats_interval: int = 0  # nvfp4_stats_interval: per-GEMM operand statistics every N steps (0: off)
  quant_mode: str = "train"  # maxtext's in_serve_mode() reads it
  experts: Precision = Precision.BF16  # routed-expert GEMMs: nvfp4 with MLP nvfp4 and nvfp4_moe_experts=nvfp4
  experts_opted_out: bool = False  # nvfp4_moe_experts=bf16 was set explicitly (the plan then accepts BF16 experts)
  # maxtext's sparse MoE path reads these for megablox's own int8/fp8 quantization: none (our experts run NVFP4).
  quant_dg: ClassVar[None] = None
  quantize_dtype: ClassVar[None] = None
  needs_apply_rngs: ClassVar[bool] = True  # stochastic rounding draws from the rng streams at apply time

  def get_block_size(self) -> int:
    """Rows of DenseGeneral's dummy init input: a multiple of NVFP4's block (TE's RHT kernel wants 128)."""
    return 128 if self.backend is Backend.TE else BLOCK_SIZE

  def dot_general_cls(self, mesh_axes: tuple[str | None, ...] = ()) -> type[nn.Module]:
    return module_class(self.policy.precision_for(tuple(mesh_axes)), self.backend, self.policy.recipe, self.switches,
                        self.nonfinite_check, self.stats_interval)

  def einsum(self, mesh_axes: tuple[str | None, ...] = (), dtype: Any = jnp.float32) -> Any:
    """maxtext's MoE hook, called as `quant.einsum(mesh_axes=rhs_axes)` (RoutedMoE.get_einsum, sparse_matmul=false):
    NVFP4 expert einsums for expert kernels when experts are NVFP4, jnp.einsum otherwise."""
    del dtype
    return experts.expert_einsum(tuple(mesh_axes)) if self.experts is Precision.NVFP4 else jnp.einsum

  def expert_plan(self) -> tuple[Precision, str]:
    """(precision, implementation) of the routed-expert GEMMs, for the precision plan."""
    return experts.expert_plan(self.experts, self.backend)


def quantization_from_config(config: Any, quant_mode_str: str = "train") -> Nvfp4Quantization:
  """maxtext's quant object for an NVFP4 mode; resolves the backend (raises before compiling if TE can't run).

  Raises:
    ValueError: nvfp4_backend=te where TransformerEngine or a Blackwell GPU is missing.
    NotImplementedError: serve/convert modes.
  """
  settings = Settings.from_config(config)
  if quant_mode_str != "train":
    raise NotImplementedError(f"quantization={settings.quantization} supports training only; got quant_mode "
                              f"{quant_mode_str!r} (serve/convert). Serve the trained BF16/FP32 weights instead.")
  return Nvfp4Quantization(policy=settings.policy, backend=resolve_backend(settings.backend),
                           switches=settings.switches, nonfinite_check=settings.nonfinite_check,
                           stats_interval=settings.stats_interval,
                           experts=settings.experts, experts_opted_out=settings.experts_opted_out)
