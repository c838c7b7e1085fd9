# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The plugin's names: the `quantization=` modes it serves and the choices its config keys take, each once."""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["NVFP4_MODES", "AttentionPrecision", "AuditAction", "Backend", "MlpPrecision", "MoeExperts", "is_nvfp4",
           "plain"]

# The `quantization=` values this plugin serves. maxtext's own `QuantizationType` enum already lists both, so
# no maxtext edit is needed for them to pass validation; the plugin takes over what they do at model creation.
NVFP4_MODES: tuple[str, ...] = ("te_nvfp4", "te_nvfp4_no_rht")


def plain(setting: Any) -> str:
  """A config value as a plain string: maxtext's config holds str Enums, or plain strings after overrides."""
  return str(getattr(setting, "value", setting) if setting is not None else "")


def is_nvfp4(quantization: Any) -> bool:
  """Whether a `quantization` value (enum, string or None) is one of NVFP4_MODES."""
  return plain(quantization) in NVFP4_MODES


class Backend(str, enum.Enum):
  """Which implementation runs the NVFP4 GEMMs (config key nvfp4_backend).

  AUTO: TE when transformer_engine imports and every local GPU has compute capability >= 10.0 (Blackwell),
    else EMULATED; the choice is logged in one line, never made silently.
  TE: TransformerEngine's NVFP4 GEMMs; a clear error before compiling when TE or a Blackwell GPU is missing.
  EMULATED: pure JAX, bit-identical quantized operands to TE's quantizer; runs anywhere, CPU included.
  FUSED: the emulated backend's quantizer compiled into the step by XLA (it can fuse into the operands' producers),
    keeping codes and block scales only, multiplied by NVIDIA's block-scaled GEMM through `jax.nn.scaled_matmul`
    (cuDNN where XLA has it; a dequantize + f32 dot elsewhere, the emulated backend's numbers). Asked for by name.
  """

  AUTO = "auto"
  TE = "te"
  EMULATED = "emulated"
  FUSED = "fused"


class AttentionPrecision(str, enum.Enum):
  """Precision of the attention projections (query, key, value or the fused qkv, and out) when an NVFP4 mode is on.

  NVIDIA's NVFP4 recipe keeps attention out of FP4 (BF16, the default); the attention core (QK^T, softmax, AV) is
  never quantized by the plugin.
  BF16: attention GEMMs in the model's compute dtype, unquantized.
  FP8: attention GEMMs in FP8: maxtext's own fp8 where TE is not used, TE FP8 current scaling with the TE
    backend.
  NVFP4: the recipe's NVFP4 GEMMs, as the MLP's (1x16 activations, 16x16 weights, RHT and stochastic rounding in
    the backward, the BF16 layers and late switches): an opt-in, as upstream maxtext's te_nvfp4 quantizes every GEMM.
  """

  BF16 = "bf16"
  FP8 = "fp8"
  NVFP4 = "nvfp4"


class MlpPrecision(str, enum.Enum):
  """Precision of the MLP GEMMs when an NVFP4 mode is on.

  NVFP4: NVIDIA's recipe. BF16: the same run with the MLP unquantized while keeping the NVFP4 quant object, so
    parameter initialization is identical to the NVFP4 runs: the BF16 baseline of a precision comparison.
  """

  NVFP4 = "nvfp4"
  BF16 = "bf16"


class MoeExperts(str, enum.Enum):
  """Precision of the routed-expert GEMMs (MoE: num_experts > 1) under an NVFP4 mode.

  NVFP4: the MLP recipe per expert (emulated backend: TE 2.20.2 has no NVFP4 grouped GEMM).
  BF16: experts unquantized, dense GEMMs NVFP4; required with nvfp4_backend=te, and said in the plan.
  """

  NVFP4 = "nvfp4"
  BF16 = "bf16"


class AuditAction(str, enum.Enum):
  """What an NVFP4 audit mismatch (nvfp4_audit_interval) does to the run.

  WARN: one line naming the first mismatching layer, GEMM, operand and count; training goes on.
  STOP: the run ends with a clear error once the step's checkpoint policy has run (nothing is lost).
  """

  WARN = "warn"
  STOP = "stop"
