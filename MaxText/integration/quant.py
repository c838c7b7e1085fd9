# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""maxtext's quant object for te_nvfp4 / te_nvfp4_no_rht: the policy picks, per DenseGeneral, the GEMM module.

maxtext's hook (layers/linears.py): `DenseGeneral` asks `quant.dot_general_cls(mesh_axes=kernel_axes)` for a
Linen module class; RoutedMoE asks `quant.einsum(mesh_axes=...)` (sparse_matmul=false). This module holds no
numerics: it maps the settings to the backends' table (MaxText.backends.table) and expert einsums.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax.numpy as jnp
from maxtext.layers import quantizations

from MaxText.backends import experts, table
from MaxText.backends.table import module_class
from MaxText.integration.settings import backend_of, settings_of
from MaxText.precision.modes import Backend
from MaxText.precision.policy import Precision, PrecisionPolicy, classify
from MaxText.precision.settings import Settings

__all__ = ["Nvfp4Quantization", "quantization_from_config"]


@dataclasses.dataclass(eq=False, kw_only=True)
class Nvfp4Quantization(quantizations.Quantization):
  """maxtext's quant object for te_nvfp4 / te_nvfp4_no_rht: the policy decides per DenseGeneral.

  settings: the config's plugin settings, whole (MaxText.integration.settings.settings_of).
  backend: the NVFP4 backend resolved for the environment the model is built in (TE, EMULATED or FUSED, never AUTO).
  """

  settings: Settings
  backend: Backend
  quant_mode: str = "train"  # maxtext's in_serve_mode() reads it
  # maxtext's sparse MoE path reads these for megablox's own int8/fp8 quantization: none (our experts run NVFP4).
  quant_dg: ClassVar[None] = None
  quantize_dtype: ClassVar[None] = None
  needs_apply_rngs: ClassVar[bool] = True  # stochastic rounding draws from the rng streams at apply time

  @property
  def policy(self) -> PrecisionPolicy:
    return self.settings.policy

  @property
  def experts(self) -> Precision:
    """What the routed-expert GEMMs run in (Settings.experts)."""
    return self.settings.experts

  def get_block_size(self) -> int:
    """Rows of DenseGeneral's dummy init input: a multiple of NVFP4's block (TE's RHT kernel wants 128)."""
    return 128 if table.implementation(self.backend).te_kernels else self.policy.recipe.format.block_size

  def dot_general_cls(self, mesh_axes: tuple[str | None, ...] = ()) -> type[nn.Module]:
    axes = tuple(mesh_axes)
    return module_class(self.policy.precision_for(axes), self.backend, self.settings, classify(axes))

  def einsum(self, mesh_axes: tuple[str | None, ...] = (), dtype: Any = jnp.float32) -> Any:
    """maxtext's MoE hook, called as `quant.einsum(mesh_axes=rhs_axes)` (RoutedMoE.get_einsum, sparse_matmul=false):
    NVFP4 expert einsums for expert kernels when experts are NVFP4; jnp.einsum otherwise, on an expert kernel whose
    weight gradient is measured where the statistics measure BF16 MLP GEMMs (Settings.bf16_mlp_taps)."""
    del dtype
    if self.experts is Precision.NVFP4:
      return experts.expert_einsum(tuple(mesh_axes))
    return experts.measured_einsum(tuple(mesh_axes)) if self.settings.bf16_mlp_taps else jnp.einsum

  def expert_plan(self) -> tuple[Precision, str]:
    """(precision, implementation) of the routed-expert GEMMs, for the precision plan."""
    return table.expert_plan(self.experts, self.backend)


def quantization_from_config(config: Any, quant_mode_str: str = "train") -> Nvfp4Quantization:
  """maxtext's quant object for an NVFP4 mode, on the backend resolved for `config` (settings.backend_of: against
  `environment.current()`, once per config object).

  Raises:
    ValueError: nvfp4_backend=te where TransformerEngine or a Blackwell GPU is missing.
    NotImplementedError: serve/convert modes.
  """
  settings = settings_of(config)
  if quant_mode_str != "train":
    raise NotImplementedError(f"quantization={settings.quantization} supports training only; got quant_mode "
                              f"{quant_mode_str!r} (serve/convert). Serve the trained BF16/FP32 weights instead.")
  return Nvfp4Quantization(settings=settings, backend=backend_of(config))
