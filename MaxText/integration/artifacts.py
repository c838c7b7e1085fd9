# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What a training run writes for the tools to read: the precision plan, the run record and the metric names.

Why one module of typed models (pydantic, as the config schema and report.json are): the writers in this layer
(`plan`, `run_record`, `telemetry`) and the readers (`MaxText.compare`) import the same definitions, so a renamed
field or metric breaks a test instead of a report. Only pydantic here: the comparison tool reads these files without
maxtext or jax (MaxText.precision.keys is pydantic only too). A file from another version that does not validate is
the reader's to handle (compare does without it and says so).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from MaxText.precision.keys import PluginKeys
from MaxText.precision.taps import AUDIT, STATISTICS

__all__ = ["AUDIT_PREFIX", "CHANGES_FILE", "PLAN_FILE", "RECORD_FILE", "STATS_PREFIX", "Flops", "GemmEntry", "Plan",
           "RecipeRecord", "RunRecord", "StatName", "SwitchesRecord", "audit_name", "parse_stat_name", "stat_name"]

PLAN_FILE = "precision_plan.json"
RECORD_FILE = "nvfp4_run.json"
CHANGES_FILE = "precision_changes.jsonl"


class _Model(BaseModel):
  model_config = ConfigDict(extra="forbid", frozen=True)


class GemmEntry(_Model):
  """One GEMM of the built model, with what it really runs."""

  module: str = Field(description="NNX path, e.g. decoder/layers/mlp/wi_0 (scanned layers share one entry)")
  kernel_axes: tuple[str | None, ...]
  precision: Literal["nvfp4", "fp8", "bf16"]
  backend: str = Field(description="emulated | te | - (unquantized)")
  implementation: str = Field(description="the dot_general module (or grouped GEMM) that runs it")
  kind: Literal["dense", "router", "experts"] = Field(
      "dense", description="dense (a DenseGeneral), router (MoE gate), experts (a routed-expert weight stack)")


class RecipeRecord(_Model):
  rht: bool
  stochastic_rounding: bool
  weight_2d: bool


class SwitchesRecord(_Model):
  bf16_first_layers: int
  bf16_last_layers: int
  bf16_layers: list[int]
  bf16_from_step: int | None
  bf16_forward_from_step: int | None


class Flops(_Model):
  """The MLP GEMMs' share of the training FLOPs by maxtext's own count (MaxText.integration.flops)."""

  tflops_per_device_step: float
  mlp_tflops_per_device_step: float
  mlp_flop_share: float


class Plan(_Model):
  """precision_plan.json: what each GEMM of the built model runs (MaxText.integration.plan)."""

  backend: Literal["emulated", "te", "fused"]
  recipe: RecipeRecord
  switches: SwitchesRecord
  decoder_layers_mlp: list[str] = Field(description="the MLP precision of each decoder layer, in order")
  gemms: list[GemmEntry]
  flops: Flops | None = None

  @property
  def nvfp4_gemms(self) -> int:
    return sum(g.precision == "nvfp4" for g in self.gemms)


class RunRecord(PluginKeys):
  """nvfp4_run.json: every nvfp4_* key of the schema with the value the run used, and `quantization`
  (MaxText.integration.run_record). A resume compares a checkpoint's record with its own key by key."""

  quantization: str

#: Every per-GEMM statistic's metric name starts with it (the statistics tap's prefix, MaxText.precision.taps).
STATS_PREFIX = STATISTICS.prefix


class StatName(_Model):
  """One statistic's metric name, `nvfp4/layer_03/mlp/wo/wgrad_dy/rel_error`: decoder layer, GEMM (its module path
  inside the layer), operand, statistic."""

  layer: int
  gemm: str
  operand: str
  stat: str


def stat_name(layer: int, gemm: str, operand: str, stat: str) -> str:
  """The metric name of one statistic (parse_stat_name inverts it)."""
  return STATISTICS.metric(layer, gemm, operand, stat)


#: Every audit count's metric name starts with it: `nvfp4/audit/layer_03/mlp/wo/dgrad_dy/codes`.
AUDIT_PREFIX = AUDIT.prefix


def audit_name(layer: int, gemm: str, operand: str, column: str) -> str:
  """The metric name of one audit count: mismatching codes, scales or amax of one operand of one GEMM."""
  return AUDIT.metric(layer, gemm, operand, column)


def parse_stat_name(name: str) -> StatName | None:
  """The parts of a statistic's metric name, or None for any other metric."""
  parts = STATISTICS.parse(name)
  return None if parts is None else StatName(layer=parts[0], gemm=parts[1], operand=parts[2], stat=parts[3])
