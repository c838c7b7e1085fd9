# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The bodies of the config, quantization and trainer hooks the seam (MaxText.integration.seam) installs.

Each `wrap_*` takes maxtext's original function and returns its replacement; arguments the plugin reads are
bound by name. Nothing here installs anything: the seam's table says what is wrapped with what, and checks it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from maxtext.configs import types

from MaxText.integration import flops, layers, plan, run_record
from MaxText.integration.config import NVFP4Config
from MaxText.integration.quant import quantization_from_config
from MaxText.integration.run_keys import maxtext_keys
from MaxText.integration.settings import settings_of
from MaxText.precision.modes import is_nvfp4

__all__ = ["maxtext_quantization", "wrap_configure_quantization", "wrap_initialize", "wrap_maybe_quantize_model",
           "wrap_train_loop"]

#: True inside `maxtext_quantization()`: every quantization mode goes to maxtext's own factory.
_MAXTEXT_QUANTIZATION: contextvars.ContextVar[bool] = contextvars.ContextVar("maxtext_quantization", default=False)


@contextlib.contextmanager
def maxtext_quantization() -> Iterator[None]:
  """Within the block, `configure_quantization` hands every mode to maxtext's original factory, te_nvfp4 included.

  Why: the pre-flight's step-time prediction (MaxText.preflight.programs) compares the plugin's te_nvfp4 (MLP GEMMs
  only) with upstream maxtext's te_nvfp4 (every GEMM through TransformerEngine's NVFP4 recipe, attention
  projections included), compiled in the same process. The switch is a context variable: it holds for this block
  in this thread (or task) only, and is off again after it, so a training run never sees it. Nothing but the
  pre-flight uses it.
  """
  token = _MAXTEXT_QUANTIZATION.set(True)
  try:
    yield
  finally:
    _MAXTEXT_QUANTIZATION.reset(token)


def _with_plugin_keys(config_class: type[Any]) -> type[Any]:
  """`config_class` with the plugin's keys added: the class itself when it already has them.

  Why: callers that pass their own subclass of maxtext's config (maxtext's RL trainers pass `RLConfig`) must keep
  their class and still accept the nvfp4_* keys our base.yml sets. maxtext's own `MaxTextConfig` maps to our
  subclass; any other subclass of it gets a class deriving from both (cached, so each caller class maps to one).
  A class that is not a maxtext config at all is left alone.
  """
  if issubclass(config_class, NVFP4Config) or not issubclass(config_class, types.MaxTextConfig):
    return config_class
  if config_class is types.MaxTextConfig:
    return NVFP4Config
  return _merged_class(config_class)


@functools.cache
def _merged_class(config_class: type[Any]) -> type[Any]:
  return type(config_class.__name__, (config_class, NVFP4Config),
              {"__module__": config_class.__module__, "__doc__": config_class.__doc__})


def wrap_initialize(original: Callable[..., Any]) -> Callable[..., Any]:
  """Makes `pyconfig.initialize`-style functions load the plugin's keys; errors stay maxtext's.

  Nothing else changes: a bad config raises what maxtext raises (a pydantic ValidationError stays one) and goes
  through maxtext's own `_handle_config_exception` (its "MAXTEXT CONFIG ERROR" line, /dev/termination-log, exit 2
  outside tests). Only our command line (`MaxText.train`) shortens the message.
  """
  signature = inspect.signature(original)

  @functools.wraps(original)
  def initialize(*args: Any, **kwargs: Any) -> Any:
    bound = signature.bind(*args, **kwargs)
    config_class = bound.arguments.get("config_class", signature.parameters["config_class"].default)
    bound.arguments["config_class"] = _with_plugin_keys(config_class)
    return original(*bound.args, **bound.kwargs)

  return initialize


def wrap_configure_quantization(original: Callable[..., Any]) -> Callable[..., Any]:
  """Routes the NVFP4 modes to the plugin's quant object and everything else to maxtext's factory.

  For te_nvfp4/te_nvfp4_no_rht it never reaches upstream's TransformerEngine class (which imports
  transformer_engine and fails where TE is absent), except inside `maxtext_quantization()`.
  """
  signature = inspect.signature(original)

  @functools.wraps(original)
  def configure_quantization(*args: Any, **kwargs: Any) -> Any:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    config = bound.arguments["config"]
    if is_nvfp4(maxtext_keys(config).quantization) and not _MAXTEXT_QUANTIZATION.get():
      return quantization_from_config(config, bound.arguments["quant_mode_str"])
    return original(*args, **kwargs)

  return configure_quantization


def wrap_maybe_quantize_model(original: Callable[..., Any]) -> Callable[..., Any]:
  """After maxtext builds a model: writes each NVFP4 GEMM's decoder layer index (for BF16 first/last layers) and,
  in a training run, writes and prints the NVFP4 precision plan read off that model."""
  signature = inspect.signature(original)

  @functools.wraps(original)
  def maybe_quantize_model(*args: Any, **kwargs: Any) -> Any:
    config = signature.bind(*args, **kwargs).arguments["config"]
    model = original(*args, **kwargs)
    if is_nvfp4(maxtext_keys(config).quantization):  # other modes: nothing of ours read
      if settings_of(config).switches.per_layer:
        layers.assign_layer_indices(model, maxtext_keys(config).first_num_dense_layers)
      directory = run_record.current_training_run()
      if directory is not None:  # the plan file and table come from training runs only
        plan.report(model, directory, flops.training_flops(config))
    return model

  return maybe_quantize_model


def wrap_train_loop(original: Callable[..., Any]) -> Callable[..., Any]:
  """Runs maxtext's train_loop as a training run: resume record checked, precision plan written."""
  signature = inspect.signature(original)

  @functools.wraps(original)
  def train_loop(*args: Any, **kwargs: Any) -> Any:
    with run_record.training_run(signature.bind(*args, **kwargs).arguments["config"]):
      return original(*args, **kwargs)

  return train_loop
