# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""One NVFP4 weight in each serving format's tensors, and each format's config: field names, dtypes, packing and
scale semantics as the formats' own code defines them (docs/export.md#the-formats cites the lines).

Why exact: the recipe's 2D weight scaling gives every 16x16 tile one E4M3 scale under one FP32 tensor scale, so each
1x16 block along the input features (the serving formats' block) carries its tile's scale unchanged; the codes are
the emulator's, which equal TE's bit for bit (docs/numerics.md).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.nvfp4.formats import BLOCK_SIZE
from MaxText.nvfp4.quantize import Scaling, quantize, tensor_scales

__all__ = ["FORMAT_NAMES", "LAYOUTS", "Format", "QuantizedWeight", "ServingLayout", "input_scales",
           "modelopt_config_json", "quantization_config", "quantize_weight", "tensors_of"]


class Format(str, enum.Enum):
  COMPRESSED_TENSORS = "compressed-tensors"
  MODELOPT = "modelopt"
  BF16 = "bf16"


FORMAT_NAMES = tuple(f.value for f in Format)


@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
  """A Linear weight [out, in] as the training forward quantized it.

  packed: uint8 [out, in/2], two E2M1 codes per byte, the even input feature in the low nibble.
  scale: float8_e4m3fn [out, in/16], one per 16 input features (with 2D scaling each row repeats its tile's scale).
  s_enc, s_dec: the FP32 tensor scales as TE computes them from the weight's amax (2688/amax, and 1/that).
  """

  packed: np.ndarray
  scale: np.ndarray
  s_enc: np.float32
  s_dec: np.float32


@jax.jit(static_argnames="scaling")
def _quantized(w: jax.Array, scaling: Scaling) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  t = quantize(w, scaling)
  # float4 pairs -> one byte: XLA's bitcast puts the first of each pair in the low nibble (MaxText.nvfp4.formats).
  pairs = t.data.reshape(*t.shape[:-1], t.shape[-1] // 2, 2)
  s_enc, s_dec = tensor_scales(t.amax)
  return jax.lax.bitcast_convert_type(pairs, jnp.uint8), t.scale, s_enc, s_dec


def quantize_weight(w: np.ndarray | jax.Array, dtype: jnp.dtype, two_d: bool) -> QuantizedWeight:
  """The forward's NVFP4 operand of a Linear weight, given as the transpose [out, in] of the GEMM's [in, out]
  operand (blocks along `in`; MaxText.export.moves takes it from maxtext's layout and moves its rows where the
  conversion moves them).

  `w` is cast to the run's compute `dtype` first, as maxtext's layers cast the kernel before the GEMM. A tile or
  block is the same set of elements in either layout, so this is the training forward's quantization, code for code
  (tests/export/ checks it against the maxtext layout)."""
  w = jnp.asarray(w).astype(dtype)
  packed, scale, s_enc, s_dec = _quantized(w, Scaling.TWO_D if two_d else Scaling.ONE_D)
  return QuantizedWeight(np.asarray(packed), np.asarray(scale), np.float32(s_enc), np.float32(s_dec))


def _compressed_tensors(prefix: str, q: QuantizedWeight, input_amax: float | None) -> dict[str, np.ndarray]:
  """compressed-tensors: dequantized = fp4 * (weight_scale / weight_global_scale); global scale = 2688 / amax."""
  out = {f"{prefix}.weight_packed": q.packed, f"{prefix}.weight_scale": q.scale,
         f"{prefix}.weight_global_scale": np.array([q.s_enc], np.float32)}
  if input_amax is not None:
    out[f"{prefix}.input_global_scale"] = np.array([input_scales(input_amax)[0]], np.float32)
  return out


def _modelopt(prefix: str, q: QuantizedWeight, input_amax: float | None) -> dict[str, np.ndarray]:
  """ModelOpt: dequantized = fp4 * weight_scale * weight_scale_2; weight_scale_2 = amax / 2688 (a scalar)."""
  out = {f"{prefix}.weight": q.packed, f"{prefix}.weight_scale": q.scale,
         f"{prefix}.weight_scale_2": np.array(q.s_dec, np.float32)}
  if input_amax is not None:
    out[f"{prefix}.input_scale"] = np.array(input_scales(input_amax)[1], np.float32)
  return out


def tensors_of(name: str, q: QuantizedWeight, fmt: Format, input_amax: float | None = None) -> dict[str, np.ndarray]:
  """The tensors a format stores for the Linear whose weight is `name` (ends in `.weight`); with `input_amax` (the
  calibrated amax of its input, W4A4) also its input's global scale, by the same rule as the weight's."""
  layout = LAYOUTS[fmt]
  if layout.tensors is None:
    raise ValueError(f"format {fmt.value} stores no NVFP4 tensors")
  return layout.tensors(name.removesuffix(".weight"), q, input_amax)


def input_scales(amax: float) -> tuple[np.float32, np.float32]:
  """(global scale, its inverse) of an input whose calibrated amax is `amax`: TE's S_enc = 2688 / amax and S_dec
  (MaxText.nvfp4.quantize.tensor_scales), as for the weights: compressed-tensors stores the first as
  `input_global_scale`, ModelOpt the second as `input_scale` (compressed-tensors' own ModelOpt converter maps one to
  1/the other)."""
  s_enc, s_dec = tensor_scales(jnp.float32(amax))
  return np.float32(s_enc), np.float32(s_dec)


def _ignored_linears(ignore: list[str]) -> list[str]:
  return sorted(n.removesuffix(".weight") for n in ignore)


def _compressed_tensors_config(modules: list[str], activations: bool) -> dict:
  """config.json's `quantization_config` as compressed-tensors' `ModelCompressor.update_config` writes the NVFP4A16
  or NVFP4 preset (compressed_tensors/quantization/quant_scheme.py; NVFP4's inputs: dynamic "local", i.e. block
  scales at run time under the stored global scale)."""
  weights = {"dynamic": False, "group_size": BLOCK_SIZE, "num_bits": 4, "scale_dtype": "torch.float8_e4m3fn",
             "strategy": "tensor_group", "symmetric": True, "type": "float"}
  inputs = ({**weights, "dynamic": "local", "observer": "static_minmax"} if activations else None)
  return {
      "config_groups": {"group_0": {"format": "nvfp4-pack-quantized", "input_activations": inputs,
                                    "output_activations": None, "targets": ["Linear"], "weights": weights}},
      "format": "nvfp4-pack-quantized",
      "global_compression_ratio": None,
      "ignore": modules,
      "kv_cache_scheme": None,
      "moe_sparsity_config": None,
      "quant_method": "compressed-tensors",
      "quantization_status": "compressed",
      "sparsity_config": {},
      "transform_config": {},
      "version": COMPRESSED_TENSORS_VERSION,
  }


def _modelopt_config(modules: list[str], activations: bool) -> dict:
  """hf_quant_config.json's `quantization` (modelopt/torch/export/unified_export_hf.py, get_quant_config):
  W4A16_NVFP4, or NVFP4 with inputs."""
  return {"quant_algo": "NVFP4" if activations else "W4A16_NVFP4", "kv_cache_quant_algo": None,
          "group_size": BLOCK_SIZE, "exclude_modules": modules}


def quantization_config(fmt: Format, ignore: list[str], activations: bool = False) -> dict:
  """The config that marks the checkpoint quantized: weight-only (W4A16: no input activation scheme), or with
  `activations` W4A4 (NVFP4 inputs with calibrated global scales); `ignore` lists the Linear weights kept
  unquantized (exact module names). Each format's own (its `ServingLayout.quantization`)."""
  layout = LAYOUTS[fmt]
  if layout.quantization is None:
    raise ValueError(f"format {fmt.value} has no quantization config")
  return layout.quantization(_ignored_linears(ignore), activations)


def modelopt_config_json(quant: dict) -> dict:
  """ModelOpt's `quantization_config` for config.json (modelopt/torch/export/convert_hf_config.py,
  convert_hf_quant_config_format), beside hf_quant_config.json; vLLM reads either."""
  group = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": quant["group_size"]}
  inputs = dict(group) if quant["quant_algo"] == "NVFP4" else None
  return {"config_groups": {"group_0": {"input_activations": inputs, "weights": group, "targets": ["Linear"]}},
          "ignore": quant["exclude_modules"], "quant_algo": quant["quant_algo"],
          "producer": {"name": "modelopt", "version": MODELOPT_VERSION}, "quant_method": "modelopt"}


def _modelopt_files(quant: dict) -> dict[str, dict]:
  return {"hf_quant_config.json": {"producer": {"name": "modelopt", "version": MODELOPT_VERSION},
                                   "quantization": quant}}


@dataclasses.dataclass(frozen=True)
class ServingLayout:
  """One serving format, all that the export does differently for it (the export itself names no format).

  quantized: whether its MLP weights are NVFP4 (bf16: every tensor as the checkpoint holds it, no input scales).
  tensors: (module prefix, the quantized weight, its input's calibrated amax or None) -> the tensors it stores: their
    names, and the tensor scale's orientation (2688/amax or amax/2688).
  quantization: (the unquantized Linear modules, W4A4?) -> the format's quantization config.
  config_json: that config -> config.json's `quantization_config`.
  files: that config -> other JSON files written beside config.json, by name.
  """

  quantized: bool
  tensors: Callable[[str, QuantizedWeight, float | None], dict[str, np.ndarray]] | None = None
  quantization: Callable[[list[str], bool], dict] | None = None
  config_json: Callable[[dict], dict] = lambda quant: quant
  files: Callable[[dict], dict[str, dict]] = lambda quant: {}


#: Every format of the export, one entry each.
LAYOUTS: dict[Format, ServingLayout] = {
    Format.COMPRESSED_TENSORS: ServingLayout(quantized=True, tensors=_compressed_tensors,
                                             quantization=_compressed_tensors_config),
    Format.MODELOPT: ServingLayout(quantized=True, tensors=_modelopt, quantization=_modelopt_config,
                                   config_json=modelopt_config_json, files=_modelopt_files),
    Format.BF16: ServingLayout(quantized=False),
}


#: The format versions whose definitions this module follows (docs/export.md cites their source).
COMPRESSED_TENSORS_VERSION = "0.20.0"
MODELOPT_VERSION = "0.47.0"
