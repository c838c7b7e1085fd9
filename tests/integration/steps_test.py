# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The training step as the GEMMs see it (MaxText.integration.steps): the state's step is current while a step is
traced, a train step's metrics carry the statistics only where they are on, and a switch step is logged once."""

from __future__ import annotations

import logging

import jax.numpy as jnp
import pytest

from MaxText.backends import flags
from MaxText.integration import settings as plugin_settings
from MaxText.integration import steps
from tests.helpers import TINY_YML, load_config


def _state(step: int, stats: float = 0.5) -> dict:
  value = jnp.full((5, 4), stats, jnp.float32)
  return {"model": {"decoder": {"layers_0": {"mlp": {"wo": {"Nvfp4DotGeneral_0": {"nvfp4_stats": value}}}}}},
          "optimizer": {"step": jnp.int32(step)}}


def _train_step(seen: list):
  def train_step(model, config, state_mesh_shardings, params_shardings, state, data, dropout_rng=None):
    del model, config, state_mesh_shardings, params_shardings, data, dropout_rng
    seen.append(int(flags.current_step()))
    return state, {"scalar": {"learning/loss": 1.0}}

  return train_step


def test_the_gemms_see_the_states_step_and_only_inside():
  seen = []
  wrapped = steps.wrap_step(_train_step(seen))
  config = load_config(TINY_YML, "quantization=te_nvfp4", "nvfp4_backend=emulated")
  _, metrics = wrapped(None, config, None, None, _state(7), None)
  _, _ = wrapped(None, config, None, None, data=None, state=_state(9))  # keywords bind by name too
  assert seen == [7, 9] and flags.current_step() is None
  assert metrics == {"scalar": {"learning/loss": 1.0}}  # statistics off: the metrics as maxtext made them


@pytest.mark.parametrize(("overrides", "with_stats"), [
    (("quantization=te_nvfp4", "nvfp4_backend=emulated", "nvfp4_stats_interval=2"), True),
    (("quantization=fp8",), False),
])
def test_a_train_steps_metrics_carry_the_statistics_where_they_are_on(overrides, with_stats):
  wrapped = steps.wrap_step(_train_step([]))
  _, metrics = wrapped(None, load_config(TINY_YML, *overrides), None, None, _state(2), None)
  stats = {k: v for k, v in metrics["scalar"].items() if k.startswith("nvfp4/")}
  assert bool(stats) is with_stats and metrics["scalar"]["learning/loss"] == 1.0
  if with_stats:
    assert float(stats["nvfp4/layer_00/mlp/wo/fprop_x/rel_error"]) == 0.5 and len(stats) == 5 * 4


def test_settings_are_read_once_per_config_not_per_step(monkeypatch, caplog):
  """The per-step host hook (training_loop_iteration) finds the config's settings in the cache; it logs a switch step
  once, when reached."""
  config = load_config(TINY_YML, "quantization=te_nvfp4", "nvfp4_backend=emulated", "nvfp4_bf16_from_step=3")
  plugin_settings.settings_of(config)
  reads = []
  monkeypatch.setattr(plugin_settings, "from_config", lambda c: reads.append(c))
  monkeypatch.setattr(steps, "_switch_logged", set())
  iteration = steps.wrap_iteration(lambda python_vars, immutable_data: None)
  with caplog.at_level(logging.WARNING):
    for step in range(6):
      iteration({"step": step}, {"config": config})
  assert reads == []
  logged = [r.getMessage() for r in caplog.records if "nvfp4_bf16_from_step=3" in r.getMessage()]
  assert logged == ["NVFP4: from step 3 on (nvfp4_bf16_from_step=3), all NVFP4 GEMMs (forward and backward) run in "
                    "BF16"]
