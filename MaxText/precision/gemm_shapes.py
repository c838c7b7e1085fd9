# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The dimensions of every NVFP4 GEMM a config will run, computed from the config alone, before any model exists.

Why: a GEMM dimension that is not a multiple of NVFP4's 16-element block otherwise fails deep inside the traced
train step, after compilation has started, with a traceback naming shapes but not the config keys that set them.
Reading the dims off the config lets the config validator refuse such a run in one line that names the keys.

For y = x W with x: M x K and W: K x N, per dense MLP GEMM:
  wi_0 / wi_1 (or the fused wi): K = emb_dim, N = mlp_dim (fused: len(mlp_activations) x mlp_dim)
  wo:                            K = mlp_dim, N = emb_dim
  M = the tokens of one forward pass (one microbatch; one pipeline microbatch under pipeline parallelism).
Two views of each:
  global: what the emulated backend's GEMM sees (it runs under jit on global arrays; GSPMD shards it).
  per shard: what one device's kernel sees (TransformerEngine's partitioned GEMM): M over the batch and length
    mesh axes (data, fsdp, fsdp_transpose, expert; context, context_usp_ulysses), the mlp dim over tensor and
    tensor_sequence (Megatron-style tensor parallelism, as maxtext's logical axis rules lay it out).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from MaxText.nvfp4.formats import next_multiple
from MaxText.precision.policy import Precision
from MaxText.precision.settings import Settings

__all__ = ["GemmDims", "block_errors", "mesh_sizes", "misaligned", "nvfp4_gemm_dims"]

#: Mesh axes that split the token (row) dimension of an MLP GEMM's activations: maxtext's rules for
#: activation_batch and activation_length.
_BATCH_AXES = ("data", "fsdp", "fsdp_transpose", "expert")
_LENGTH_AXES = ("context", "context_usp_ulysses")
#: Mesh axes that split the mlp dimension (activation_mlp).
_MLP_AXES = ("tensor", "tensor_sequence")


@dataclasses.dataclass(frozen=True)
class GemmDims:
  """One NVFP4 GEMM y = x W of the config's model, for one phase (train or eval).

  m/k/n are per shard (one device's kernel); m_global/k_global/n_global are the whole GEMM. The *_keys strings
  name the config keys (with their values) that set each dimension, for error messages.
  """

  module: str  # e.g. "mlp/wi_0"
  phase: str  # "train" | "eval"
  m: int
  k: int
  n: int
  m_global: int
  k_global: int
  n_global: int
  m_keys: str
  k_keys: str
  n_keys: str
  #: Per-shard columns of x and dY as their activations are laid out (the RHT quantizes them there), with their keys:
  #: the embed dim of wi's x and wo's dY is split by the mesh axes maxtext shards activations' embed over
  #: (activation_embed -> tensor), which TE's partitioner sees; the mlp dim is split as in k and n.
  x_cols: int
  dy_cols: int
  x_cols_keys: str
  dy_cols_keys: str


def _resolve(parallelism: list[int], mesh_axes: list[str], num_devices: int) -> dict[str, int]:
  """Mesh axis sizes with a single -1 given what the others leave, as maxtext's mesh creation does."""
  specified = math.prod(size for size in parallelism if size != -1)
  leftover = num_devices // specified if specified > 0 and num_devices > 0 and num_devices % specified == 0 else 1
  return {axis: (leftover if size == -1 else max(int(size), 1)) for axis, size in zip(mesh_axes, parallelism)}


def mesh_sizes(config: Any) -> dict[str, int]:
  """Size of every mesh axis (ICI x DCN) the run will get, from the config's resolved parallelism lists."""
  num_devices = int(getattr(config, "num_target_devices", 1) or 1)
  num_slices = max(int(getattr(config, "num_slices", 1) or 1), 1)
  axes = list(config.mesh_axes)
  ici = _resolve(list(config.ici_parallelism), axes, num_devices // num_slices)
  dcn = _resolve(list(config.dcn_parallelism), axes, num_slices)
  return {axis: ici.get(axis, 1) * dcn.get(axis, 1) for axis in axes}


def _product(sizes: dict[str, int], axes: tuple[str, ...]) -> int:
  return math.prod(sizes.get(a, 1) for a in axes)


def _parallelism_keys(sizes: dict[str, int], axes: tuple[str, ...]) -> str:
  """The parallelism keys that split a dimension, e.g. 'ici_tensor_parallelism=2', or '' when none does."""
  return " ".join(f"{a}={sizes[a]}" for a in axes if sizes.get(a, 1) > 1)


def _tokens(config: Any, phase: str) -> tuple[int, str]:
  """(tokens of one forward pass, the keys that set it) for the train or eval batch."""
  seq = int(config.max_target_length)
  if phase == "train":
    batch, pdbs_key = int(config.micro_batch_size_to_train_on), "per_device_batch_size"
  else:
    batch, pdbs_key = int(config.micro_batch_size_to_eval_on), "eval_per_device_batch_size"
  keys = f"{pdbs_key}={getattr(config, pdbs_key)} max_target_length={seq}"
  devices = int(getattr(config, "num_target_devices", 1) or 1)
  if devices > 1:
    keys += f" on {devices} devices"
  if phase == "train" and getattr(config, "using_pipeline_parallelism", False):
    microbatches = max(int(config.num_pipeline_microbatches), 1)
    batch //= microbatches
    keys += f" num_pipeline_microbatches={microbatches}"
  return batch * seq, keys


def _activation_embed_axes(config: Any) -> tuple[str, ...]:
  """The mesh axes maxtext's logical axis rules shard the activations' embed dim over (first rule that names it;
  maxtext 0.2.5's default: tensor). Found by compiling for 4 B200s (fsdp 2 x tensor 2): TE's partitioner then
  Hadamard-transforms x and dY shards of emb / tensor columns."""
  for rule in getattr(config, "logical_axis_rules", None) or ():
    name, axes = rule[0], rule[1]
    if name == "activation_embed":
      return (axes,) if isinstance(axes, str) else tuple(a for a in (axes or ()) if a)
  return ()


def nvfp4_gemm_dims(config: Any, settings: Settings) -> list[GemmDims]:
  """The dense MLP GEMMs that run in NVFP4 under `config` (empty when the MLP runs in BF16).

  `config` is maxtext's validated config (derived values set: emb_dim, mlp_dim, micro batch sizes, resolved
  parallelism); `settings` its plugin settings. Eval GEMMs are listed only when the run evaluates (eval_interval > 0).
  """
  if settings.mlp is not Precision.NVFP4:
    return []
  sizes = mesh_sizes(config)
  row_shards = _product(sizes, _BATCH_AXES + _LENGTH_AXES)
  mlp_shards = _product(sizes, _MLP_AXES)
  row_split = _parallelism_keys(sizes, _BATCH_AXES + _LENGTH_AXES)
  mlp_split = _parallelism_keys(sizes, _MLP_AXES)
  emb, mlp = int(config.emb_dim), int(config.mlp_dim)
  emb_keys = f"emb_dim={emb} (base_emb_dim={config.base_emb_dim})"
  mlp_keys = f"mlp_dim={mlp} (base_mlp_dim={config.base_mlp_dim})" + (f" split by {mlp_split}" if mlp_split else "")
  num_act = len(config.mlp_activations)
  if getattr(config, "fused_mlp", False):
    fused_keys = f"{num_act} mlp_activations x {mlp_keys}"
    up = [("mlp/wi", num_act * mlp, num_act * mlp // max(mlp_shards, 1), fused_keys)]
  else:
    up = [(f"mlp/wi_{i}" if num_act > 1 else "mlp/wi", mlp, mlp // max(mlp_shards, 1), mlp_keys)
          for i in range(num_act)]
  embed_axes = _activation_embed_axes(config)
  embed_shards = _product(sizes, embed_axes)
  embed_split = _parallelism_keys(sizes, embed_axes)
  act_emb, act_emb_keys = emb // max(embed_shards, 1), emb_keys + (f" split by {embed_split}" if embed_split else "")
  phases = ["train"] + (["eval"] if int(getattr(config, "eval_interval", -1)) > 0 else [])
  dims = []
  for phase in phases:
    m_global, m_keys = _tokens(config, phase)
    m = m_global // max(row_shards, 1)
    if row_split:
      m_keys += f" split by {row_split}"
    for module, n_global, n, n_keys in up:
      dims.append(GemmDims(module, phase, m, emb, n, m_global, emb, n_global, m_keys, emb_keys, n_keys,
                           x_cols=act_emb, dy_cols=n, x_cols_keys=act_emb_keys, dy_cols_keys=n_keys))
    k_wo = mlp // max(mlp_shards, 1)
    dims.append(GemmDims("mlp/wo", phase, m, k_wo, emb, m_global, mlp, emb, m_keys, mlp_keys, emb_keys,
                         x_cols=k_wo, dy_cols=act_emb, x_cols_keys=mlp_keys, dy_cols_keys=act_emb_keys))
  return dims


#: One dimension check: (axis name, size, the keys that set it, the multiple it must be).
Check = tuple[str, int, str, int]


def misaligned(dims: list[GemmDims], checks: Callable[[GemmDims], Iterable[Check]]) -> Iterator[tuple[GemmDims, Check]]:
  """Each (GEMM, check) whose size the multiple does not divide, once per distinct (axis, size, keys).

  Why one walker: the block rule here and TE's rules (te_rules) differ only in which dims they check and how
  they word the fix.
  """
  seen = set()
  for d in dims:
    for check in checks(d):
      axis, size, keys, multiple = check
      if size % multiple == 0 or (axis, size, keys) in seen:
        continue
      seen.add((axis, size, keys))
      yield d, check


def block_errors(dims: list[GemmDims], block: int, mode: str) -> list[str]:
  """One message per GEMM dimension (whole GEMM, as the emulation sees it) that `block` does not divide.

  The messages name the config keys that set the dimension and the nearest value that works.
  """
  def checks(d: GemmDims) -> tuple[Check, ...]:
    return (("M (tokens)", d.m_global, d.m_keys, block), ("K", d.k_global, d.k_keys, block),
            ("N", d.n_global, d.n_keys, block))

  return [f"quantization={mode}: the {d.phase} GEMM {d.module} has {axis} = {size} from {keys}, not a "
          f"multiple of {block} (NVFP4 quantizes in blocks of {block} along every GEMM axis); make it a "
          f"multiple of {block} (e.g. {next_multiple(size, block)}), or set nvfp4_mlp_precision=bf16"
          for d, (axis, size, keys, _) in misaligned(dims, checks)]
