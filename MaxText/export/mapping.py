# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Every checkpoint tensor's Hugging Face name, shape and layout from maxtext's own conversion
(`maxtext.checkpoint_conversion`: its parameter mappings, hooks, shapes and HF model configs, with the MaxText
config's shapes where they differ from the catalogue), and which of them ran in NVFP4 in the training forward.

Nothing here maps a parameter by hand: a model maxtext cannot convert cannot be exported.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from MaxText.integration.run_keys import run_keys
from MaxText.integration.settings import settings_of
from MaxText.precision.policy import Precision

__all__ = ["ROUTED", "ExportError", "FusedPair", "Model", "Piece", "exact", "split_fused", "forward_precision", "gemm_class",
           "hf_tensors", "layer_of", "model_of", "params_only", "converted", "pieces", "precision_of",
           "supported_models"]


class ExportError(ValueError):
  """Bad input to the export: the entry point prints it in one line and exits 2."""


def _conversion() -> Any:
  # pylint: disable-next=import-outside-toplevel  # maxtext's conversion imports transformers: only when exporting
  from maxtext.checkpoint_conversion import to_huggingface
  return to_huggingface


def supported_models() -> list[str]:
  """The model names maxtext's conversion maps to Hugging Face (mapping, hooks, shapes and HF config)."""
  # pylint: disable-next=import-outside-toplevel  # import cost: maxtext, transformers and tqdm load when exporting
  from maxtext.checkpoint_conversion.utils import hf_model_configs, hf_shape, param_mapping
  return sorted(set(param_mapping.PARAM_MAPPING) & set(param_mapping.HOOK_FNS) & set(hf_shape.HF_SHAPE)
                & set(hf_model_configs.HF_MODEL_CONFIGS))


@dataclasses.dataclass(frozen=True)
class Model:
  """What maxtext's conversion knows of one model, its HF config sized from the MaxText config."""

  name: str
  hf_config: Any  # a transformers PretrainedConfig (a copy: maxtext's catalogue entry is left as it is)
  param_map: dict
  hook_fns: dict
  shapes: dict


def model_of(config: Any) -> Model:
  """maxtext's mappings for `config.model_name`; the HF config takes the MaxText config's shapes (maxtext's own
  `--override_model_architecture` rule), so a model sized down from a catalogue entry converts too."""
  keys = run_keys(config)
  name = keys.model_name
  if name not in supported_models():
    raise ExportError(f"model_name={name}: maxtext's checkpoint conversion does not map this model; it maps: "
                      f"{', '.join(supported_models())}")
  conv = _conversion()
  hf_config = copy.deepcopy(conv.HF_MODEL_CONFIGS[name])
  conv._validate_or_update_architecture(hf_config, config, override=True)  # pylint: disable=protected-access
  maps = conv._get_model_mappings(name, keys.scan_layers, hf_config.to_dict(), config)  # pylint: disable=protected-access
  return Model(name, hf_config, maps["param_mapping"], maps["hook_fn_mapping"], maps["shape_mapping"])


def hf_tensors(model: Model, key: str | tuple[str, ...], weight: Any, config: Any) -> list[tuple[str, np.ndarray]]:
  """maxtext's conversion of one checkpoint parameter: (HF name, array) for each tensor it becomes."""
  # pylint: disable-next=import-outside-toplevel  # import cost: maxtext, transformers and tqdm load when exporting
  from maxtext.checkpoint_conversion.utils.utils import process_maxtext_param
  return process_maxtext_param(key, weight, model.param_map, model.hook_fns, model.shapes, config)


class _Unsaved:
  """A config whose weight_dtype is None, which maxtext's conversion reads as "keep the hooks' dtype": a probe in
  float32 comes back unrounded by a bf16 weight_dtype (MaxText.export.moves reads the query's scale off it)."""

  def __init__(self, config: Any):
    self._config = config

  def __getattr__(self, name: str) -> Any:
    return None if name == "weight_dtype" else getattr(self._config, name)


def _single_stack(model: Model, key: Any) -> list[str] | None:
  """The HF names of a parameter stacked on one axis (scanned layers, or one unscanned layer's experts), else None."""
  targets = model.param_map[key]
  if isinstance(key, str) and isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets):
    return targets
  return None


def pieces(model: Model, key: Any) -> int:
  """How many pieces `converted` yields for parameter `key` (the export writes one shard per piece)."""
  return len(_single_stack(model, key) or [None])


@dataclasses.dataclass(frozen=True)
class Piece:
  """One layer's (or expert's) slice of a checkpoint parameter and its Hugging Face tensors; `probe` is maxtext's
  conversion of any float32 array shaped like `weight` into the same tensors, kept in float32 (what
  MaxText.export.moves converts)."""

  weight: Any
  tensors: list[tuple[str, np.ndarray]]
  probe: Callable[[Any], list[tuple[str, np.ndarray]]]


def converted(model: Model, key: Any, weight: Any, config: Any) -> Iterator[Piece]:
  """`hf_tensors` of one checkpoint parameter, one layer (or expert) at a time where it is stacked on one axis.

  Why: maxtext's `process_maxtext_param` slices such a parameter along its stacking axis and converts every slice, then
  returns them all; handing it one slice at a time, with that slice's HF name, keeps one layer's tensors in memory
  instead of every layer's. The axis is maxtext's rule (param_scan_axis for a scanned weight, else the leading expert
  axis). A parameter stacked on two axes (scanned experts) is converted whole."""
  names = _single_stack(model, key)
  if names is None:
    yield Piece(weight, hf_tensors(model, key, weight, config), lambda w: hf_tensors(model, key, w, _Unsaved(config)))
    return
  keys = run_keys(config)
  axis = keys.param_scan_axis if keys.scan_layers and np.ndim(weight) > keys.param_scan_axis else 0
  for i, name in enumerate(names):
    piece = jax.lax.index_in_dim(weight, i, axis=axis, keepdims=False)
    one = dataclasses.replace(model, param_map={key: name})
    yield Piece(piece, hf_tensors(one, key, piece, config),
                lambda w, one=one: hf_tensors(one, key, w, _Unsaved(config)))


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
#: maxtext's parameter names of the MLP GEMM weights: routed experts are stacked kernels named by the MoE block
#: (`...-MoeBlock_0-wi_0`, no `-kernel`); dense and shared-expert MLPs are DenseGeneral kernels.
ROUTED = re.compile(r"(MoeBlock_\d+|moe_block)-(wi_0|wi_1|wo)$")
_MLP = re.compile(r"-(mlp|shared_experts)-(wi_0|wi_1|wo)-kernel$")
#: The attention projections: every DenseGeneral kernel of maxtext's attention block (query, key, value, out; MLA's
#: wq_a, wkv_b, ...), the GEMMs nvfp4_attention_precision decides.
_ATTENTION = re.compile(r"-self_attention-[^-]+-kernel$")


def layer_of(hf_name: str) -> int | None:
  """The decoder layer of a Hugging Face tensor name (`model.layers.3.mlp...` -> 3), None outside the layers."""
  found = _LAYER.search(hf_name)
  return int(found.group(1)) if found else None


def gemm_class(key: str) -> str | None:
  """'experts' (routed), 'mlp' (dense or shared MLP), 'attention' (its projections) or None (router, embeddings,
  norms, head)."""
  if ROUTED.search(key):
    return "experts"
  if _MLP.search(key):
    return "mlp"
  if _ATTENTION.search(key):
    return "attention"
  return None


def forward_precision(config: Any, step: int) -> Precision:
  """The NVFP4 GEMMs' forward precision for the weights of checkpoint `step` (the state after that step), i.e. in
  the forward of step + 1 that continues from it: BF16 once a late switch (nvfp4_bf16_from_step or
  nvfp4_bf16_forward_from_step) has passed, else NVFP4; BF16 for a run without an NVFP4 mode or NVFP4 GEMM."""
  settings = settings_of(config)
  if not settings.nvfp4 or not settings.nvfp4_gemms:
    return Precision.BF16
  sw = settings.switches
  for switch in (sw.from_step, sw.forward_from_step):
    if switch is not None and step + 1 >= switch:
      return Precision.BF16
  return Precision.NVFP4


def _gemms(config: Any) -> str:
  """The GEMMs the export writes in NVFP4, in words: 'MLP', 'MLP and attention' or 'attention'."""
  settings = settings_of(config)
  return " and ".join(what for what, p in (("MLP", settings.mlp), ("attention", settings.attention))
                      if p is Precision.NVFP4) or "no"


def exact(config: Any, step: int | None) -> tuple[bool, str]:
  """Whether the export is the training forward's own quantization (an NVFP4 run whose NVFP4 GEMMs' forward at this
  step was NVFP4), and a line saying which it is; otherwise it is post-training quantization with the same recipe."""
  settings = settings_of(config)
  gemms = _gemms(config)
  if not settings.nvfp4:
    return False, (f"quantization={settings.quantization or 'none'}: the run trained without NVFP4; the NVFP4 "
                   "weights are post-training quantization with the recipe's rules")
  if step is None:
    return True, ("the checkpoint's step is not known: the forward precision is taken as the recipe's, before any "
                  "late switch")
  if forward_precision(config, step) is Precision.BF16:
    return False, (f"step {step}: the run's {gemms} forward had switched to BF16 (nvfp4_bf16_from_step / "
                   "nvfp4_bf16_forward_from_step); the NVFP4 weights are post-training quantization with the recipe")
  return True, f"step {step}: the {gemms} forward ran in NVFP4; the NVFP4 weights are the operands it multiplied"


def precision_of(config: Any, key: str, hf_name: str) -> Precision:
  """The recipe's precision for the HF tensor `hf_name` of checkpoint parameter `key`: NVFP4 for the MLP weights
  (dense, shared and routed experts) and, under nvfp4_attention_precision=nvfp4, the attention projections, of the
  layers the recipe quantizes; BF16 for the rest, for the BF16 first/last/listed layers, and for experts under
  nvfp4_moe_experts=bf16. A run trained without NVFP4 gets the recipe of its nvfp4_* keys (post-training
  quantization with the same rules)."""
  settings = settings_of(config)
  precision = {"mlp": settings.mlp, "experts": settings.experts, "attention": settings.attention}.get(
      gemm_class(key) or "", Precision.BF16)
  layer = layer_of(hf_name)
  if precision is not Precision.NVFP4 or (layer is not None and settings.switches.bf16_layer(layer)):
    return Precision.BF16
  return Precision.NVFP4


#: maxtext's fused gate/up kernel (`fused_mlp=true`): one DenseGeneral `wi` with kernel [embed, (layers,) 2, mlp], its
#: second-to-last axis the activation (0: gate, wi_0's; 1: up, wi_1's).
_FUSED = re.compile(r"-mlp-wi-kernel$")


@dataclasses.dataclass(frozen=True)
class FusedPair:
  """A fused gate/up kernel split into maxtext's separate `wi_0` and `wi_1` parameters (what its conversion maps):
  `fused` is the checkpoint's key, the GEMM that trained (its calibration metrics name it); `gate` and `up` the
  split keys, quantized together as the one operand the training forward multiplied."""

  fused: str
  gate: str
  up: str


def split_fused(state: dict[str, Any]) -> tuple[FusedPair, ...]:
  """Splits each fused gate/up kernel of `state` (in place) into `wi_0` and `wi_1`; returns the pairs.

  Why split: maxtext's conversion maps gate_proj and up_proj from `wi_0` and `wi_1` only. The pair is kept, so the
  export quantizes gate and up as one weight with one tensor scale, as the fused GEMM did (run.py)."""
  pairs = []
  for key in [k for k in state if _FUSED.search(k)]:
    fused = state.pop(key)
    gate, up = _FUSED.sub("-mlp-wi_0-kernel", key), _FUSED.sub("-mlp-wi_1-kernel", key)
    state[gate], state[up] = (jax.lax.index_in_dim(fused, i, axis=np.ndim(fused) - 2, keepdims=False) for i in (0, 1))
    pairs.append(FusedPair(key, gate, up))
  return tuple(pairs)


def params_only(state: dict[str, Any]) -> Iterator[str]:
  """The checkpoint's model parameters (maxtext's `params-...` keys), without the plugin's own collections."""
  return (k for k in state if k.startswith("params-"))
