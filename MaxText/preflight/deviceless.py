# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""Importing TransformerEngine and answering its device queries on a machine without an NVIDIA driver or GPU.

Why: XLA's GPU compiler compiles for a GPU it only has a description of (MaxText.preflight.targets), and the TE
backend can be traced, lowered and compiled for it on CPU; only TE's import and its device queries stand in the
way. This module answers them, for the pre-flight (`python -m MaxText.preflight`) and the TE test group:
  - libcuda.so.1, the driver, is absent: a stub built with the system C compiler (it reports no device if called).
  - TE's library loader prefers a system CUDA toolkit (/usr/local/cuda, *_HOME) over the cu12 wheels; a toolkit
    of another major version there would be loaded. NVRTC_HOME/CURAND_HOME/CUDNN_HOME point it at the wheels, and
    the libraries libtransformer_engine.so links (cudart, cublas, cublasLt, nccl) are preloaded from the wheels.
  - TE asks the GPU for its compute capability at trace time (`get_device_compute_capability`): answered with the
    target's wherever TE imported the query by name.
  - TE's fused attention (maxtext's attention=cudnn_flash_te) asks cuDNN, on the GPU, which backend runs and how
    much workspace it needs: answered with cuDNN's arbitrary-sequence-length backend (TE's choice for causal BF16
    attention on Hopper and Blackwell) and no workspace, which a memory figure must then say it leaves out.
Use it in a process that never runs a GPU kernel: a stub driver in the process makes real GPU use impossible.
Nothing here runs a kernel: what compiling cannot show (kernel numerics, speed) needs the GPU itself.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import importlib.metadata
import os
import pathlib
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from typing import Any

#: The compute capability answered by default: SM 10.0 (B200/GB200), where TE enables NVFP4.
COMPUTE_CAPABILITY = 100

# A driver that has no device: enough for the dynamic loader; cuInit reports CUDA_ERROR_NO_DEVICE (100).
_STUB_LIBCUDA_C = """
int cuInit(unsigned int flags) { (void)flags; return 100; }
int cuDriverGetVersion(int *version) { if (version) *version = 12090; return 0; }
int cuDeviceGetCount(int *count) { if (count) *count = 0; return 0; }
"""

#: Wheel library folders under site-packages/nvidia whose libraries are preloaded (RTLD_GLOBAL), in order.
_PRELOAD = ("cuda_runtime", "cublas", "nccl", "cuda_nvrtc", "curand", "cudnn")


def te_installed() -> bool:
  """True when transformer_engine and its JAX extension are installed (not whether they import)."""
  try:
    importlib.metadata.version("transformer-engine-jax")
  except importlib.metadata.PackageNotFoundError:
    return False
  return True


def _nvidia_dir() -> pathlib.Path:
  return pathlib.Path(sysconfig.get_path("purelib")) / "nvidia"


def _build_stub_libcuda(out_dir: pathlib.Path) -> pathlib.Path:
  """Compiles the stub driver into out_dir/libcuda.so.1 with the system C compiler."""
  src = out_dir / "stub_libcuda.c"
  lib = out_dir / "libcuda.so.1"
  src.write_text(_STUB_LIBCUDA_C, encoding="utf-8")
  cc = os.environ.get("CC", "gcc")
  proc = subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(lib), str(src)],
                        capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    raise RuntimeError(f"building the stub libcuda.so.1 with {cc} failed: {proc.stderr.strip()}")
  return lib


def _preload(folder: pathlib.Path) -> list[str]:
  """Loads every versioned shared library of a wheel folder (nvidia/<name>/lib/lib*.so.N) into the process.

  In passes, so that a library whose dependency (by soname, from the same folder) comes later in the listing
  loads once that dependency has.
  """
  pending, loaded = sorted((folder / "lib").glob("lib*.so.*[0-9]")), []
  while pending:
    failed = []
    for so in pending:
      try:
        ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL | os.RTLD_LAZY)  # lazy: the stub driver has few symbols
        loaded.append(so.name)
      except OSError:
        failed.append(so)
    if len(failed) == len(pending):
      raise OSError(f"cannot preload {[so.name for so in failed]} from {folder}")
    pending = failed
  return loaded


@dataclasses.dataclass(frozen=True, kw_only=True)
class Answer:
  """One of TE's device queries (or a cache of their results) answered without a GPU.

  targets: "module:attribute" symbols replaced by the answer (TE imports its capability query by name into several
    modules, so each binding is one target). value: what they become, given the answered compute capability.
  why: the question TE asks there.
  """

  targets: tuple[str, ...]
  value: Callable[[int], Any]
  why: str


def _capability_query(capability: int) -> Callable[..., int]:
  def get_device_compute_capability(gpu_id: int = 0) -> int:
    del gpu_id
    return capability

  return get_device_compute_capability


def _fused_attn_backend(capability: int) -> Callable[..., Any]:
  del capability
  import transformer_engine_jax as tex  # pylint: disable=import-outside-toplevel  # after import_transformer_engine

  backend = tex.NVTE_Fused_Attn_Backend.NVTE_F16_arbitrary_seqlen

  def get_fused_attn_backend(*args, **kwargs):
    del args, kwargs
    return backend, ""

  return get_fused_attn_backend


def _no_workspace(capability: int) -> Callable[..., Any]:
  del capability
  import transformer_engine_jax as tex  # pylint: disable=import-outside-toplevel  # after import_transformer_engine

  def workspace_sizes(*args, **kwargs):
    del args, kwargs
    return (0,), tex.DType.kByte

  return workspace_sizes


_QUERY = "get_device_compute_capability"
#: Every answer the pre-flight and the TE group give TE 2.20.2 on a machine without a GPU: the one table of them,
#: checked against the installed TE before any is applied (`answer`).
ANSWERS: tuple[Answer, ...] = (
    Answer(targets=(f"transformer_engine_jax:{_QUERY}", f"transformer_engine.jax.quantize.device_utils:{_QUERY}",
                    f"transformer_engine.jax.quantize.helper:{_QUERY}", f"transformer_engine.jax.quantize:{_QUERY}",
                    f"transformer_engine.jax.cpp_extensions.gemm:{_QUERY}"),
           value=_capability_query,
           why="the GPU's compute capability, asked at trace time (NVFP4 needs >= 10.0)"),
    Answer(targets=("transformer_engine.jax.quantize.helper:_is_scaling_mode_supported",
                    "transformer_engine.jax.quantize.helper:_reason_for_no_scaling_mode"),
           value=lambda capability: None,
           why="TE's cached verdicts per scaling mode, forgotten so they are asked again of the answered capability"),
    Answer(targets=("transformer_engine_jax:get_fused_attn_backend",), value=_fused_attn_backend,
           why="cuDNN's fused-attention backend (maxtext's attention=cudnn_flash_te): the arbitrary-sequence-length "
           "one, TE's choice for causal BF16 attention on Hopper and Blackwell"),
    Answer(targets=("transformer_engine_jax:get_fused_attn_fwd_workspace_sizes",
                    "transformer_engine_jax:get_fused_attn_bwd_workspace_sizes"), value=_no_workspace,
           why="cuDNN's attention workspace, which only the GPU can size: 0 bytes, which a memory figure must say"),
)


def _owner(target: str) -> tuple[Any, str]:
  module_name, _, name = target.partition(":")
  return importlib.import_module(module_name), name


def answer(capability: int = COMPUTE_CAPABILITY) -> None:
  """Applies every ANSWERS entry for `capability` (SM 100 = 10.0) after checking that each target exists in the
  installed TE (import_transformer_engine first). Idempotent; a later call answers another capability.

  Raises:
    RuntimeError: a target is missing (another TE release): nothing is applied.
  """
  missing = [t for a in ANSWERS for t in a.targets if not hasattr(*_owner(t))]
  if missing:
    raise RuntimeError(f"TransformerEngine {importlib.metadata.version('transformer-engine-jax')} lacks "
                       f"{', '.join(missing)}: the pre-flight answers TE 2.20.2's device queries; see "
                       "MaxText/preflight/deviceless.py")
  for entry in ANSWERS:
    value = entry.value(capability)
    for target in entry.targets:
      owner, name = _owner(target)
      setattr(owner, name, value)


def import_transformer_engine() -> object:
  """Applies the shims and imports transformer_engine.jax; returns the module. Idempotent."""
  if "transformer_engine.jax" in sys.modules:
    return sys.modules["transformer_engine.jax"]
  nvidia = _nvidia_dir()
  if not nvidia.is_dir():
    raise RuntimeError(f"no CUDA wheels under {nvidia}: run ./setup.sh --gpu --venv .venv-gpu")
  for name, folder in (("NVRTC_HOME", "cuda_nvrtc"), ("CURAND_HOME", "curand"), ("CUDNN_HOME", "cudnn")):
    os.environ[name] = str(nvidia / folder)
  # Loaded by path, then its folder removed: the loaded library stays mapped, and a later dlopen("libcuda.so.1")
  # (jax's CUDA plugin, TE) finds it by its soname among the loaded ones. Before, every import left a folder in /tmp.
  with tempfile.TemporaryDirectory(prefix="te_stub_libcuda_") as stub_dir:
    ctypes.CDLL(str(_build_stub_libcuda(pathlib.Path(stub_dir))), mode=ctypes.RTLD_GLOBAL)
  for folder in _PRELOAD:
    _preload(nvidia / folder)
  module = importlib.import_module("transformer_engine.jax")
  # Import every TE module that reads the capability before answering, so each one's name binding is replaced.
  for name in ("transformer_engine.jax.quantize", "transformer_engine.jax.cpp_extensions",
               "transformer_engine.jax.dense", "transformer_engine.jax.flax"):
    importlib.import_module(name)
  answer()
  return module


def target_environment(capability: float, gpus: int) -> Any:
  """What MaxText.backends.environment's probe would report on `gpus` GPUs of `capability` with TE importing,
  with TE's own NVFP4 verdict for that capability (patched as above)."""
  from MaxText.backends import environment  # pylint: disable=import-outside-toplevel  # jax: only where used

  answer(int(round(capability * 10)))
  return environment.Environment(te_error=None, gpu_capabilities=(float(capability),) * gpus,
                                 te_nvfp4_error=environment.te_nvfp4_support_error())
