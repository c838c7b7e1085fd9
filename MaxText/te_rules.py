# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""What TransformerEngine 2.20.2 refuses on Blackwell, checked on the config before any model is built.

Why at config load: TE checks these with asserts while the train step is traced, on the GPU node, and under
`hardware=gpu` maxtext's `transformer_engine_context` turns any exception raised there into "generator didn't stop
after throw()", which names neither the GEMM nor a key. Each rule below is one TE check, restated on the config's
per-device GEMM dims (MaxText/gemm_shapes.py: TE's partitioned GEMMs see one device's shard):

  cuBLAS (cpp_extensions/gemm.py, assert_cublas_requirements): a quantized GEMM's contracting dimension must be a
    multiple of 32 for NVFP4. Fprop contracts K, dgrad N, wgrad M (tokens): all three in training, K in eval.
  RHT (cpp_extensions/quantization.py, the RHT cast-fusion assert): with quantization=te_nvfp4 the wgrad operands
    x (M x K) and dY (M x N) are Hadamard-transformed before quantization, which needs rows (M) a multiple of 64
    and columns (K for x, N for dY) a multiple of 128. x is transformed in eval forwards too (lowering shows TE
    quantizing its column-wise copy there). te_nvfp4_no_rht has no such rule.
  Collective GEMM (te_comm_gemm_overlap): maxtext wires TE's communication-overlapped GEMMs into its own TE
    wrapper only; the NVFP4 backend calls TE's dense without collective ops, so overlap would silently not happen.
Only called when the TE backend is chosen (nvfp4_backend=te, or auto resolving to te): the emulation has none of
these limits beyond NVFP4's 16-element blocks, which gemm_shapes.block_errors checks for every backend.
"""

from __future__ import annotations

from typing import Any

from MaxText.gemm_shapes import GemmDims, nvfp4_gemm_dims

__all__ = ["CUBLAS_NVFP4_ALIGNMENT", "RHT_COL_MULTIPLE", "RHT_ROW_MULTIPLE", "te_errors"]

#: cuBLAS's alignment of a quantized GEMM's contracting dimension for FP4 operands (TE's assert_cublas_requirements).
CUBLAS_NVFP4_ALIGNMENT = 32
#: TE's RHT cast fusion: rows and columns of the 2D view of the tensor being transformed.
RHT_ROW_MULTIPLE = 64
RHT_COL_MULTIPLE = 128


def _value(setting: Any) -> str:
  return str(getattr(setting, "value", setting))


def _next_multiple(value: int, multiple: int) -> int:
  return -(-value // multiple) * multiple


def _dims_of(d: GemmDims) -> tuple[tuple[str, int, str], ...]:
  """(axis name, per-device size, keys that set it) for M, K and N of one GEMM."""
  return (("M (tokens)", d.m, d.m_keys), ("K", d.k, d.k_keys), ("N", d.n, d.n_keys))


def _cublas_errors(dims: list[GemmDims], mode: str) -> list[str]:
  errors, seen = [], set()
  for d in dims:
    # Training contracts M (wgrad), K (fprop) and N (dgrad); an eval forward only K.
    for axis, size, keys in _dims_of(d) if d.phase == "train" else _dims_of(d)[1:2]:
      if size % CUBLAS_NVFP4_ALIGNMENT == 0 or (axis, size) in seen:
        continue
      seen.add((axis, size))
      errors.append(
          f"quantization={mode} with the TE backend: the {d.phase} GEMM {d.module} has {axis} = {size} per device "
          f"from {keys}; cuBLAS's FP4 GEMM (which every NVFP4 GEMM on TE uses, contracting M, K and N across "
          f"fprop/dgrad/wgrad) needs it a multiple of {CUBLAS_NVFP4_ALIGNMENT} (e.g. "
          f"{_next_multiple(size, CUBLAS_NVFP4_ALIGNMENT)}). Change those keys, or use nvfp4_backend=emulated.")
  return errors


def _rht_errors(dims: list[GemmDims], mode: str) -> list[str]:
  errors, seen = [], set()
  for d in dims:
    # x is transformed in every forward (TE quantizes its wgrad copy even when no gradient follows, e.g. in eval);
    # dY only in training.
    checks = (("M (tokens, the rows of x and dY)", d.m, d.m_keys, RHT_ROW_MULTIPLE),
              ("K (the columns of x)", d.k, d.k_keys, RHT_COL_MULTIPLE),
              ("N (the columns of dY)", d.n, d.n_keys, RHT_COL_MULTIPLE))
    if d.phase != "train":
      checks = checks[:2]
    for axis, size, keys, multiple in checks:
      if size % multiple == 0 or (axis, size) in seen:
        continue
      seen.add((axis, size))
      errors.append(
          f"quantization={mode} with the TE backend: TransformerEngine's Random Hadamard Transform (applied to the "
          f"weight-gradient operands x and dY) needs rows a multiple of {RHT_ROW_MULTIPLE} and columns a multiple "
          f"of {RHT_COL_MULTIPLE} per device, but the {d.phase} GEMM {d.module} has {axis} = {size} per device from "
          f"{keys}. Use quantization=te_nvfp4_no_rht (no RHT), or make it a multiple of {multiple} per device "
          f"(e.g. {_next_multiple(size, multiple)}).")
  return errors


def te_errors(config: Any) -> list[str]:
  """One-line messages for everything in `config` that TE 2.20.2 would refuse on Blackwell (empty: none).

  `config` is maxtext's validated config with the plugin's keys, for an NVFP4 mode that runs on the TE backend.
  """
  mode = _value(config.quantization)
  errors = []
  overlap = _value(getattr(config, "te_comm_gemm_overlap", "disabled")).lower()
  if overlap != "disabled":
    errors.append(
        f"quantization={mode} with te_comm_gemm_overlap={overlap}: the NVFP4 plugin calls TransformerEngine's dense "
        "GEMMs without collective (communication-overlapped) GEMM ops, so the overlap would silently not happen. "
        "Set te_comm_gemm_overlap=disabled.")
  dims = nvfp4_gemm_dims(config)
  errors += _cublas_errors(dims, mode)
  if mode == "te_nvfp4":  # te_nvfp4_no_rht: no Hadamard transform, no RHT shape rule
    errors += _rht_errors(dims, mode)
  return errors
