# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The recipe's BF16 switches as plain data: BF16 first/last decoder layers and the late switch of GEMMs to BF16.

NVIDIA's NVFP4 pretraining paper keeps some blocks in BF16 (12B: the first 2 and last 8 of 62) and switches the
GEMMs (or only the forward pass) to BF16 for the last part of training. Neither may need a maxtext edit and both
must hold in one compiled program, so both are decided by traced values inside the GEMM
(`MaxText.backends.flags`): the layer from a per-GEMM index variable written after maxtext builds the model
(`MaxText.integration.layers`), the step from the train state maxtext's train_step is handed
(`MaxText.integration.steps`). This module only says what the keys mean.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Switches", "layer_precisions", "summary"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Switches:
  """The five nvfp4_bf16_* keys, with the layer count they refer to; hashable so Linen modules can hold it."""

  first_layers: int = 0
  last_layers: int = 0
  layers: tuple[int, ...] = ()  # nvfp4_bf16_layers: single decoder layers steered to BF16 (0-based)
  num_layers: int = 0
  from_step: int | None = None
  forward_from_step: int | None = None

  @property
  def per_layer(self) -> bool:
    return bool(self.first_layers or self.last_layers or self.layers)

  @property
  def any(self) -> bool:
    return self.per_layer or self.from_step is not None or self.forward_from_step is not None

  def bf16_layer(self, index: int) -> bool:
    """Whether decoder layer `index` (0-based) runs its MLP GEMMs in BF16."""
    return index < self.first_layers or index >= self.num_layers - self.last_layers or index in self.layers

  def bf16_layer_count(self) -> int:
    """How many decoder layers run their MLP GEMMs in BF16 (first, last and named layers together)."""
    return sum(self.bf16_layer(i) for i in range(self.num_layers))

  def describe(self) -> dict[str, Any]:
    return {"bf16_first_layers": self.first_layers, "bf16_last_layers": self.last_layers,
            "bf16_layers": list(self.layers),
            "bf16_from_step": self.from_step, "bf16_forward_from_step": self.forward_from_step}


def layer_precisions(switches: Switches, mlp_precision: str) -> list[str]:
  """The MLP GEMM precision of each decoder layer, in order (before any late switch step)."""
  if mlp_precision != "nvfp4":
    return [mlp_precision] * switches.num_layers
  return ["bf16" if switches.bf16_layer(i) else "nvfp4" for i in range(switches.num_layers)]


def _ranges(precisions: list[str]) -> str:
  """'0-3: nvfp4, 4: bf16': runs of equal precision over the decoder layers."""
  runs: list[tuple[int, int, str]] = []
  for i, p in enumerate(precisions):
    if runs and runs[-1][2] == p:
      runs[-1] = (runs[-1][0], i, p)
    else:
      runs.append((i, i, p))
  return ", ".join(f"{a}{'' if a == b else f'-{b}'}: {p}" for a, b, p in runs)


def summary(switches: Switches, mlp_precision: str, attention_precision: str = "bf16") -> str:
  """One line for the printed plan: layer ranges and their NVFP4 GEMMs' precision (the MLP's, and the attention
  projections' where they are NVFP4 too: the BF16 layers steer both), then the switch steps."""
  what, precision = "MLP GEMMs", mlp_precision
  if attention_precision == "nvfp4":
    what = "MLP and attention GEMMs" if mlp_precision == "nvfp4" else "attention GEMMs"
    precision = "nvfp4"
  steps = []
  if switches.forward_from_step is not None:
    steps.append(f"forward NVFP4 GEMMs in BF16 from step {switches.forward_from_step}")
  if switches.from_step is not None:
    steps.append(f"all NVFP4 GEMMs in BF16 from step {switches.from_step}")
  layers = _ranges(layer_precisions(switches, precision))
  return f"{what} per decoder layer: {layers}" + (f"; {'; '.join(steps)}" if steps else "")
