# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The share of a config's training FLOPs that its MLP GEMMs carry, by maxtext's own FLOP count.

Why: NVFP4 runs only the MLP GEMMs (dense and expert), so a comparison between precisions says something about
NVFP4 only where those GEMMs do most of the work. A small model with a large vocabulary spends its FLOPs in the
output projection and would show every precision alike; the comparison report prints this share beside the gaps.

How: maxtext's `calculate_tflops_training_per_device` (what its trainer logs as TFLOP/s per device) is evaluated
twice, once as configured and once with the MLP widths (`mlp_dim`, `moe_mlp_dim`) read as 0; the difference is
every FLOP maxtext attributes to MLPs, forward and backward, in every layer (dense MLPs, routed and shared experts),
and nothing else (the MoE router's FLOPs do not depend on those widths and stay outside). No second formula to keep
in step with maxtext's.
"""

from __future__ import annotations

from typing import Any

from maxtext.utils import maxtext_utils

#: Config keys that set MLP widths in maxtext's FLOP count.
_MLP_WIDTHS = ("mlp_dim", "moe_mlp_dim")


class _WithoutMlps:
  """A read-only view of a maxtext config with every MLP width 0."""

  def __init__(self, config: Any):
    self._config = config

  def __getattr__(self, name: str) -> Any:
    return 0 if name in _MLP_WIDTHS else getattr(self._config, name)


def training_flops(config: Any) -> dict[str, float]:
  """{"tflops_per_device_step": maxtext's training TFLOPs per device and step, "mlp_tflops_per_device_step": the MLPs'
  part of it, "mlp_flop_share": their ratio}."""
  total = maxtext_utils.calculate_tflops_training_per_device(config, log=False)[0]
  without = maxtext_utils.calculate_tflops_training_per_device(_WithoutMlps(config), log=False)[0]
  return {
      "tflops_per_device_step": total,
      "mlp_tflops_per_device_step": total - without,
      "mlp_flop_share": (total - without) / total,
  }
