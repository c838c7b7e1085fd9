# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Whose a bandwidth-bound kernel is: the prediction's "elementwise" group split by origin and by phase of the step.

Why: two programs of one model differ in elementwise time (8B on 4 x GB300: fp8 90.8 ms, the NVFP4 recipe with FP8
attention projections 112.8 ms, issue 36), and the total does not say which kernels the difference is. The compiled
program does: each kernel carries jax's name stack (MaxText.preflight.kernels: `Kernel.attributed`) and, for TE's
calls, a custom-call target and result types. Origins, first match wins:
  - the plugin's non-finite guard, and its periodic taps (statistics, audit): the named scopes GUARD_SCOPE and
    TAP_SCOPE they run under (MaxText.backends.stages);
  - TE's NVFP4 quantize and RHT-amax kernels: a TE custom call (not its GEMM or fused attention) with no FP8 result
    but an FP4 one or none (te_rht_amax_ffi writes amaxes), and XLA's kernels inside an NVFP4 GEMM module of TE
    (the amax and scale arithmetic TE's quantizers leave to XLA);
  - the plugin's own NVFP4 quantizer (the emulated and fused backends): XLA's kernels inside its GEMM module
    (Nvfp4DotGeneral) or inside the quantizer's own jits (`_codes`, `_block_scaled`: what routed experts run);
  - FP8 quantization: a TE custom call whose results are FP8 and not FP4 (TE's current-scaling quantize), and XLA's
    kernels inside an FP8 GEMM module: maxtext's fp8 (flax's Fp8DirectDotGeneralOp / Fp8DotGeneralOp: its amax,
    scale and casts, which XLA fuses into producers where it can) or the plugin's FP8 attention projections on TE;
  - XLA's other kernels: norms, activations, residual adds, the saved-activation stacks, the loss and optimizer,
    and every sum of gradients (`add_any`: jax sums the cotangents of a value used twice, such as x of wi_0 and
    wi_1, under the name stack of whichever scope the sum lands in, the guard's in the 8B step).
Phases: kernels.phase (forward, backward, the forward recomputed by remat, elsewhere).
A fusion is attributed to the instruction that writes its largest output (kernels._output_scope): a reduction
fused into a kernel that was there anyway counts where that kernel does.
"""

from __future__ import annotations

import enum
import re

from MaxText.backends.stages import GUARD_SCOPE, TAP_SCOPE
from MaxText.preflight.kernels import Kernel, phase

__all__ = ["GUARD_SCOPE", "PHASES", "TAP_SCOPE", "Origin", "origin", "split_key"]

#: The phases of kernels.phase, in the report's order.
PHASES = ("forward", "backward", "recomputed forward", "elsewhere")


class Origin(enum.StrEnum):
  """Whose an elementwise kernel is, in the report's order."""

  TE_NVFP4 = "TE NVFP4 quantize, RHT amax"
  """TransformerEngine's NVFP4 quantize and RHT-amax kernels, and XLA's kernels inside TE's NVFP4 GEMM modules."""
  NVFP4_OURS = "our NVFP4 quantizer"
  """The plugin's own quantizer, XLA-compiled (emulated and fused backends): its GEMM modules and quantizer jits."""
  FP8 = "FP8 quantization"
  """TE's FP8 quantize calls and XLA's kernels inside an FP8 GEMM module (maxtext's fp8, FP8 attention on TE)."""
  GUARD = "non-finite guard"
  """The plugin's nvfp4_nonfinite_check: max|.| checks and the poisoning products (GUARD_SCOPE)."""
  TAPS = "statistics, audit"
  """The plugin's periodic taps, both branches of their conditional (TAP_SCOPE)."""
  OTHER = "XLA's other kernels"
  """Everything else XLA launches: norms, activations, residual adds, saved-activation stacks, loss, optimizer."""


#: Name-stack components of GEMM modules, by the precision their quantization is. The plugin's TE modules are
#: TeDotGeneral_nvfp4 / TeDotGeneral_fp8 (MaxText.backends.te); maxtext's fp8 runs flax's Fp8DirectDotGeneralOp
#: (or Fp8DotGeneralOp for delayed scaling); upstream maxtext's te_nvfp4 runs TE's DenseGeneral (its `TEWrapper`).


def _component(names: str) -> re.Pattern[str]:
  """A whole component of a name stack: "a/NAME/b", or "jvp(NAME)" (jax wraps the outermost scope of a
  differentiated function in its transformation's name)."""
  return re.compile(rf"(^|[/(])({names})([/)]|$)")


_MODULES = ((_component("TeDotGeneral_fp8|Fp8DirectDotGeneralOp|Fp8DotGeneralOp"), Origin.FP8),
            (_component("TeDotGeneral_nvfp4|TEWrapper"), Origin.TE_NVFP4),
            # MaxText.backends.emulated's module, and MaxText.nvfp4.quantize's jitted quantizers (jit(_codes) ...)
            (_component("Nvfp4DotGeneral|_codes|_block_scaled"), Origin.NVFP4_OURS))
_GUARD = _component(GUARD_SCOPE)
_TAP = _component(TAP_SCOPE)


def _te_call(kernel: Kernel) -> bool:
  """A TE custom call other than its GEMM and fused attention: a quantize, an amax, a transpose."""
  return kernel.te and kernel.target != "te_gemm_v2_ffi" and "fused_attn" not in kernel.target


def origin(kernel: Kernel) -> Origin:
  """The origin of an elementwise kernel (module docstring)."""
  name = kernel.attributed
  if name.endswith("/add_any"):
    return Origin.OTHER  # jax's sum of cotangents where a value fans out, named after the scope it lands in
  if _GUARD.search(name):
    return Origin.GUARD
  if _TAP.search(name):
    return Origin.TAPS
  if _te_call(kernel):
    fp4 = any(t.startswith("f4") for t in kernel.results)
    fp8 = any(t.startswith("f8") for t in kernel.results)
    return Origin.FP8 if fp8 and not fp4 else Origin.TE_NVFP4
  for pattern, found in _MODULES:
    if pattern.search(name):
      return found
  return Origin.OTHER


def split_key(kernel: Kernel) -> tuple[Origin, str]:
  """(origin, phase) of an elementwise kernel: the row of the split it counts in."""
  return origin(kernel), phase(kernel)
