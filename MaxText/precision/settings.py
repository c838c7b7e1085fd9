# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The one settings object: a config's quantization and nvfp4_* keys, read once into frozen, typed fields.

Why: the keys were read piecemeal (`getattr(config, "nvfp4_...", default)`) in several modules, each unwrapping
enums its own way. `Settings.from_config` is the only reader of nvfp4_* keys outside the config schema
(`MaxText.integration.config`); the quant object, experts, switches, plan and run record take a `Settings`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.precision.modes import NVFP4_MODES, Backend, plain
from MaxText.precision.policy import Precision, PrecisionPolicy
from MaxText.precision.switches import Switches

__all__ = ["KEY_PREFIX", "Settings"]

#: Every plugin key starts with it (the config schema declares them; the run record stores them all).
KEY_PREFIX = "nvfp4_"


def _keys(config: Any) -> dict[str, Any]:
  """The config's keys as a dict: maxtext's HyperParameters has get_keys(), its pydantic config model_dump()."""
  if hasattr(config, "get_keys"):
    return dict(config.get_keys())
  if hasattr(config, "model_dump"):
    return {name: getattr(config, name) for name in type(config).model_fields}
  return dict(vars(config))


def _frozen(value: Any) -> Any:
  """A list key (nvfp4_bf16_layers) as a tuple, so Settings stays hashable."""
  return tuple(value) if isinstance(value, list) else value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
  """What the plugin does for one config. Hashable: Linen modules and caches may hold it.

  quantization: the config's `quantization` as a plain string ('' when unset).
  backend: nvfp4_backend as asked (auto is resolved later, against the machine: MaxText.backends.environment).
  mlp, attention: the per-class precisions of the policy (nvfp4_mlp_precision, nvfp4_attention_precision).
  moe_experts: nvfp4_moe_experts as asked (nvfp4 or bf16); `experts` says what the routed experts really run.
  recipe: the GEMM recipe (RHT from the mode, stochastic rounding, 2D weight scaling).
  switches: the BF16 layers and steps, with the decoder layer count.
  nonfinite_check: the TE backend's NaN/Inf guard (nvfp4_nonfinite_check).
  stats_interval: per-GEMM operand statistics every N steps, 0 off (nvfp4_stats_interval).
  record: every nvfp4_* key with its plain value, plus quantization: what a run directory records.
  """

  quantization: str = "te_nvfp4"
  backend: Backend = Backend.AUTO
  mlp: Precision = Precision.NVFP4
  attention: Precision = Precision.BF16
  moe_experts: Precision = Precision.NVFP4
  recipe: GemmRecipe = GemmRecipe()
  switches: Switches = Switches()
  nonfinite_check: bool = True
  stats_interval: int = 0
  record: tuple[tuple[str, Any], ...] = ()

  @property
  def nvfp4(self) -> bool:
    """Whether the config's quantization is one of the plugin's modes (else the plugin does nothing)."""
    return self.quantization in NVFP4_MODES

  @property
  def policy(self) -> PrecisionPolicy:
    return PrecisionPolicy(mlp=self.mlp, attention=self.attention, recipe=self.recipe)

  @property
  def experts(self) -> Precision:
    """Routed experts are MLPs: NVFP4 when the MLP GEMMs are and nvfp4_moe_experts=nvfp4, else BF16."""
    return Precision.NVFP4 if self.mlp is Precision.NVFP4 and self.moe_experts is Precision.NVFP4 else Precision.BF16

  @property
  def experts_opted_out(self) -> bool:
    """nvfp4_moe_experts=bf16 was asked for (the plan then accepts BF16 experts)."""
    return self.moe_experts is Precision.BF16

  @classmethod
  def from_config(cls, config: Any) -> Settings:
    """Reads maxtext's config (HyperParameters or the pydantic model, with the plugin's keys) once."""
    keys = _keys(config)
    quantization = plain(keys.get("quantization"))
    ours = {k: keys[k] for k in sorted(keys) if k.startswith(KEY_PREFIX)}
    record = tuple((k, _frozen(getattr(v, "value", v))) for k, v in ours.items()) + (("quantization", quantization),)
    if quantization not in NVFP4_MODES and "nvfp4_backend" not in ours:
      # A config loaded without the plugin's class (it is not an NVFP4 run): the plugin does nothing with it.
      return cls(quantization=quantization, record=record)
    return cls(
        quantization=quantization,
        backend=Backend(plain(ours["nvfp4_backend"])),
        mlp=Precision(plain(ours["nvfp4_mlp_precision"])),
        attention=Precision(plain(ours["nvfp4_attention_precision"])),
        moe_experts=Precision(plain(ours["nvfp4_moe_experts"])),
        recipe=GemmRecipe(rht=quantization != "te_nvfp4_no_rht",
                          stochastic_rounding=bool(ours["nvfp4_stochastic_rounding"]),
                          weight_2d=bool(ours["nvfp4_2d_weight_scaling"])),
        switches=Switches(first_layers=int(ours["nvfp4_bf16_first_layers"] or 0),
                          last_layers=int(ours["nvfp4_bf16_last_layers"] or 0),
                          layers=tuple(int(i) for i in ours.get("nvfp4_bf16_layers") or ()),
                          num_layers=int(keys.get("num_decoder_layers") or 0),
                          from_step=ours["nvfp4_bf16_from_step"],
                          forward_from_step=ours["nvfp4_bf16_forward_from_step"]),
        nonfinite_check=bool(ours["nvfp4_nonfinite_check"]),
        stats_interval=int(ours.get("nvfp4_stats_interval") or 0),
        record=record,
    )
