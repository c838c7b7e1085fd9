# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""The plugin's config keys (all `nvfp4_*`), declared once on a subclass of maxtext's pydantic config."""

from __future__ import annotations

import difflib
import enum
import os
import re

import omegaconf
import pydantic
import yaml
from pydantic import Field

from maxtext.configs import types

from MaxText.backends.environment import resolve_backend
from MaxText.backends.experts import config_error as experts_error
from MaxText.nvfp4.formats import BLOCK_SIZE
from MaxText.precision.gemm_shapes import block_errors, nvfp4_gemm_dims
from MaxText.precision.modes import AttentionPrecision, Backend, MlpPrecision, MoeExperts, plain
from MaxText.precision.settings import Settings
from MaxText.precision.te_rules import te_errors

__all__ = ["NVFP4Config", "format_config_error", "is_config_error", "missing_config_file"]


class NVFP4Config(types.MaxTextConfig):
  """maxtext's config plus the NVFP4 plugin keys.

  Why a subclass: maxtext's config forbids unknown keys (`extra="forbid"`), and `pyconfig.initialize` takes a
  `config_class`, so a subclass adds keys without editing maxtext. The keys only take effect when
  `quantization` is one of `NVFP4_MODES`; with any other quantization they are validated and ignored.
  """

  nvfp4_backend: Backend = Field(
      Backend.AUTO,
      description="Implementation of the NVFP4 GEMMs: 'auto' (TE on Blackwell, else emulated), 'te', 'emulated'.",
  )
  nvfp4_attention_precision: AttentionPrecision = Field(
      AttentionPrecision.BF16,
      description="Precision of the attention projections under an NVFP4 mode: 'bf16' or 'fp8' (never FP4).",
  )
  nvfp4_mlp_precision: MlpPrecision = Field(
      MlpPrecision.NVFP4,
      description="Precision of the MLP GEMMs under an NVFP4 mode: 'nvfp4' (the recipe) or 'bf16' (a baseline that"
      " keeps the same quant object and so the same initial weights).",
  )
  nvfp4_moe_experts: MoeExperts = Field(
      MoeExperts.NVFP4,
      description="Routed-expert GEMMs under an NVFP4 mode: 'nvfp4' (the MLP recipe per expert; the emulated backend"
      " only) or 'bf16' (experts unquantized; required with nvfp4_backend=te). Follows nvfp4_mlp_precision=bf16.",
  )
  nvfp4_stochastic_rounding: bool = Field(
      True,
      description=(
          "Stochastic rounding of the output gradient dY when it is quantized to FP4 (NVIDIA's recipe; weights"
          " and activations always round to nearest-even). False: nearest-even everywhere (an ablation)."
      ),
  )
  nvfp4_2d_weight_scaling: bool = Field(
      True,
      description=(
          "16x16 block scales for weights, shared by W and W^T so forward and backward see the same quantized"
          " weight (NVIDIA's recipe). False: 1x16 blocks like the other operands (an ablation)."
      ),
  )
  nvfp4_nonfinite_check: bool = Field(
      True,
      description=(
          "TE backend: make an NVFP4 GEMM's output (y, dx or dW) NaN when one of its operands holds a NaN/inf (TE's"
          " FP4 quantizer can turn a NaN into a finite value). Costs a max|.| per operand; false turns it off."
      ),
  )

  nvfp4_stats_interval: int = Field(
      0,
      description="Every N training steps (step 0 included), each NVFP4 GEMM reports amax, underflow, relative error"
      " and subnormal block scales of every operand it quantizes as maxtext metrics named nvfp4/layer_XX/...;"
      " 0: off (the program is the one without statistics). Losses are the same either way.",
  )

  nvfp4_bf16_first_layers: int = Field(
      0,
      description="The first N decoder layers run their MLP GEMMs in BF16 (NVIDIA's recipe keeps ~15% of the"
      " blocks, mostly at the end, in BF16). Works with scan_layers true and false.",
  )
  nvfp4_bf16_last_layers: int = Field(
      0,
      description="The last N decoder layers run their MLP GEMMs in BF16 (the paper: the last 8 of 62 blocks).",
  )
  nvfp4_bf16_layers: list[int] = Field(
      [],
      description="Decoder layers (0-based indices) whose MLP GEMMs (dense and experts) run in BF16, on top of the"
      " first/last layers: steer single layers that the nvfp4/ statistics show losing most. [] : none.",
  )
  nvfp4_bf16_from_step: int | None = Field(
      None,
      description="From this training step on (maxtext's step: the step number in the metrics; 0 is the first"
      " update) every NVFP4 GEMM runs in BF16, forward and backward. None: never. Same compiled program; exact"
      " across a checkpoint resume.",
  )
  nvfp4_bf16_forward_from_step: int | None = Field(
      None,
      description="From this training step on only the forward NVFP4 GEMMs run in BF16; dgrad and wgrad stay NVFP4"
      " (the paper: switching the forward pass recovers most of the gap); both backends. None: never.",
  )

  @pydantic.model_validator(mode="after")
  def _nvfp4_mode_can_run(self) -> "NVFP4Config":
    """Refuses, at config load (before any model is built or compiled), NVFP4 settings that cannot take effect."""
    settings = Settings.from_config(self)
    self._check_stats(settings)
    if not settings.nvfp4:
      return self
    mode = settings.quantization
    if self.use_qwix_quantization:
      raise ValueError(f"quantization={mode} with use_qwix_quantization=true: maxtext would silently train "
                       "unquantized (its qwix path has no NVFP4 rule). Set use_qwix_quantization=false.")
    if plain(self.shard_mode) == "explicit":
      raise ValueError(f"quantization={mode} with shard_mode=explicit: the NVFP4 GEMMs take their tensor amax "
                       "under auto (GSPMD) sharding only. Set shard_mode=auto.")
    if (error := experts_error(self, settings)) is not None:  # routed experts: NVFP4 where they can run
      raise ValueError(error)
    self._check_bf16_layers_and_steps(settings)
    # te: raises ValueError naming the reason and nvfp4_backend=emulated; auto: the choice, logged once.
    on_te = resolve_backend(settings.backend) is Backend.TE
    errors = block_errors(nvfp4_gemm_dims(self, settings), BLOCK_SIZE, mode)
    if not errors and on_te:  # what TransformerEngine would refuse on Blackwell, per device (precision/te_rules.py)
      errors = te_errors(self, settings)
    if errors:
      raise ValueError(errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
    return self

  def _check_stats(self, settings: Settings) -> None:
    """nvfp4_stats_interval: not negative; only where NVFP4 GEMMs run and maxtext hands the statistics back."""
    interval = settings.stats_interval
    if interval < 0:
      raise ValueError(f"nvfp4_stats_interval={interval} is negative; use 0 (off) or N >= 1 (every N steps).")
    if not interval:
      return
    if not settings.nvfp4:
      raise ValueError(f"nvfp4_stats_interval={interval} with quantization={settings.quantization!r}: the "
                       "statistics describe NVFP4 GEMMs; use quantization=te_nvfp4 or te_nvfp4_no_rht, or "
                       "nvfp4_stats_interval=0.")
    if settings.mlp.value != "nvfp4":
      raise ValueError(f"nvfp4_stats_interval={interval} with nvfp4_mlp_precision=bf16: no GEMM is NVFP4, so "
                       "there is nothing to measure; set nvfp4_stats_interval=0 for the BF16 baseline.")
    if int(getattr(self, "gradient_accumulation_steps", 1) or 1) > 1:
      raise ValueError(f"nvfp4_stats_interval={interval} with gradient_accumulation_steps="
                       f"{self.gradient_accumulation_steps}: maxtext's accumulation loop does not hand the "
                       "statistics back; set gradient_accumulation_steps=1 for the statistics run.")
    if getattr(self, "using_pipeline_parallelism", False):
      raise ValueError(f"nvfp4_stats_interval={interval} is not supported with pipeline parallelism "
                       "(ici/dcn_pipeline_parallelism > 1); set nvfp4_stats_interval=0 or drop the pipeline.")

  def _check_bf16_layers_and_steps(self, settings: Settings) -> None:
    """nvfp4_bf16_* keys: in range, and leaving at least one NVFP4 GEMM (else the mode would quantize nothing)."""
    mode, switches = settings.quantization, settings.switches
    first, last, layers = switches.first_layers, switches.last_layers, switches.num_layers
    for key, value in (("nvfp4_bf16_first_layers", first), ("nvfp4_bf16_last_layers", last),
                       ("nvfp4_bf16_from_step", switches.from_step),
                       ("nvfp4_bf16_forward_from_step", switches.forward_from_step)):
      if value is not None and value < 0:
        raise ValueError(f"{key}={value} is negative; use 0 or more (None for the step keys: never switch).")
    if first + last > layers:
      raise ValueError(f"nvfp4_bf16_first_layers={first} + nvfp4_bf16_last_layers={last} exceeds the "
                       f"{layers} decoder layers (num_decoder_layers={layers}); keep their sum at most {layers}.")
    named = list(switches.layers)
    if (outside := [i for i in named if not 0 <= i < layers]):
      raise ValueError(f"nvfp4_bf16_layers={named}: layer {outside[0]} is outside [0, {layers}) (num_decoder_layers="
                       f"{layers}); name decoder layers 0 to {layers - 1}.")
    if len(set(named)) != len(named):
      repeated = sorted({i for i in named if named.count(i) > 1})
      raise ValueError(f"nvfp4_bf16_layers={named} names layer {repeated[0]} more than once; name each layer once.")
    if switches.per_layer and settings.mlp.value == "nvfp4" and switches.bf16_layer_count() == layers:
      raise ValueError(f"quantization={mode} with nvfp4_bf16_first_layers={first}, nvfp4_bf16_last_layers={last} "
                       f"and nvfp4_bf16_layers={named} = all {layers} decoder layers puts no GEMM in NVFP4; "
                       "steer fewer layers, or set nvfp4_mlp_precision=bf16 for an all-BF16 baseline.")
    if switches.from_step == 0:
      raise ValueError(f"quantization={mode} with nvfp4_bf16_from_step=0 runs every GEMM in BF16 from the first "
                       "step: no GEMM is NVFP4. Use a later step, or nvfp4_mlp_precision=bf16 for a BF16 baseline.")
    if switches.any and getattr(self, "using_pipeline_parallelism", False):
      raise ValueError("nvfp4_bf16_first_layers/last_layers/layers/from_step/forward_from_step are not supported with "
                       "pipeline parallelism (ici/dcn_pipeline_parallelism > 1); unset them or the pipeline.")


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
