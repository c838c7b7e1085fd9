# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""What TransformerEngine 2.20.2 refuses on Blackwell, checked on the config before any model is built.

Why at config load: TE checks these with asserts while the train step is traced, on the GPU node, and under
`hardware=gpu` maxtext's `transformer_engine_context` turns any exception raised there into "generator didn't stop
after throw()", which names neither the GEMM nor a key. Each rule below is one TE check, restated on the config's
per-device GEMM dims (gemm_shapes: TE's partitioned GEMMs see one device's shard):

  cuBLAS (cpp_extensions/gemm.py, assert_cublas_requirements): a quantized GEMM's contracting dimension must be a
    multiple of 32 for NVFP4. Fprop contracts K, dgrad N, wgrad M (tokens): all three in training, K in eval.
  RHT (cpp_extensions/quantization.py, the RHT cast-fusion assert): with quantization=te_nvfp4 the wgrad operands
    x (M x K) and dY (M x N) are Hadamard-transformed before quantization, which needs rows (M) a multiple of 64
    and columns (K for x, N for dY) a multiple of 128, on the shard TE's partitioner sees: x of wi and dY of wo
    have the activations' embed dim, which maxtext shards over tensor (compiling for 4 B200s showed it). x is
    transformed in eval forwards too (lowering shows TE quantizing its column-wise copy there). te_nvfp4_no_rht has
    no such rule.
  Collective GEMM (te_comm_gemm_overlap): maxtext wires TE's communication-overlapped GEMMs into its own TE
    wrapper only; the NVFP4 backend calls TE's dense without collective ops, so overlap would silently not happen.
Only called when the TE backend is chosen (nvfp4_backend=te, or auto resolving to te): the emulation has none of
these limits beyond NVFP4's 16-element blocks, which gemm_shapes.block_errors checks for every backend.
"""

from __future__ import annotations

from MaxText.nvfp4.formats import next_multiple
from MaxText.precision.gemm_shapes import Check, GemmDims, misaligned
from MaxText.precision.settings import Settings

__all__ = ["CUBLAS_NVFP4_ALIGNMENT", "RHT_COL_MULTIPLE", "RHT_ROW_MULTIPLE", "te_errors"]

#: cuBLAS's alignment of a quantized GEMM's contracting dimension for FP4 operands (TE's assert_cublas_requirements).
CUBLAS_NVFP4_ALIGNMENT = 32
#: TE's RHT cast fusion: rows and columns of the 2D view of the tensor being transformed.
RHT_ROW_MULTIPLE = 64
RHT_COL_MULTIPLE = 128


def _cublas_checks(d: GemmDims) -> tuple[Check, ...]:
  """Training contracts M (wgrad), K (fprop) and N (dgrad); an eval forward only K."""
  checks = (("M (tokens)", d.m, d.m_keys, CUBLAS_NVFP4_ALIGNMENT), ("K", d.k, d.k_keys, CUBLAS_NVFP4_ALIGNMENT),
            ("N", d.n, d.n_keys, CUBLAS_NVFP4_ALIGNMENT))
  return checks if d.phase == "train" else checks[1:2]


def _rht_checks(d: GemmDims) -> tuple[Check, ...]:
  """x is transformed in every forward (TE quantizes its wgrad copy even when no gradient follows, e.g. in eval);
  dY only in training."""
  checks = (("M (tokens, the rows of x and dY)", d.m, d.m_keys, RHT_ROW_MULTIPLE),
            ("K (the columns of x)", d.x_cols, d.x_cols_keys, RHT_COL_MULTIPLE),
            ("N (the columns of dY)", d.dy_cols, d.dy_cols_keys, RHT_COL_MULTIPLE))
  return checks if d.phase == "train" else checks[:2]


def te_errors(dims: list[GemmDims], settings: Settings, comm_gemm_overlap: str = "disabled") -> list[str]:
  """One-line messages for everything of a run that TE 2.20.2 would refuse on Blackwell (empty: none).

  `dims` are the run's NVFP4 GEMMs (gemm_shapes), `settings` its plugin settings (an NVFP4 mode on the TE backend),
  `comm_gemm_overlap` its te_comm_gemm_overlap value.
  """
  mode = settings.quantization
  errors = []
  overlap = comm_gemm_overlap.lower()
  if overlap != "disabled":
    errors.append(
        f"quantization={mode} with te_comm_gemm_overlap={overlap}: the NVFP4 plugin calls TransformerEngine's dense "
        "GEMMs without collective (communication-overlapped) GEMM ops, so the overlap would silently not happen. "
        "Set te_comm_gemm_overlap=disabled.")
  errors += [
      f"quantization={mode} with the TE backend: the {d.phase} GEMM {d.module} has {axis} = {size} per device "
      f"from {keys}; cuBLAS's FP4 GEMM (which every NVFP4 GEMM on TE uses, contracting M, K and N across "
      f"fprop/dgrad/wgrad) needs it a multiple of {multiple} (e.g. {next_multiple(size, multiple)}). Change those "
      "keys, or use nvfp4_backend=emulated." for d, (axis, size, keys, multiple) in misaligned(dims, _cublas_checks)]
  if settings.recipe.rht:  # te_nvfp4_no_rht: no Hadamard transform, no RHT shape rule
    errors += [
        f"quantization={mode} with the TE backend: TransformerEngine's Random Hadamard Transform (applied to the "
        f"weight-gradient operands x and dY) needs rows a multiple of {RHT_ROW_MULTIPLE} and columns a multiple "
        f"of {RHT_COL_MULTIPLE} per device, but the {d.phase} GEMM {d.module} has {axis} = {size} per device from "
        f"{keys}. Use quantization=te_nvfp4_no_rht (no RHT), or make it a multiple of {multiple} per device "
        f"(e.g. {next_multiple(size, multiple)})." for d, (axis, size, keys, multiple) in misaligned(dims, _rht_checks)]
  return errors
