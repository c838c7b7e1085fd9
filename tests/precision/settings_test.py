# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The one settings object: built from the schema's keys and two plain facts, the recipe by default, one
statistics-step rule for Python and traced steps."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.precision.keys import PluginKeys
from MaxText.precision.modes import Backend
from MaxText.precision.policy import Precision
from MaxText.precision.settings import KEY_PREFIX, Settings
from MaxText.precision.switches import Switches
from MaxText.precision.taps import STATISTICS


def test_the_schemas_defaults_are_nvidias_recipe():
  settings = Settings.of(PluginKeys(), quantization="te_nvfp4", num_layers=4)
  assert settings.recipe == GemmRecipe() and settings.recipe.rht and settings.recipe.stochastic_rounding
  assert (settings.mlp, settings.attention, settings.experts) == (Precision.NVFP4, Precision.BF16, Precision.NVFP4)
  assert settings.backend is Backend.AUTO and settings.nonfinite_check and not settings.taps_on
  assert settings.intervals == (("nvfp4_stats_interval", 0), ("nvfp4_audit_interval", 0), ("nvfp4_calibration_interval", 0))
  assert settings.switches == Switches(num_layers=4) and not settings.switches.any
  assert settings.nvfp4 and hash(settings) == hash(Settings.of(PluginKeys(), quantization="te_nvfp4", num_layers=4))


def test_the_mode_and_the_keys_reach_their_fields():
  keys = PluginKeys(nvfp4_backend="emulated", nvfp4_stochastic_rounding=False, nvfp4_2d_weight_scaling=False,
                    nvfp4_mlp_precision="bf16", nvfp4_bf16_layers=[2], nvfp4_bf16_from_step=9, nvfp4_stats_interval=3)
  settings = Settings.of(keys, quantization="te_nvfp4_no_rht", num_layers=6)
  assert settings.recipe == GemmRecipe(rht=False, stochastic_rounding=False, weight_2d=False)
  assert settings.switches == Switches(layers=(2,), num_layers=6, from_step=9)
  assert settings.experts is Precision.BF16 and not settings.experts_opted_out  # MLP BF16: experts follow
  record = dict(settings.record)
  assert set(record) == {*PluginKeys.model_fields, "quantization"} and all(
      k.startswith(KEY_PREFIX) for k in record if k != "quantization")
  assert record["nvfp4_backend"] == "emulated" and record["nvfp4_bf16_layers"] == (2,)
  assert not Settings.of(PluginKeys(), quantization="fp8", num_layers=1).nvfp4


def test_a_misspelt_key_is_refused_by_the_schema():
  with pytest.raises(ValueError, match="nvfp4_stats_intervall"):
    PluginKeys(nvfp4_stats_intervall=2)


@pytest.mark.parametrize(("interval", "from_step", "expected"), [
    (3, None, [0, 3, 6, 9]),
    (3, 6, [0, 3]),  # the switch step itself runs every GEMM in BF16: nothing to measure
    (4, 5, [0, 4]),
    (0, None, []),
])
def test_one_statistics_step_rule_on_the_host_and_in_the_trace(interval, from_step, expected):
  settings = Settings.of(PluginKeys(nvfp4_stats_interval=interval, nvfp4_bf16_from_step=from_step),
                         quantization="te_nvfp4", num_layers=2)
  assert [s for s in range(10) if STATISTICS.is_step(settings, s)] == expected
  traced = jax.jit(lambda step: jnp.asarray(STATISTICS.is_step(settings, step)))
  assert [s for s in range(10) if bool(traced(jnp.int32(s)))] == expected
