# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The hooks' bodies (MaxText.integration.hooks): configs load with the plugin's keys whatever class the caller names,
NVFP4 modes get the plugin's quant object and every other mode maxtext's, and a model that is not NVFP4 is left as
maxtext built it."""

from __future__ import annotations

import pytest

import MaxText
from MaxText.integration import hooks
from MaxText.integration.config import NVFP4Config
from MaxText.integration.quant import Nvfp4Quantization
from MaxText.precision.modes import NVFP4_MODES
from tests.helpers import TINY_YML, load_config, run_cache

MaxText.register()

# pylint: disable=wrong-import-position,wrong-import-order
from maxtext.configs import pyconfig, types  # noqa: E402  after MaxText.register(), which patches maxtext
from maxtext.layers import quantizations  # noqa: E402  after MaxText.register(), which patches maxtext


def test_callers_config_class_keeps_working() -> None:
  """A caller that names its own config class (maxtext's RL trainers pass RLConfig) keeps it, with our keys added."""

  class CallerConfig(types.MaxTextConfig):
    caller_key: int = 7

  yml = [str(TINY_YML), *run_cache()]
  config = pyconfig.initialize(["train", *yml, "quantization=te_nvfp4", "caller_key=3"], config_class=CallerConfig)
  assert config.caller_key == 3 and config.nvfp4_backend == "auto"
  assert pyconfig.initialize(["train", *yml], config_class=types.MaxTextConfig).nvfp4_mlp_precision == "nvfp4"
  with pytest.raises(ValueError, match="caller_key"):  # the caller's own validation still applies
    pyconfig.initialize(["train", *yml, "caller_key=x"], config_class=CallerConfig)


def test_config_classes_gain_the_plugin_keys_once():
  """maxtext's class maps to ours, a caller's subclass to one merged class (the same each time), ours stays ours,
  and a class that is not a maxtext config is left alone."""
  wrap = hooks._with_plugin_keys  # pylint: disable=protected-access

  class Caller(types.MaxTextConfig):
    pass

  assert wrap(types.MaxTextConfig) is NVFP4Config and wrap(NVFP4Config) is NVFP4Config
  merged = wrap(Caller)
  assert issubclass(merged, Caller) and issubclass(merged, NVFP4Config) and wrap(Caller) is merged
  assert wrap(dict) is dict


def test_other_modes_reach_maxtexts_factory() -> None:
  assert quantizations.configure_quantization(load_config(TINY_YML, "quantization=")) is None
  fp8 = quantizations.configure_quantization(load_config(TINY_YML, "quantization=fp8"))
  assert isinstance(fp8, quantizations.Fp8Quantization)


@pytest.mark.parametrize("mode", NVFP4_MODES)
def test_nvfp4_modes_reach_our_function(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
  """The NVFP4 modes never reach upstream's TransformerEngine class; our factory is looked up per call."""
  config = load_config(TINY_YML, f"quantization={mode}", "nvfp4_backend=emulated")
  quant = quantizations.configure_quantization(config, quant_mode_str="train")
  assert isinstance(quant, Nvfp4Quantization) and quant.policy.recipe.rht == (mode == "te_nvfp4")
  sentinel = object()
  monkeypatch.setattr(hooks, "quantization_from_config", lambda cfg, quant_mode_str="train": (sentinel, quant_mode_str))
  assert quantizations.configure_quantization(config, "serve") == (sentinel, "serve")


def test_a_model_that_is_not_nvfp4_is_returned_as_built(monkeypatch: pytest.MonkeyPatch) -> None:
  """maybe_quantize_model after maxtext: for another mode nothing of ours runs (no layer indices, no plan)."""
  touched = []
  monkeypatch.setattr(hooks.layers, "assign_layer_indices", lambda *a, **k: touched.append("layers"))
  monkeypatch.setattr(hooks.plan, "report", lambda *a, **k: touched.append("plan"))
  model = object()
  wrapped = hooks.wrap_maybe_quantize_model(lambda model, config: model)
  assert wrapped(model, load_config(TINY_YML, "quantization=fp8")) is model and touched == []
  nvfp4 = load_config(TINY_YML, "quantization=te_nvfp4", "nvfp4_backend=emulated", "nvfp4_bf16_last_layers=1")
  assert wrapped(model, nvfp4) is model and touched == ["layers"]  # no training run under way: no plan
