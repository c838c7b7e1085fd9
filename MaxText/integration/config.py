# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""maxtext's config class with the plugin's keys, and the one-line form of a config error.

The keys are declared once, in `MaxText.precision.keys.PluginKeys`; `NVFP4Config` adds them to maxtext's pydantic
config by inheritance and checks them against the rest of the config when it loads (MaxText.integration.checks).
"""

from __future__ import annotations

import difflib
import enum
import os
import re

import omegaconf
import pydantic
import yaml
from maxtext.configs import types

from MaxText.integration import checks
from MaxText.precision.keys import PluginKeys
from MaxText.precision.settings import Settings

__all__ = ["NVFP4Config", "format_config_error", "is_config_error", "missing_config_file"]


class NVFP4Config(types.MaxTextConfig, PluginKeys):
  """maxtext's config plus the NVFP4 plugin keys.

  Why a subclass: maxtext's config forbids unknown keys (`extra="forbid"`), and `pyconfig.initialize` takes a
  `config_class`, so a subclass adds keys without editing maxtext. The keys only take effect when
  `quantization` is one of `NVFP4_MODES`; with any other quantization they are validated and ignored.
  """

  @pydantic.model_validator(mode="after")
  def _nvfp4_mode_can_run(self) -> "NVFP4Config":
    """Refuses, at config load (before any model is built or compiled), NVFP4 settings that cannot take effect
    (MaxText.integration.checks)."""
    checks.check(self, Settings.of(self, quantization=self.quantization, num_layers=self.num_decoder_layers))
    return self


# pyconfig's message for an unknown key: "'key' not in 'a', 'b', ... ." (every field name, ~30k characters).
_UNKNOWN_KEY_RE = re.compile(r"^'(?P<key>[^']+)' not in ")
# Longest message the fallback keeps: one readable line, not a dump.
_MAX_FALLBACK_CHARS = 400


def _enum_choices(config_class: type[pydantic.BaseModel], key: str) -> list[str] | None:
  """Returns the valid values of an enum-typed field, or None when the field is not an enum."""
  field = config_class.model_fields.get(key)
  if field is None:
    return None
  annotation = field.annotation
  for candidate in getattr(annotation, "__args__", None) or (annotation,):
    if isinstance(candidate, type) and issubclass(candidate, enum.Enum):
      return [str(member.value) for member in candidate]
  return None


def _format_validation_error(err: pydantic.ValidationError, config_class: type[pydantic.BaseModel]) -> str:
  """One clause per pydantic error, joined on one line."""
  parts = []
  for item in err.errors(include_url=False):
    key = ".".join(str(p) for p in item["loc"])
    msg = item["msg"].removeprefix("Value error, ")
    if not key:  # A cross-field (model_validator) error: the message already names the fields.
      parts.append(msg)
      continue
    choices = _enum_choices(config_class, key)
    if choices is not None and item["type"] == "enum":
      shown = ", ".join(repr(c) for c in choices)
      parts.append(f"{key}={item['input']!r} is not a valid choice; valid choices: {shown}")
    else:
      parts.append(f"{key}={item['input']!r} is invalid: {msg}")
  return "; ".join(parts)


def format_config_error(exc: BaseException, config_class: type[pydantic.BaseModel] = NVFP4Config) -> str:
  """Formats an exception raised while loading a config as one line.

  Handles pydantic's ValidationError (wrong type, bad enum value, cross-field check), pyconfig's unknown-key
  ValueError (whose own message lists all ~1500 field names) and YAML syntax errors; anything else becomes its
  type and message flattened onto one line.

  Args:
    exc: the exception raised by `pyconfig.initialize` or the config class.
    config_class: the config class that was validated, used to look up enum choices and key names.

  Returns:
    One line, without a trailing newline.
  """
  if isinstance(exc, pydantic.ValidationError):
    return _format_validation_error(exc, config_class)
  text = str(exc)
  match = _UNKNOWN_KEY_RE.match(text)
  if match:
    key = match.group("key")
    close = difflib.get_close_matches(key, list(config_class.model_fields), n=3)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    return f"unknown config key {key!r}{hint}"
  mark = getattr(exc, "problem_mark", None)  # PyYAML syntax errors: name the file, line and column.
  if mark is not None:
    return f"YAML syntax error in {mark.name}, line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
  flat = " ".join(line.strip() for line in text.splitlines() if line.strip())
  if len(flat) > _MAX_FALLBACK_CHARS:
    flat = flat[: _MAX_FALLBACK_CHARS - 3] + "..."
  return f"{type(exc).__name__}: {flat}" if flat else type(exc).__name__


def is_config_error(exc: BaseException) -> bool:
  """True for what a bad config raises: pydantic's ValidationError and maxtext's checks (ValueError), a missing
  file, YAML syntax and OmegaConf errors. Anything else (TypeError, KeyError, other OSErrors) is a bug or an
  environment problem and keeps its traceback."""
  return isinstance(exc, (ValueError, FileNotFoundError, yaml.YAMLError, omegaconf.errors.OmegaConfBaseException))


def missing_config_file(config_path: str) -> str:
  """Names the file of a `base_config:` chain that does not exist, and which file asked for it.

  Why: pyconfig reports a missing file under the last place it looked (maxtext's configs folder, or "src/..."),
  not the name the user wrote. Resolution follows pyconfig: next to the including file, then maxtext's configs.
  """
  if not os.path.isfile(config_path):
    return f"config file not found: {config_path}"
  maxtext_configs = os.path.dirname(types.__file__)
  path = config_path
  for _ in range(32):  # a longer chain is a loop
    with open(path, encoding="utf-8") as f:
      base = (yaml.safe_load(f) or {}).get("base_config")
    if not base:
      break
    candidates = [base] if os.path.isabs(base) else [os.path.join(os.path.dirname(path), base),
                                                      os.path.join(maxtext_configs, base)]
    found = next((c for c in candidates if os.path.isfile(c)), None)
    if found is None:
      return (f"config file not found: base_config {base!r} of {path} (looked in "
              f"{' and '.join(os.path.dirname(c) for c in candidates)})")
    path = found
  return f"config file not found (in the base_config chain of {config_path})"
