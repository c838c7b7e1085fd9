# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The formats' own code reading an export: run with .venv-export's Python (torch, compressed-tensors, transformers,
ModelOpt), never imported by the suite. The tests (tests/export/*_test.py, in .venv) compare what it writes with the
emulator's quantization of the same checkpoint.

  python hf_side.py weights DIR OUT.npz       every NVFP4 weight, unpacked and dequantized by the format's library
  python hf_side.py logits DIR TOKENS.npy OUT.npy [--dequantize] [--dtype float32|bfloat16]
  python hf_side.py load DIR OUT.json          transformers' default load: keys missing or unused, finite logits
  python hf_side.py inputs DIR OUT.json        each Linear's input quantization as the loaded model holds it (W4A4)
  python hf_side.py build DIR CONFIG.json      a tiny LlamaForCausalLM that transformers builds (seed 0), saved
                                               in float32 safetensors: a Hugging Face model to convert into maxtext
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
import torch
from safetensors import safe_open


def _tensors(d: pathlib.Path) -> dict[str, torch.Tensor]:
  out = {}
  for f in sorted(d.glob("*.safetensors")):
    with safe_open(str(f), "pt") as st:
      out.update({k: st.get_tensor(k) for k in st.keys()})
  return out


def _f32(t: torch.Tensor) -> np.ndarray:
  return t.to(torch.float32).numpy()


def _compressed_tensors(config: dict, tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
  # pylint: disable=import-outside-toplevel
  from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
  from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
  from compressed_tensors.quantization import QuantizationConfig
  from compressed_tensors.quantization.lifecycle.forward import dequantize

  qconfig = QuantizationConfig.model_validate(config["quantization_config"])  # the format's own schema
  (scheme,) = qconfig.config_groups.values()
  out = {}
  for name in sorted(k for k in tensors if k.endswith(".weight_packed")):
    prefix = name.removesuffix(".weight_packed")
    packed, scale, gscale = (tensors[f"{prefix}.{s}"] for s in ("weight_packed", "weight_scale", "weight_global_scale"))
    m, n = packed.shape
    values = unpack_fp4_from_uint8(packed, m, 2 * n, dtype=torch.float32)
    deq32 = dequantize(values, scale.to(torch.float32), args=scheme.weights, global_scale=gscale, dtype=torch.float32)
    library = NVFP4PackedCompressor.decompress({"weight_packed": packed, "weight_scale": scale,
                                                "weight_global_scale": gscale}, scheme)["weight"]
    out.update({f"{prefix}|packed": packed.numpy(), f"{prefix}|values": _f32(values), f"{prefix}|scale": _f32(scale),
                f"{prefix}|global": _f32(gscale), f"{prefix}|dequantized": _f32(deq32),
                f"{prefix}|decompressed": _f32(library)})
  return out


def _modelopt(tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
  # pylint: disable=import-outside-toplevel
  from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

  out = {}
  for name in sorted(k for k in tensors if k.endswith(".weight_scale_2")):
    prefix = name.removesuffix(".weight_scale_2")
    packed, scale, scale2 = (tensors[f"{prefix}.{s}"] for s in ("weight", "weight_scale", "weight_scale_2"))
    m, n = packed.shape
    qt = NVFP4QTensor(torch.Size((m, 2 * n)), torch.float32, packed)
    deq = qt.dequantize(dtype=torch.float32, scale=scale, double_scale=scale2, block_sizes={-1: 16})
    out.update({f"{prefix}|packed": packed.numpy(), f"{prefix}|scale": _f32(scale), f"{prefix}|global": _f32(scale2),
                f"{prefix}|dequantized": _f32(deq)})
  return out


def weights(d: pathlib.Path, out: pathlib.Path) -> None:
  config = json.loads((d / "config.json").read_text(encoding="utf-8"))
  tensors = _tensors(d)
  method = config["quantization_config"]["quant_method"]
  arrays = _compressed_tensors(config, tensors) if method == "compressed-tensors" else _modelopt(tensors)
  np.savez(out, **arrays)


def logits(d: pathlib.Path, tokens: pathlib.Path, out: pathlib.Path, dequantize: bool, dtype: str) -> None:
  # pylint: disable=import-outside-toplevel
  from transformers import AutoModelForCausalLM, CompressedTensorsConfig

  kwargs = {"dtype": getattr(torch, dtype)}
  if dequantize:
    kwargs["quantization_config"] = CompressedTensorsConfig(dequantize=True)
  model = AutoModelForCausalLM.from_pretrained(str(d), **kwargs).eval()
  with torch.no_grad():
    result = model(torch.from_numpy(np.load(tokens)).long()).logits
  np.save(out, _f32(result))


def load(d: pathlib.Path, out: pathlib.Path) -> None:
  """transformers' default load of the export (`from_pretrained(DIR)`, no options: the dtype is config.json's): what
  it did not find or did not use, and whether a forward pass gives finite logits."""
  # pylint: disable=import-outside-toplevel
  from transformers import AutoModelForCausalLM

  model, info = AutoModelForCausalLM.from_pretrained(str(d), output_loading_info=True)
  with torch.no_grad():
    finite = bool(torch.isfinite(model.eval()(torch.arange(16)[None]).logits).all())
  out.write_text(json.dumps({**{k: sorted(map(str, v)) for k, v in info.items()}, "finite": finite}), encoding="utf-8")


def inputs(d: pathlib.Path, out: pathlib.Path) -> None:
  """transformers' default load of a W4A4 export: for every Linear whose scheme quantizes its input, the scheme's
  input arguments and the `input_global_scale` compressed-tensors attached to it (what its forward divides by)."""
  # pylint: disable=import-outside-toplevel
  from transformers import AutoModelForCausalLM

  model = AutoModelForCausalLM.from_pretrained(str(d))
  found = {}
  for name, module in model.named_modules():
    scheme = getattr(module, "quantization_scheme", None)
    if scheme is not None and scheme.input_activations is not None:
      args = scheme.input_activations
      found[name] = {"num_bits": args.num_bits, "type": str(getattr(args.type, "value", args.type)),
                     "strategy": str(getattr(args.strategy, "value", args.strategy)),
                     "group_size": args.group_size, "dynamic": str(getattr(args.dynamic, "value", args.dynamic)),
                     "input_global_scale": _f32(module.input_global_scale.detach()).tolist()}
  out.write_text(json.dumps(found), encoding="utf-8")


def build(d: pathlib.Path, config: pathlib.Path) -> None:
  """A Llama built by transformers from `config` (LlamaConfig keys), random init under seed 0, saved offline."""
  from transformers import LlamaConfig, LlamaForCausalLM  # pylint: disable=import-outside-toplevel

  torch.manual_seed(0)
  model = LlamaForCausalLM(LlamaConfig(**json.loads(config.read_text(encoding="utf-8"))))
  model.to(torch.float32).save_pretrained(str(d), safe_serialization=True)


def main() -> None:
  p = argparse.ArgumentParser()
  sub = p.add_subparsers(dest="cmd", required=True)
  w = sub.add_parser("weights")
  w.add_argument("dir", type=pathlib.Path)
  w.add_argument("out", type=pathlib.Path)
  lg = sub.add_parser("logits")
  lg.add_argument("dir", type=pathlib.Path)
  lg.add_argument("tokens", type=pathlib.Path)
  lg.add_argument("out", type=pathlib.Path)
  lg.add_argument("--dequantize", action="store_true")
  lg.add_argument("--dtype", default="float32")
  for cmd in ("load", "inputs", "build"):
    ld = sub.add_parser(cmd)
    ld.add_argument("dir", type=pathlib.Path)
    ld.add_argument("out", type=pathlib.Path)
  a = p.parse_args()
  if a.cmd == "build":
    build(a.dir, a.out)
  elif a.cmd == "weights":
    weights(a.dir, a.out)
  elif a.cmd == "load":
    load(a.dir, a.out)
  elif a.cmd == "inputs":
    inputs(a.dir, a.out)
  else:
    logits(a.dir, a.tokens, a.out, a.dequantize, a.dtype)


if __name__ == "__main__":
  main()
