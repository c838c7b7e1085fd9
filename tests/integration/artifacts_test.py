# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The contracts shared with the tools: metric names written by the trainer parse back in compare; the run record is
the schema's keys."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from MaxText.compare import quantstats
from MaxText.integration import artifacts, telemetry
from MaxText.nvfp4.operands import GEMM_OPERANDS
from MaxText.nvfp4.stats import STAT_NAMES
from MaxText.precision.keys import PluginKeys
from MaxText.precision.switches import Switches
from tests.helpers import settings


def test_every_statistic_the_trainer_names_parses_back():
  state = {"model": {"decoder": {"layers": {"mlp": {"wo": {"Nvfp4DotGeneral_0": {"nvfp4_stats": jnp.zeros((2, 5, 4))}}}}}}}
  names = telemetry.stats_metrics(state, settings(switches=Switches(num_layers=2), stats_interval=1))
  parsed = {artifacts.parse_stat_name(n) for n in names}
  assert {(p.layer, p.gemm, p.operand, p.stat) for p in parsed} == {
      (layer, "mlp/wo", o, s) for layer in (0, 1) for o in GEMM_OPERANDS for s in STAT_NAMES}
  assert all(quantstats.parse_name(n) is not None for n in names)
  assert artifacts.parse_stat_name("learning/loss") is None


def test_the_run_record_holds_the_schemas_keys():
  record = artifacts.RunRecord.model_validate(dict(settings().record)).model_dump(mode="json")
  assert set(record) == {*PluginKeys.model_fields, "quantization"} and record["quantization"] == "te_nvfp4"
  with pytest.raises(ValueError):
    artifacts.RunRecord.model_validate({**record, "nvfp4_renamed_key": 1})
