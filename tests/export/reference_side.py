# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""NVIDIA's own NVFP4 reference quantizer, run on test tensors: run with .venv-export's Python (torch), never imported
by the suite. tests/export/reference_test.py (in .venv) compares what it writes with the emulator's `quantize`.

  python reference_side.py REFERENCE_NVFP4_PY IN.npz OUT.npz

REFERENCE_NVFP4_PY is TransformerEngine's transformer_engine/pytorch/custom_recipes/reference_nvfp4.py
(NVFP4QuantizerRef, the definition TE's tests hold its CUDA kernels to with zero tolerance), from an installed TE
(.venv-gpu). It is executed as it is, from its own path; nothing of it is copied. TE's package cannot be imported
here (its __init__ loads the CUDA extension built for .venv-gpu's Python), so this process provides, in sys.modules:
  * the two base classes the file imports from transformer_engine.pytorch.quantized_tensor (Quantizer,
    QuantizedTensorStorage) as minimal stubs: the reference's quantizer calls only Quantizer.__init__(rowwise=,
    columnwise=), which here sets rowwise_usage and columnwise_usage as TE's does;
  * empty package modules transformer_engine, transformer_engine.pytorch (with their real directories as __path__,
    so that custom_recipes/__init__.py, gemm.py and reference_utils.py, which the reference imports, load unmodified
    from the same installation, without running TE's package __init__);
  * transformer_engine.pytorch.tensor.utils.is_custom, which gemm.py imports for its custom_gemm dispatch (never
    called when quantizing): a stub that raises if called. That is the one name besides the two base classes.

IN.npz holds, per tensor NAME, `NAME|x` (float32 values) and `NAME|dtype` ("bfloat16" or "float32": the dtype the
reference quantizes; bfloat16 values must be exact in float32, which they are). OUT.npz holds, per NAME and MODE:
  NAME|MODE|codes  uint8 [rows, cols]: one E2M1 code (low nibble) per element, unpacked from the reference's bytes
                   (two codes a byte, the even element in the low nibble), in the layout of the quantized operand:
                   x's for rowwise modes, x.T's for the columnwise ones;
  NAME|MODE|scale  uint8 [rows, cols / 16]: the E4M3 block scales' bit patterns (for 16x16 tiles every row of a
                   tile repeats its scale, the reference's own layout);
  NAME|MODE|amax   float32 [1]: the global amax the tensor scale came from.
MODEs: 1d (1x16 blocks, rowwise), 1d_t (1x16 blocks of x.T: TE's columnwise data), 2d and 2d_t (16x16 tiles, rowwise
and columnwise), and, for bfloat16 tensors only, 1d_rht_t (the columnwise 1x16 blocks after the random Hadamard
transform with TE's sign vector, as TE's wgrad operands; TE applies its RHT to bf16 input only).
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import types

import numpy as np
import torch

_PKG = "transformer_engine.pytorch.custom_recipes"


def _stub_module(name: str, path: pathlib.Path | None = None, **attrs: object) -> types.ModuleType:
  module = types.ModuleType(name)
  if path is not None:
    module.__path__ = [str(path)]
  module.__dict__.update(attrs)
  sys.modules[name] = module
  return module


class Quantizer:
  """Stub of TE's Quantizer base: only what NVFP4QuantizerRef's constructor calls."""

  def __init__(self, *, rowwise: bool, columnwise: bool) -> None:
    self.rowwise_usage = rowwise
    self.columnwise_usage = columnwise
    self.internal = False


class QuantizedTensorStorage:
  """Stub of TE's QuantizedTensorStorage base (NVFP4TensorRef, a dataclass, subclasses it)."""


def _is_custom(x: object = None) -> bool:
  raise NotImplementedError(f"stub: transformer_engine.pytorch.tensor.utils.is_custom({type(x).__name__})")


def load_reference(path: pathlib.Path) -> types.ModuleType:
  """reference_nvfp4.py executed from `path`, with the stubs above and its sibling modules from its own directory."""
  sys.dont_write_bytecode = True  # nothing is written into the TE installation
  recipes = path.parent
  pytorch_dir = recipes.parent
  _stub_module("transformer_engine", pytorch_dir.parent)
  _stub_module("transformer_engine.pytorch", pytorch_dir)
  _stub_module("transformer_engine.pytorch.quantized_tensor", Quantizer=Quantizer,
               QuantizedTensorStorage=QuantizedTensorStorage)
  _stub_module("transformer_engine.pytorch.tensor", pytorch_dir / "tensor")
  _stub_module("transformer_engine.pytorch.tensor.utils", is_custom=_is_custom)
  spec = importlib.util.spec_from_file_location(f"{_PKG}.reference_nvfp4", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  loaded = pathlib.Path(sys.modules[f"{_PKG}.reference_utils"].__file__).resolve()
  assert loaded.parent == recipes.resolve(), f"reference_utils came from {loaded}, not beside {path}"
  return module


def _codes(packed: torch.Tensor, rows: int, cols: int) -> np.ndarray:
  p = packed.numpy()
  assert p.dtype == np.uint8 and p.shape == (rows, cols // 2), (p.dtype, p.shape)
  codes = np.empty((rows, cols), np.uint8)
  codes[:, 0::2] = p & 0xF
  codes[:, 1::2] = p >> 4
  return codes


def _scale(s: torch.Tensor, rows: int, cols: int) -> np.ndarray:
  assert s.dtype == torch.float8_e4m3fn and tuple(s.shape) == (rows, cols // 16), (s.dtype, tuple(s.shape))
  return s.contiguous().view(torch.uint8).numpy()


def quantize_all(ref: types.ModuleType, x: torch.Tensor) -> dict[str, np.ndarray]:
  """Every mode's codes, scales and amax of x (2D) by NVFP4QuantizerRef."""
  m, n = x.shape
  out = {}

  def quantizer(tile: tuple[int, int], rht: bool):
    return ref.NVFP4QuantizerRef(dtype=ref.reference_utils.Fp4Formats.E2M1, rowwise=True, columnwise=True,
                                 quant_tile_shape=tile, pow_2_scales=False, with_rht=rht)

  def put(mode: str, data: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, rows: int, cols: int) -> None:
    out[f"{mode}|codes"] = _codes(data, rows, cols)
    out[f"{mode}|scale"] = _scale(scale, rows, cols)
    out[f"{mode}|amax"] = amax.to(torch.float32).reshape(1).numpy()

  for name, tile in (("1d", (1, 16)), ("2d", (16, 16))):
    q = quantizer(tile, rht=False).quantize(x)
    put(name, q.data, q.scale, q.global_amax_row, m, n)
    put(f"{name}_t", q.data_t, q.scale_t, q.global_amax_col, n, m)
  if x.dtype == torch.bfloat16:
    q = quantizer((1, 16), rht=True).quantize(x)
    put("1d_rht_t", q.data_t, q.scale_t, q.global_amax_col, n, m)
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("reference", type=pathlib.Path, help="transformer_engine/.../custom_recipes/reference_nvfp4.py")
  parser.add_argument("inputs", type=pathlib.Path)
  parser.add_argument("output", type=pathlib.Path)
  args = parser.parse_args()
  ref = load_reference(args.reference)
  torch.manual_seed(0)  # nothing here draws random numbers (no stochastic rounding); kept deterministic anyway
  inputs = np.load(args.inputs)
  out = {}
  for key in sorted(k for k in inputs.files if k.endswith("|x")):
    name = key.removesuffix("|x")
    dtype = getattr(torch, str(inputs[f"{name}|dtype"]))
    values = inputs[key]
    x = torch.from_numpy(np.ascontiguousarray(values, np.float32)).to(dtype)
    assert np.array_equal(x.to(torch.float32).numpy(), values, equal_nan=True), f"{name}: values not exact in {dtype}"
    out.update({f"{name}|{k}": v for k, v in quantize_all(ref, x).items()})
  np.savez(args.output, **out)


if __name__ == "__main__":
  main()
