# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The one table from a backend (nvfp4_backend, resolved) to what implements it: the module that runs a dense GEMM
and its name in the plan, the routed-expert GEMMs, and the facts the rest of the plugin asks (where it runs, whose
quantizer, which block-scaled GEMM). Every other module asks `implementation(backend)`, never compares backends; a
fourth backend is one more entry (tests/backends/table_test.py adds a toy one).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable

import flax.linen as nn

from MaxText.backends import environment, experts, te
from MaxText.backends.emulated import MeasuredDotGeneral, Nvfp4DotGeneral, UnquantizedDotGeneral
from MaxText.backends.experts import TE_MISSING, ExpertGemms
from MaxText.backends.te_gemm import fused_gemm
from MaxText.nvfp4.gemm import BlockScaledGemm
from MaxText.precision.modes import Backend
from MaxText.precision.policy import GemmClass, Precision
from MaxText.precision.settings import Settings

__all__ = ["QUANTIZED", "TABLE", "Implementation", "expert_gemms", "expert_plan", "implementation", "implementation_name",
           "module_class", "resolve_backend"]

_LOG = logging.getLogger(__name__)
_logged: set[str] = set()  # maxtext builds the model several times; say the choice once per process


@dataclasses.dataclass(frozen=True)
class Implementation:
  """What runs one backend.

  dense: (precision, settings) -> the Linen module class of a DenseGeneral's NVFP4 or FP8 GEMM (BF16 is
    lax.dot_general on every backend).
  dense_name: precision -> that module's name in the precision plan.
  experts: -> the routed-expert NVFP4 GEMMs, or None where the backend has none.
  anywhere: runs wherever jax does; else only where TransformerEngine runs NVFP4 (resolve_backend).
  te_kernels: quantizes with TransformerEngine's kernels: TE's shape rules apply at config load, its RHT wants
    128-row inputs, the pre-flight's overhead audit and the self-check's TE candidate are about it.
  block_gemm: -> (the block-scaled GEMM on our codes and scales, its name) where the backend multiplies our
    quantizer's operands with one (the fused backend), else None.
  """

  dense: Callable[[Precision, Settings], type[nn.Module]]
  dense_name: Callable[[Precision], str]
  experts: Callable[[], ExpertGemms | None]
  anywhere: bool
  te_kernels: bool = False
  block_gemm: Callable[[], tuple[BlockScaledGemm, str]] | None = None


def _ours(precision: Precision, settings: Settings, block_gemm: BlockScaledGemm | None = None) -> type[nn.Module]:
  """Our quantizer's NVFP4 GEMM (with a block-scaled GEMM, or the emulation's f32 dot), or maxtext's own fp8."""
  if precision is Precision.NVFP4:
    return functools.partial(Nvfp4DotGeneral, settings=settings, block_gemm=block_gemm)
  return nn.Fp8DirectDotGeneralOp  # maxtext's own fp8 (delayed scaling), as quantization=fp8 uses


def _ours_name(precision: Precision, gemm: str | None = None) -> str:
  if precision is Precision.NVFP4:
    return f"MaxText.nvfp4 quantizer + {gemm} (fused)" if gemm else "MaxText.nvfp4 emulation"
  return "maxtext fp8 (flax Fp8DirectDotGeneralOp)"


#: Every backend, one entry each.
TABLE: dict[Backend, Implementation] = {
    Backend.TE: Implementation(dense=te.dot_general_cls, dense_name=te.implementation_name,
                               experts=experts.te_expert_gemms, anywhere=False, te_kernels=True),
    Backend.EMULATED: Implementation(dense=_ours, dense_name=_ours_name, experts=lambda: experts.EMULATED,
                                     anywhere=True),
    Backend.FUSED: Implementation(
        dense=lambda precision, settings: _ours(precision, settings, fused_gemm()[0]),
        dense_name=lambda precision: _ours_name(precision, fused_gemm()[1]),
        experts=experts.fused_expert_gemms, anywhere=True, block_gemm=fused_gemm),
}


def resolve_backend(requested: Backend | str, env: environment.Environment) -> Backend:
  """The backend that runs the configured `nvfp4_backend` in the environment `env` (usually environment.current()):
  a backend that runs anywhere is itself; `te` is TE where TE runs NVFP4; `auto` is TE there, else the emulation
  (never the fused backend), and says which and why in one logged line: never a silent fallback.

  Raises:
    ValueError: nvfp4_backend=te where TE cannot run (names the reason and the emulated alternative).
  """
  if requested in {b.value for b in Backend} or requested not in TABLE:
    requested = Backend(requested)  # a name as the config gives it; an unknown one: ValueError names the valid
  if requested in TABLE and implementation(requested).anywhere:  # jax alone: it runs wherever jax does
    return requested
  reason = environment.te_unavailable_reason(env)
  if requested is not Backend.AUTO:
    if reason:
      raise ValueError(f"nvfp4_backend={requested.value} cannot run here: {reason}. Use nvfp4_backend=emulated "
                       "(pure JAX, any hardware) or nvfp4_backend=auto.")
    return requested
  chosen = Backend.EMULATED if reason else Backend.TE
  line = f"nvfp4_backend=auto -> {chosen.value} ({reason or 'TransformerEngine imports and every GPU is Blackwell'})"
  if line not in _logged:
    _logged.add(line)
    _LOG.warning(line)
  return chosen


def implementation(backend: Backend) -> Implementation:
  """The table's entry of a resolved backend (auto resolves first: MaxText.backends.environment)."""
  if backend not in TABLE:
    raise ValueError(f"nvfp4_backend={getattr(backend, 'value', backend)}: no implementation (resolve auto first); "
                     f"the table has {', '.join(getattr(b, 'value', str(b)) for b in TABLE)}")
  return TABLE[backend]


#: The quantized precisions every backend's dense entry implements (BF16 is lax.dot_general everywhere).
QUANTIZED = (Precision.NVFP4, Precision.FP8)


def _known(precision: Precision) -> Precision:
  """`precision` where the table implements it. Why: each entry's `dense` tells NVFP4 from the rest, so a precision
  or block format it does not know would otherwise train silently in FP8."""
  if precision is Precision.BF16 or precision in QUANTIZED:
    return precision
  raise ValueError(f"precision {getattr(precision, 'value', precision)!r}: no backend implements it; the backends "
                   f"run {', '.join(p.value for p in (*QUANTIZED, Precision.BF16))} (MaxText.backends.table)")


def module_class(precision: Precision, backend: Backend, settings: Settings,
                 gemm_class: GemmClass = GemmClass.OTHER) -> type[nn.Module]:
  """The Linen module class that runs one GEMM of `gemm_class` in `precision` on `backend` (resolved); the recipe and
  the stages around an NVFP4 GEMM (BF16 switches, statistics, guard) come from `settings`. A BF16 MLP GEMM whose
  weight gradient a tap measures (Settings.bf16_mlp_taps) is lax.dot_general with that measurement, on every
  backend.

  Raises:
    ValueError: a precision no backend implements (names the ones they do).
  """
  if _known(precision) is Precision.BF16:
    if gemm_class is GemmClass.MLP and settings.bf16_mlp_taps:
      return functools.partial(MeasuredDotGeneral, settings=settings)
    return UnquantizedDotGeneral
  return implementation(backend).dense(precision, settings)


def implementation_name(precision: Precision, backend: Backend) -> str:
  """Human name of what module_class picks, for the precision plan."""
  if _known(precision) is Precision.BF16:
    return "lax.dot_general (unquantized)"
  return implementation(backend).dense_name(precision)


def expert_gemms(backend: Backend) -> ExpertGemms | None:
  """The expert GEMM implementation of a backend, or None where the backend has no NVFP4 grouped GEMM."""
  return implementation(backend).experts()


def expert_plan(precision: Precision, backend: Backend) -> tuple[Precision, str]:
  """(precision, implementation) of the routed-expert GEMMs, for the precision plan."""
  if precision is not Precision.NVFP4:
    return Precision.BF16, "maxtext RoutedMoE matmuls (unquantized, nvfp4_moe_experts=bf16 or MLP bf16)"
  gemms = expert_gemms(backend)
  return precision, (gemms.name if gemms else f"none: {TE_MISSING}")
