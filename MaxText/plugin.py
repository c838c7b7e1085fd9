# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""Installs the NVFP4 plugin into maxtext: our config class and our hook on maxtext's quantization factory.

Two module attributes of maxtext are wrapped, never its code edited or copied; both are looked up by attribute
at call time, which is why wrapping them works:
- `maxtext.configs.pyconfig.initialize` (and `initialize_pydantic`): the pre-training `main` calls
  `pyconfig.initialize(argv)`; the wrapper supplies `config_class=NVFP4Config` (a caller's own class keeps
  working, with our keys added to it). Errors are left to maxtext's own handling.
- `maxtext.layers.quantizations.maybe_quantize_model`: after each model build, writes the NVFP4 GEMMs' layer
  indices and (in training runs only) the precision plan.
- maxtext's pre-training trainer (`maxtext.trainers.pre_train.train`), once imported: `train_loop` runs as a
  training run (resume record, plan) and `train_step`/`eval_step` expose the state's step to the GEMMs.
- `maxtext.layers.quantizations.configure_quantization(config, quant_mode_str)`: model creation
  (`maxtext.utils.model_creation_utils.create_model`) calls it for every model it builds, including the
  abstract one traced under `nnx.eval_shape`. For `quantization` in `NVFP4_MODES` the wrapper returns
  `nvfp4_quantization(...)` and never reaches upstream's TransformerEngine class (which imports
  transformer_engine and fails with ModuleNotFoundError where TE is absent); all other modes go to upstream.

This module imports only the standard library at import time, so `import MaxText` stays cheap; maxtext (and
with it jax) is imported by `register()`.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["is_registered", "nvfp4_quantization", "register"]

# Marks our wrappers so a second `register()` (or a second copy of this module, e.g. after importlib.reload)
# never wraps a wrapper.
_MARK = "_nvfp4_plugin_wrapper"
_LOCK = threading.Lock()
_registered = False


def nvfp4_quantization(config: Any, quant_mode_str: str = "train") -> Any:
  """Returns maxtext's quant object (`dot_general_cls`/`einsum`) for an NVFP4 mode: the precision policy.

  Called by the `configure_quantization` wrapper when `config.quantization` is in `NVFP4_MODES`.

  Args:
    config: maxtext's `HyperParameters` (attribute access to every key, ours included).
    quant_mode_str: maxtext's quantization mode; only "train" is supported.

  Raises:
    ValueError: nvfp4_backend=te where TransformerEngine or a Blackwell GPU is missing.
    NotImplementedError: serve/convert modes.
  """
  from MaxText.adapter import quantization_from_config  # pylint: disable=import-outside-toplevel

  return quantization_from_config(config, quant_mode_str)


def _wrap_maybe_quantize_model(original: Callable[..., Any]) -> Callable[..., Any]:
  """After maxtext builds a model: writes each NVFP4 GEMM's decoder layer index (for BF16 first/last layers) and,
  in a training run, writes and prints the NVFP4 precision plan read off that model."""

  @functools.wraps(original)
  def maybe_quantize_model(model: Any, config: Any) -> Any:
    # pylint: disable=import-outside-toplevel
    from MaxText import plan, run_record, switches
    from MaxText.config import NVFP4_MODES

    model = original(model, config)
    if _quantization_name(config) in NVFP4_MODES:
      recipe_switches = switches.switches_from_config(config)
      if recipe_switches.per_layer:
        switches.assign_layer_indices(model, recipe_switches, int(getattr(config, "first_num_dense_layers", 0) or 0))
      directory = run_record.current_training_run()
      if directory is not None:  # the plan file and table come from training runs only
        plan.report(model, directory)
    return model

  setattr(maybe_quantize_model, _MARK, True)
  return maybe_quantize_model


def _quantization_name(config: Any) -> str:
  """`config.quantization` as a plain string: maxtext stores a `QuantizationType` (a str Enum) or None."""
  value = getattr(config, "quantization", None)
  if value is None:
    return ""
  return str(getattr(value, "value", value))


def _wrap_configure_quantization(original: Callable[..., Any]) -> Callable[..., Any]:
  """Routes the NVFP4 modes to `nvfp4_quantization` and everything else to maxtext's factory."""

  @functools.wraps(original)
  def configure_quantization(config: Any, quant_mode_str: str = "train") -> Any:
    from MaxText.config import NVFP4_MODES  # pylint: disable=import-outside-toplevel

    if _quantization_name(config) in NVFP4_MODES:
      return nvfp4_quantization(config, quant_mode_str)
    return original(config, quant_mode_str=quant_mode_str)

  setattr(configure_quantization, _MARK, True)
  return configure_quantization


def _with_plugin_keys(config_class: type[Any], plugin_class: type[Any]) -> type[Any]:
  """`config_class` with the plugin's keys added: the class itself when it already has them.

  Why: callers that pass their own subclass of maxtext's config (maxtext's RL trainers pass `RLConfig`) must keep
  their class and still accept the nvfp4_* keys our base.yml sets. maxtext's own `MaxTextConfig` maps to our
  subclass; any other subclass of it gets a class deriving from both (cached, so each caller class maps to one).
  A class that is not a maxtext config at all is left alone.
  """
  from maxtext.configs import types  # pylint: disable=import-outside-toplevel

  if issubclass(config_class, plugin_class) or not issubclass(config_class, types.MaxTextConfig):
    return config_class
  if config_class is types.MaxTextConfig:
    return plugin_class
  return _merged_class(config_class, plugin_class)


@functools.cache
def _merged_class(config_class: type[Any], plugin_class: type[Any]) -> type[Any]:
  return type(config_class.__name__, (config_class, plugin_class),
              {"__module__": config_class.__module__, "__doc__": config_class.__doc__})


def _wrap_initialize(original: Callable[..., Any], default_class: type[Any]) -> Callable[..., Any]:
  """Makes `pyconfig.initialize`-style functions load the plugin's keys; errors stay maxtext's.

  Nothing else changes: a bad config raises what maxtext raises (a pydantic ValidationError stays one) and goes
  through maxtext's own `_handle_config_exception` (its "MAXTEXT CONFIG ERROR" line, /dev/termination-log, exit 2
  outside tests). Only our command line (`MaxText.train`) shortens the message.
  """

  @functools.wraps(original)
  def initialize(argv: list[str] | None = None, config_class: type[Any] = default_class, **kwargs: Any) -> Any:
    return original(argv, config_class=_with_plugin_keys(config_class, default_class), **kwargs)

  setattr(initialize, _MARK, True)
  return initialize


def _install(module: Any, name: str, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
  """Replaces `module.name` with `make_wrapper(original)`, unless it is already one of our wrappers."""
  original = getattr(module, name)
  if not getattr(original, _MARK, False):
    setattr(module, name, make_wrapper(original))


#: maxtext's pre-training trainer: its train_loop/train_step/eval_step are wrapped once it is imported.
_TRAINER_MODULE = "maxtext.trainers.pre_train.train"


def _wrap_train_loop(original: Callable[..., Any]) -> Callable[..., Any]:
  """Runs maxtext's train_loop as a training run: resume record checked, precision plan written."""

  @functools.wraps(original)
  def train_loop(config: Any, *args: Any, **kwargs: Any) -> Any:
    from MaxText.run_record import training_run  # pylint: disable=import-outside-toplevel

    with training_run(config):
      return original(config, *args, **kwargs)

  setattr(train_loop, _MARK, True)
  return train_loop


def _hook_trainer(module: Any) -> None:
  """Wraps the trainer module's train_loop (run record, plan) and train_step/eval_step (the step for switches)."""
  from MaxText.switches import install_step_hooks  # pylint: disable=import-outside-toplevel

  _install(module, "train_loop", _wrap_train_loop)
  install_step_hooks(module)


class _AfterImport(importlib.abc.MetaPathFinder):
  """Calls `callback(module)` right after the module named `name` is first imported, then removes itself.

  Why: importing maxtext's trainer takes seconds (it imports the whole training stack), too much for
  `register()` to do eagerly; the hooks must still be in place before its train loop runs.
  """

  def __init__(self, name: str, callback: Callable[[Any], None]):
    self.name, self.callback = name, callback

  def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
    del path, target
    if fullname != self.name:
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(fullname)
    if spec is None or spec.loader is None:
      return spec
    exec_module, callback = spec.loader.exec_module, self.callback

    def exec_then_hook(module: Any) -> None:
      exec_module(module)
      callback(module)

    spec.loader.exec_module = exec_then_hook
    return spec


def register() -> None:
  """Installs the plugin into maxtext; safe to call any number of times, from any thread.

  Must run before maxtext loads a config or builds a model (the `MaxText.train` entry point does it first).
  """
  global _registered  # pylint: disable=global-statement
  with _LOCK:
    if _registered:
      return
    # pylint: disable=import-outside-toplevel
    from maxtext.configs import pyconfig
    from maxtext.layers import quantizations
    from MaxText.config import NVFP4Config

    for name in ("initialize", "initialize_pydantic"):
      _install(pyconfig, name, lambda orig: _wrap_initialize(orig, NVFP4Config))
    _install(quantizations, "configure_quantization", _wrap_configure_quantization)
    _install(quantizations, "maybe_quantize_model", _wrap_maybe_quantize_model)
    if _TRAINER_MODULE in sys.modules:
      _hook_trainer(sys.modules[_TRAINER_MODULE])
    else:
      sys.meta_path.insert(0, _AfterImport(_TRAINER_MODULE, _hook_trainer))
    _registered = True


def is_registered() -> bool:
  """True once `register()` has installed the plugin in this process."""
  return _registered
