# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The plugin's settings of a maxtext config, read once per config object and handed down whole, and the backend
they run on, resolved once per config object and environment.

Why here: this is the one reader of the plugin's keys on a maxtext config (HyperParameters or the pydantic model).
Everything below the integration layer takes the `Settings` it returns, never the config. maxtext hands its hooks the
same config object on every step (the trainer's HyperParameters), so the per-step hooks find it in the cache.

Why the backend here too: nvfp4_backend names a wish (auto, te, emulated, fused); which backend runs depends on the
machine, or on the target GPUs a caller answers for (MaxText.backends.environment.answering). `backend_of` resolves it
once per config and environment and keeps it beside the settings; the config checks, the quant object, the
pre-flight and the self-check read it there.
"""

from __future__ import annotations

import weakref
from typing import Any

from MaxText.backends import environment, table
from MaxText.precision.keys import PluginKeys
from MaxText.precision.modes import Backend
from MaxText.precision.settings import Settings

__all__ = ["backend_of", "settings_of"]

_CACHE: weakref.WeakKeyDictionary[Any, Settings] = weakref.WeakKeyDictionary()
_BACKENDS: weakref.WeakKeyDictionary[Any, dict[environment.Environment, Backend]] = weakref.WeakKeyDictionary()


def _keys(config: Any) -> dict[str, Any]:
  """The config's keys as a dict: maxtext's HyperParameters has get_keys(), its pydantic config model_fields (and a
  plain object, such as a test's namespace, its attributes)."""
  if hasattr(config, "get_keys"):
    return config.get_keys()
  if hasattr(type(config), "model_fields"):
    return {name: getattr(config, name) for name in type(config).model_fields}
  return dict(vars(config))


def from_config(config: Any) -> Settings:
  """The settings of `config`, built from its keys. A config loaded without the plugin's class (maxtext's own, in a
  process that never registered the plugin) has none of the nvfp4_* keys: it gets the schema's defaults."""
  keys = _keys(config)
  plugin = PluginKeys.model_validate({name: keys[name] for name in PluginKeys.model_fields if name in keys})
  return Settings.of(plugin, quantization=keys.get("quantization"), num_layers=int(keys.get("num_decoder_layers") or 0))


def settings_of(config: Any) -> Settings:
  """`from_config(config)`, built once per config object (a config that cannot be cached is read each time)."""
  try:
    return _CACHE[config]
  except (KeyError, TypeError):  # not seen yet; or unhashable (pydantic models): not cached
    pass
  settings = from_config(config)
  try:
    _CACHE[config] = settings
  except TypeError:
    pass
  return settings


def backend_of(config: Any, env: environment.Environment | None = None) -> Backend:
  """The backend `config`'s NVFP4 GEMMs run on: its settings' nvfp4_backend resolved (MaxText.backends.table.
  resolve_backend: auto's choice logged once) against `env`, by default `environment.current()` (this machine, or the
  one a caller answers for), once per config object and environment (a config that cannot be cached is resolved at
  each read).

  Raises:
    ValueError: nvfp4_backend=te where TransformerEngine cannot run NVFP4 (at every read: nothing is cached).
  """
  env = env or environment.current()
  try:
    known = _BACKENDS.setdefault(config, {})
  except TypeError:  # unhashable (pydantic models, as they validate): resolved each time
    known = {}
  if env not in known:
    known[env] = table.resolve_backend(settings_of(config).backend, env)
  return known[env]
