# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The one settings object: a config's quantization and nvfp4_* keys, read once into frozen, typed fields.

Why: every part of the plugin (quant object, GEMM modules, experts, plan, run record, statistics) needs the same few
facts, each unwrapped from enums and lists the same way. `Settings.of` builds them from the plugin's keys
(`PluginKeys`, the schema) plus the two plain facts of the model they refer to; the integration layer reads those off
a maxtext config once per config (`MaxText.integration.settings.settings_of`) and hands the whole object down. No
default is written here: the schema holds them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.precision.keys import PluginKeys
from MaxText.precision.modes import NVFP4_MODES, AuditAction, Backend, plain
from MaxText.precision.policy import Precision, PrecisionPolicy
from MaxText.precision.switches import Switches
from MaxText.precision.taps import TAPS, Tap

__all__ = ["KEY_PREFIX", "Settings"]

#: Every plugin key starts with it (the schema declares them; the run record stores them all).
KEY_PREFIX = "nvfp4_"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
  """What the plugin does for one config. Hashable: Linen modules and caches hold it.

  quantization: the config's `quantization` as a plain string ('' when unset).
  backend: nvfp4_backend as asked (auto is resolved later, against an environment: MaxText.backends.environment).
  mlp, attention: the per-class precisions of the policy (nvfp4_mlp_precision, nvfp4_attention_precision).
  moe_experts: nvfp4_moe_experts as asked (nvfp4 or bf16); `experts` says what the routed experts really run.
  recipe: the GEMM recipe (RHT from the mode, stochastic rounding, 2D weight scaling).
  switches: the BF16 layers and steps, with the decoder layer count.
  nonfinite_check: the TE backend's NaN/Inf guard (nvfp4_nonfinite_check).
  intervals: (key, N) of every tap (MaxText.precision.taps), N = 0 off: the periodic measurements of the GEMMs.
  audit_action: what an in-training audit mismatch does (nvfp4_audit_action).
  record: every nvfp4_* key with its plain value, plus quantization: what a run directory records.
  """

  quantization: str
  backend: Backend
  mlp: Precision
  attention: Precision
  moe_experts: Precision
  recipe: GemmRecipe
  switches: Switches
  nonfinite_check: bool
  intervals: tuple[tuple[str, int], ...]
  audit_action: AuditAction
  record: tuple[tuple[str, Any], ...]

  @property
  def nvfp4(self) -> bool:
    """Whether the config's quantization is one of the plugin's modes (else the plugin does nothing)."""
    return self.quantization in NVFP4_MODES

  @property
  def policy(self) -> PrecisionPolicy:
    return PrecisionPolicy(mlp=self.mlp, attention=self.attention, recipe=self.recipe)

  @property
  def nvfp4_gemms(self) -> bool:
    """Whether any dense GEMM class is asked to run in NVFP4 (the MLP's, the attention projections' or both): a
    run without one is an all-BF16 (or FP8-attention) baseline, where keys that measure or steer NVFP4 GEMMs have
    nothing to act on."""
    return bool(self.policy.nvfp4_classes)

  @property
  def experts(self) -> Precision:
    """Routed experts are MLPs: NVFP4 when the MLP GEMMs are and nvfp4_moe_experts=nvfp4, else BF16."""
    return Precision.NVFP4 if self.mlp is Precision.NVFP4 and self.moe_experts is Precision.NVFP4 else Precision.BF16

  @property
  def experts_opted_out(self) -> bool:
    """nvfp4_moe_experts=bf16 was asked for (the plan then accepts BF16 experts)."""
    return self.moe_experts is Precision.BF16

  def interval(self, key: str) -> int:
    """The interval of the tap whose config key is `key` (Tap.key), 0 when off."""
    return dict(self.intervals)[key]

  def with_interval(self, key: str, interval: int) -> Settings:
    """These settings with the tap whose config key is `key` at `interval` (0: off)."""
    if key not in dict(self.intervals):
      raise KeyError(f"{key} is not a tap's interval key; they are {[k for k, _ in self.intervals]}")
    return dataclasses.replace(self, intervals=tuple((k, interval if k == key else v) for k, v in self.intervals))

  @property
  def taps_on(self) -> tuple[Tap, ...]:
    """The taps this run measures with (interval > 0), in registry order."""
    return tuple(tap for tap in TAPS if self.interval(tap.key))

  @property
  def bf16_mlp_taps(self) -> tuple[Tap, ...]:
    """The taps on that measure the BF16 MLP GEMMs' weight gradients too (Tap.gradient): with
    nvfp4_mlp_precision=bf16 (dense MLP GEMMs and routed experts unquantized), the baseline's figures; else none."""
    return tuple(tap for tap in self.taps_on if tap.gradient) if self.mlp is Precision.BF16 else ()

  def every(self, interval: int, step: Any) -> Any:
    """The rule of every periodic measurement: every `interval`-th step (0 included), before nvfp4_bf16_from_step
    (from that step on every GEMM runs in BF16 and quantizes nothing, the switch step itself included). `step` is a
    Python int (the host: which records carry the measurement) or a traced integer (the train step: which steps
    measure); one rule for both. False for any step when `interval` is 0 (off)."""
    if not interval:
      return False
    measures = step % interval == 0
    if self.switches.from_step is not None:
      measures = measures & (step < self.switches.from_step)
    return measures

  @classmethod
  def of(cls, keys: PluginKeys, *, quantization: Any, num_layers: int) -> Settings:
    """The settings of `keys` (a PluginKeys, or maxtext's config class deriving from it) for `quantization` (enum,
    string or None) on a model of `num_layers` decoder layers."""
    mode = plain(quantization)
    values = {name: getattr(keys, name) for name in PluginKeys.model_fields}
    record = tuple((k, _frozen(plain(v) if hasattr(v, "value") else v)) for k, v in sorted(values.items()))
    return cls(
        quantization=mode,
        backend=Backend(plain(keys.nvfp4_backend)),
        mlp=Precision(plain(keys.nvfp4_mlp_precision)),
        attention=Precision(plain(keys.nvfp4_attention_precision)),
        moe_experts=Precision(plain(keys.nvfp4_moe_experts)),
        recipe=GemmRecipe(rht=mode != "te_nvfp4_no_rht", stochastic_rounding=bool(keys.nvfp4_stochastic_rounding),
                          weight_2d=bool(keys.nvfp4_2d_weight_scaling)),
        switches=Switches(first_layers=int(keys.nvfp4_bf16_first_layers), last_layers=int(keys.nvfp4_bf16_last_layers),
                          layers=tuple(int(i) for i in keys.nvfp4_bf16_layers), num_layers=int(num_layers),
                          from_step=keys.nvfp4_bf16_from_step, forward_from_step=keys.nvfp4_bf16_forward_from_step),
        nonfinite_check=bool(keys.nvfp4_nonfinite_check),
        intervals=tuple((tap.key, int(getattr(keys, tap.key))) for tap in TAPS),
        audit_action=AuditAction(plain(keys.nvfp4_audit_action)),
        record=record + (("quantization", mode),),
    )


def _frozen(value: Any) -> Any:
  """A list key (nvfp4_bf16_layers) as a tuple, so Settings stays hashable."""
  return tuple(value) if isinstance(value, list) else value
