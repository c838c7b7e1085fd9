# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The one table from (precision, backend) to the Linen module that runs a dense GEMM, and its name in the plan."""

from __future__ import annotations

import functools

import flax.linen as nn

from MaxText.backends import environment, te
from MaxText.backends.emulated import Nvfp4DotGeneral, UnquantizedDotGeneral
from MaxText.backends.te_gemm import te_block_scaled_gemm
from MaxText.nvfp4.gemm import BlockScaledGemm, scaled_matmul_gemm
from MaxText.precision.modes import Backend
from MaxText.precision.policy import Precision
from MaxText.precision.settings import Settings

__all__ = ["fused_gemm", "implementation_name", "module_class"]


def fused_gemm() -> tuple[BlockScaledGemm, str]:
  """The fused backend's block-scaled GEMM in the environment the model is built for (environment.current()), and
  its name: TransformerEngine's cuBLASLt NVFP4 GEMM where TE runs NVFP4 (Blackwell), else jax.nn.scaled_matmul."""
  if environment.te_unavailable_reason(environment.current()) is None:
    return te_block_scaled_gemm, "TransformerEngine NVFP4 GEMM (te_gemm_v2_ffi)"
  return scaled_matmul_gemm, "jax.nn.scaled_matmul"


def module_class(precision: Precision, backend: Backend, settings: Settings) -> type[nn.Module]:
  """The Linen module class that runs one GEMM in `precision` on `backend` (resolved); the recipe and the stages
  around an NVFP4 GEMM (BF16 switches, statistics, guard) come from `settings`."""
  if precision is Precision.BF16:
    return UnquantizedDotGeneral
  if backend is Backend.TE:
    return te.dot_general_cls(precision, settings)
  if precision is Precision.NVFP4:
    if backend is Backend.FUSED:
      return functools.partial(Nvfp4DotGeneral, settings=settings, block_gemm=fused_gemm()[0])
    return functools.partial(Nvfp4DotGeneral, settings=settings)
  return nn.Fp8DirectDotGeneralOp  # maxtext's own fp8 (delayed scaling), as quantization=fp8 uses


def implementation_name(precision: Precision, backend: Backend) -> str:
  """Human name of what module_class picks, for the precision plan."""
  if precision is Precision.BF16:
    return "lax.dot_general (unquantized)"
  if backend is Backend.TE:
    return te.implementation_name(precision)
  if precision is Precision.NVFP4:
    return (f"MaxText.nvfp4 quantizer + {fused_gemm()[1]} (fused)" if backend is Backend.FUSED
            else "MaxText.nvfp4 emulation")
  return "maxtext fp8 (flax Fp8DirectDotGeneralOp)"
