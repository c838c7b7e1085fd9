# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What a config is checked for when it loads: NVFP4 settings that cannot take effect, refused in one line.

Why at load: maxtext builds and compiles the model long after the config loads, and a GEMM shape TE refuses, a key
that would quantize nothing or an expert path that would train unquantized otherwise surfaces as a traceback from
deep inside a traced step, or not at all. Each message names the key, its value and what works. The backend is
the one resolved for the config (MaxText.integration.settings.backend_of) against the environment of
`MaxText.backends.environment.current()` (this machine's, or the one a caller answers with, as the pre-flight does
for its target GPUs).
"""

from __future__ import annotations

import os
from typing import Any

from MaxText.backends import environment, table
from MaxText.backends.experts import TE_MISSING
from MaxText.integration.run_keys import EXPERT_LAYOUT_KEYS, maxtext_keys
from MaxText.integration.settings import backend_of
from MaxText.integration.shapes import gemm_dims
from MaxText.nvfp4.formats import BLOCK_SIZE
from MaxText.precision.gemm_shapes import block_errors
from MaxText.precision.modes import plain
from MaxText.precision.policy import Precision
from MaxText.precision.settings import Settings
from MaxText.precision.taps import TAPS, Tap
from MaxText.precision.te_rules import te_errors

__all__ = ["check", "checkpoint_error", "experts_error"]

#: What an orbax checkpoint directory holds at its root (v1: `_CHECKPOINT_METADATA`; a pytree item, v0 or v1:
#: `_METADATA`, or older orbax's `checkpoint` file), at the path itself or in its `items` item.
_CHECKPOINT_MARKERS = ("_CHECKPOINT_METADATA", "_METADATA", "checkpoint")


def check(config: Any, settings: Settings, env: environment.Environment | None = None) -> None:
  """Raises ValueError (one line) for the first thing in `config` the plugin's `settings` cannot honour.

  `env` is what the backend choice is made against (default: `environment.current()`, asked only for NVFP4 modes).
  """
  for tap in TAPS:
    _check_periodic(config, settings, tap)
  if not settings.nvfp4:
    return
  mode = settings.quantization
  if config.use_qwix_quantization:
    raise ValueError(f"quantization={mode} with use_qwix_quantization=true: maxtext would silently train "
                     "unquantized (its qwix path has no NVFP4 rule). Set use_qwix_quantization=false.")
  if plain(config.shard_mode) == "explicit":
    raise ValueError(f"quantization={mode} with shard_mode=explicit: the NVFP4 GEMMs take their tensor amax "
                     "under auto (GSPMD) sharding only. Set shard_mode=auto.")
  for key in ("load_parameters_path", "load_full_state_path"):
    if (error := checkpoint_error(key, getattr(maxtext_keys(config), key))) is not None:
      raise ValueError(error)
  env = env or environment.current()
  if (error := experts_error(config, settings, env)) is not None:  # routed experts: NVFP4 where they can run
    raise ValueError(error)
  _check_bf16_layers_and_steps(config, settings)
  # te: raises ValueError naming the reason and nvfp4_backend=emulated; auto: the choice, logged once.
  on_te = table.implementation(backend_of(config, env)).te_kernels
  dims = gemm_dims(config, settings)
  errors = block_errors(dims, BLOCK_SIZE, mode)
  if not errors and on_te:  # what TransformerEngine would refuse on Blackwell, per device (precision/te_rules.py)
    errors = te_errors(dims, settings, plain(maxtext_keys(config).te_comm_gemm_overlap))
  if errors:
    raise ValueError(errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))


def _check_periodic(config: Any, settings: Settings, tap: Tap) -> None:
  """A tap's interval (nvfp4_<tap>_interval): not negative; only where NVFP4 GEMMs run (or, for a tap that measures
  weight gradients, BF16 MLP GEMMs: Settings.bf16_mlp_taps) and maxtext hands the measurement back (the
  `_overwrite_with_gradient` route: no gradient accumulation loop, no pipeline)."""
  key, interval, what = tap.key, tap.interval(settings), tap.what
  if interval < 0:
    raise ValueError(f"{key}={interval} is negative; use 0 (off) or N >= 1 (every N steps).")
  if not interval:
    return
  if not settings.nvfp4:
    raise ValueError(f"{key}={interval} with quantization={settings.quantization!r}: it measures NVFP4 GEMMs ({what}); use "
                     f"quantization=te_nvfp4 or te_nvfp4_no_rht, or {key}=0.")
  if not settings.nvfp4_gemms and tap not in settings.bf16_mlp_taps:  # the BF16 MLP GEMMs' weight gradients
    raise ValueError(f"{key}={interval} with nvfp4_mlp_precision=bf16 and nvfp4_attention_precision="
                     f"{settings.attention.value}: no GEMM is NVFP4, so there is nothing to measure; set {key}=0 for "
                     "the baseline.")
  if maxtext_keys(config).gradient_accumulation_steps > 1:
    raise ValueError(f"{key}={interval} with gradient_accumulation_steps={config.gradient_accumulation_steps}: "
                     f"maxtext's accumulation loop does not hand the measurement back; set "
                     f"gradient_accumulation_steps=1, or {key}=0.")
  if maxtext_keys(config).using_pipeline_parallelism:
    raise ValueError(f"{key}={interval} is not supported with pipeline parallelism "
                     f"(ici/dcn_pipeline_parallelism > 1); set {key}=0 or drop the pipeline.")


def _check_bf16_layers_and_steps(config: Any, settings: Settings) -> None:
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
  if switches.per_layer and settings.nvfp4_gemms and switches.bf16_layer_count() == layers:
    raise ValueError(f"quantization={mode} with nvfp4_bf16_first_layers={first}, nvfp4_bf16_last_layers={last} "
                     f"and nvfp4_bf16_layers={named} = all {layers} decoder layers puts no GEMM in NVFP4; "
                     "steer fewer layers, or set nvfp4_mlp_precision=bf16 for an all-BF16 baseline.")
  if switches.from_step == 0:
    raise ValueError(f"quantization={mode} with nvfp4_bf16_from_step=0 runs every GEMM in BF16 from the first "
                     "step: no GEMM is NVFP4. Use a later step, or nvfp4_mlp_precision=bf16 for a BF16 baseline.")
  if switches.any and maxtext_keys(config).using_pipeline_parallelism:
    raise ValueError("nvfp4_bf16_first_layers/last_layers/layers/from_step/forward_from_step are not supported with "
                     "pipeline parallelism (ici/dcn_pipeline_parallelism > 1); unset them or the pipeline.")


def checkpoint_error(key: str, path: str) -> str | None:
  """Why `path` (load_parameters_path or load_full_state_path) is not a maxtext checkpoint, in one line, or None.

  Why here: orbax otherwise fails at the first load, after the model is built, with a traceback about layouts.
  Only local paths are looked at; a bucket (gs://...) is left to orbax.
  """
  if not path or "://" in path:
    return None
  usual = "<base_output_directory>/<run_name>/checkpoints/<step>/items, as maxtext saves it"
  if not os.path.exists(path):
    return f"{key}={path}: no such file or directory; point it at a maxtext checkpoint ({usual})."
  root = path.rstrip("/").removesuffix("/items") if path.rstrip("/").endswith("/items") else path
  places = (path, root, os.path.join(root, "items"))
  if not any(os.path.exists(os.path.join(p, m)) for p in places for m in _CHECKPOINT_MARKERS):
    return f"{key}={path}: not a maxtext checkpoint (no orbax checkpoint there); point it at one ({usual})."
  return None


def experts_error(config: Any, settings: Settings, env: environment.Environment) -> str | None:
  """Why this config cannot run NVFP4 routed experts (one line naming keys, values and what works), or None.

  Routed experts (num_experts > 1) whose MLP precision asks for NVFP4 need a backend with NVFP4 expert GEMMs (`env`
  resolves nvfp4_backend=te/auto) and none of maxtext's expert layouts the NVFP4 hooks do not cover.
  """
  found = maxtext_keys(config)
  num_experts = found.num_experts
  if num_experts <= 1 or settings.experts is Precision.BF16:
    return None
  where = f"quantization={settings.quantization} with num_experts={num_experts}"
  backend = settings.backend.value
  resolved = backend_of(config, env)  # "te" where TE cannot run raises its own one-line error
  if table.expert_gemms(resolved) is None:
    return (f"{where} and nvfp4_backend={backend} (-> {resolved.value}): no NVFP4 expert GEMMs on this backend "
            f"({TE_MISSING}). Set nvfp4_moe_experts=bf16 (experts BF16, dense GEMMs NVFP4) or "
            "nvfp4_backend=emulated.")
  why = dict(zip(EXPERT_LAYOUT_KEYS, ("expert parallelism", "expert parallelism", "chunked expert GEMMs",
                                      "ring of experts", "TE's MoE block")))
  unsupported = [(key, value, why[key]) for key, value in found.expert_layout if (value or 0) not in (0, 1, False)]
  if unsupported:
    key, value, why = unsupported[0]
    return (f"{where}: {key}={value} ({why}) is not supported with NVFP4 experts. Unset it, or set "
            "nvfp4_moe_experts=bf16.")
  for key in ("emb_dim", "moe_mlp_dim"):
    size = getattr(found, key)
    if size % BLOCK_SIZE:
      return (f"{where}: {key}={size} is not a multiple of {BLOCK_SIZE} (NVFP4 blocks every expert GEMM dim by "
              f"{BLOCK_SIZE}). Use a multiple of {BLOCK_SIZE}, or nvfp4_moe_experts=bf16.")
  return None
