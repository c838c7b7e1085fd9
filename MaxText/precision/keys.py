# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The plugin's config keys (all `nvfp4_*`), declared once: type, default and description of each.

Why a pydantic model of its own, below maxtext: maxtext's config class gains these keys by inheritance
(`MaxText.integration.config.NVFP4Config` derives from maxtext's `MaxTextConfig` and from this), so the schema is the
one place a default is written. `configs/base.yml` lists the same defaults for a reader, and a test keeps the two
equal; tests and tools build settings from `PluginKeys(...)` without loading maxtext.
"""

from __future__ import annotations

import pydantic
from pydantic import Field

from MaxText.precision.modes import AttentionPrecision, AuditAction, Backend, MlpPrecision, MoeExperts
from MaxText.precision.taps import TAPS

__all__ = ["PluginKeys"]


class _DeclaredKeys(pydantic.BaseModel):
  """The nvfp4_* keys. They take effect only when `quantization` is one of the plugin's modes (NVFP4_MODES); with
  any other quantization they are validated and ignored (the validators in MaxText.integration.config say where)."""

  model_config = pydantic.ConfigDict(extra="forbid")  # as maxtext's config: a misspelt key is an error

  nvfp4_backend: Backend = Field(
      Backend.AUTO,
      description="Implementation of the NVFP4 GEMMs: 'auto' (TE on Blackwell, else emulated), 'te', 'emulated', "
      "'fused' (our quantizer compiled into the step, NVIDIA's block-scaled GEMM).",
  )
  nvfp4_attention_precision: AttentionPrecision = Field(
      AttentionPrecision.BF16,
      description="Precision of the attention projections under an NVFP4 mode: 'bf16' (the recipe), 'fp8', or"
      " 'nvfp4' (the MLP's NVFP4 recipe on query, key, value and out; the attention core stays unquantized).",
  )
  nvfp4_mlp_precision: MlpPrecision = Field(
      MlpPrecision.NVFP4,
      description="Precision of the MLP GEMMs under an NVFP4 mode: 'nvfp4' (the recipe) or 'bf16' (a baseline that"
      " keeps the same quant object and so the same initial weights).",
  )
  nvfp4_moe_experts: MoeExperts = Field(
      MoeExperts.NVFP4,
      description="Routed-expert GEMMs under an NVFP4 mode: 'nvfp4' (the MLP recipe per expert; the emulated and fused"
      " backends) or 'bf16' (experts unquantized; required with nvfp4_backend=te). Follows nvfp4_mlp_precision=bf16.",
  )
  nvfp4_stochastic_rounding: bool = Field(
      True,
      description=(
          "Stochastic rounding of the output gradient dY when it is quantized to FP4 (NVIDIA's recipe; weights"
          " and activations always round to nearest-even). False: nearest-even everywhere (an ablation)."
      ),
  )
  nvfp4_2d_weight_scaling: bool = Field(
      True,
      description=(
          "16x16 block scales for weights, shared by W and W^T so forward and backward see the same quantized"
          " weight (NVIDIA's recipe). False: 1x16 blocks like the other operands (an ablation)."
      ),
  )
  nvfp4_nonfinite_check: bool = Field(
      True,
      description=(
          "TE backend: make an NVFP4 GEMM's output (y, dx or dW) NaN when one of its operands holds a NaN/inf (TE's"
          " FP4 quantizer can turn a NaN into a finite value). Costs a max|.| per operand; false turns it off."
      ),
  )

  nvfp4_audit_action: AuditAction = Field(
      AuditAction.WARN,
      description="What an audit mismatch does: 'warn' (one line naming the first mismatch; training goes on) or"
      " 'stop' (the run ends with an error after the step's checkpoint policy has run).",
  )

  nvfp4_bf16_first_layers: int = Field(
      0,
      description="The first N decoder layers run their MLP GEMMs in BF16 (NVIDIA's recipe keeps ~15% of the"
      " blocks, mostly at the end, in BF16). Works with scan_layers true and false.",
  )
  nvfp4_bf16_last_layers: int = Field(
      0,
      description="The last N decoder layers run their MLP GEMMs in BF16 (the paper: the last 8 of 62 blocks).",
  )
  nvfp4_bf16_layers: list[int] = Field(
      [],
      description="Decoder layers (0-based indices) whose MLP GEMMs (dense and experts) run in BF16, on top of the"
      " first/last layers: steer single layers that the nvfp4/ statistics show losing most. [] : none.",
  )
  nvfp4_bf16_from_step: int | None = Field(
      None,
      description="From this training step on (maxtext's step: the step number in the metrics; 0 is the first"
      " update) every NVFP4 GEMM runs in BF16, forward and backward. None: never. Same compiled program; exact"
      " across a checkpoint resume.",
  )
  nvfp4_bf16_forward_from_step: int | None = Field(
      None,
      description="From this training step on only the forward NVFP4 GEMMs run in BF16; dgrad and wgrad stay NVFP4"
      " (the paper: switching the forward pass recovers most of the gap); both backends. None: never.",
  )


#: The nvfp4_* keys: those declared above, and each tap's interval (MaxText.precision.taps: `nvfp4_<name>_interval`,
#: built from the registry so that a tap declared outside the package loads like the built-in ones).
PluginKeys = pydantic.create_model(
    "PluginKeys", __base__=_DeclaredKeys, __module__=__name__,
    **{tap.key: (int, Field(0, description=tap.description)) for tap in TAPS})
PluginKeys.__doc__ = _DeclaredKeys.__doc__
