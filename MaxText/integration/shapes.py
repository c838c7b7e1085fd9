# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""A maxtext config's model shape as the precision layer's plain numbers: widths, tokens per forward pass, and the
mesh axes that split them (`MaxText.precision.gemm_shapes.ModelShape`).

Why here: these are maxtext facts (its config keys, its parallelism lists, its logical axis rules); the GEMM dims and
the rules on them (NVFP4's blocks, TransformerEngine's alignments) are computed from the numbers, below this layer.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from MaxText.integration.run_keys import maxtext_keys
from MaxText.precision.gemm_shapes import AttentionShape, GemmDims, ModelShape, Sized, nvfp4_gemm_dims
from MaxText.precision.modes import plain
from MaxText.precision.settings import Settings

__all__ = ["LayoutFacts", "fused_attention_on_te", "gemm_dims", "layout_facts", "mesh_sizes", "mlp_widths",
           "model_shape"]

#: Mesh axes that split the token (row) dimension of an MLP GEMM's activations: maxtext's rules for
#: activation_batch and activation_length.
_BATCH_AXES = ("data", "fsdp", "fsdp_transpose", "expert")
_LENGTH_AXES = ("context", "context_usp_ulysses")
#: Mesh axes that split the mlp dimension (activation_mlp).
_MLP_AXES = ("tensor", "tensor_sequence")
#: The mesh axes maxtext 0.2.5's logical rules shard attention heads over (heads, q_heads, kv_heads).
_HEAD_AXES = ("tensor", "tensor_sequence", "autoregressive")


def _resolve(parallelism: list[int], mesh_axes: list[str], num_devices: int) -> dict[str, int]:
  """Mesh axis sizes with a single -1 given what the others leave, as maxtext's mesh creation does."""
  specified = math.prod(size for size in parallelism if size != -1)
  leftover = num_devices // specified if specified > 0 and num_devices > 0 and num_devices % specified == 0 else 1
  return {axis: (leftover if size == -1 else max(int(size), 1)) for axis, size in zip(mesh_axes, parallelism)}


def mesh_sizes(config: Any) -> dict[str, int]:
  """Size of every mesh axis (ICI x DCN) the run will get, from the config's resolved parallelism lists."""
  num_devices = maxtext_keys(config).num_target_devices
  num_slices = max(maxtext_keys(config).num_slices, 1)
  axes = list(config.mesh_axes)
  ici = _resolve(list(config.ici_parallelism), axes, num_devices // num_slices)
  dcn = _resolve(list(config.dcn_parallelism), axes, num_slices)
  return {axis: ici.get(axis, 1) * dcn.get(axis, 1) for axis in axes}


def _shards(sizes: dict[str, int], axes: tuple[str, ...]) -> Sized:
  """How many devices the mesh axes `axes` make together, and the parallelism that does it (e.g. 'tensor=2')."""
  return Sized(math.prod(sizes.get(a, 1) for a in axes), " ".join(f"{a}={sizes[a]}" for a in axes
                                                                    if sizes.get(a, 1) > 1))


def _tokens(config: Any, phase: str) -> Sized:
  """Tokens of one forward pass (and the keys that set it) for the train or eval batch."""
  seq, found = int(config.max_target_length), maxtext_keys(config)
  if phase == "train":
    batch, pdbs = int(config.micro_batch_size_to_train_on), f"per_device_batch_size={found.per_device_batch_size}"
  else:
    batch, pdbs = (int(config.micro_batch_size_to_eval_on),
                   f"eval_per_device_batch_size={found.eval_per_device_batch_size}")
  keys = f"{pdbs} max_target_length={seq}"
  if found.num_target_devices > 1:
    keys += f" on {found.num_target_devices} devices"
  if phase == "train" and found.using_pipeline_parallelism:
    microbatches = max(int(config.num_pipeline_microbatches), 1)
    batch //= microbatches
    keys += f" num_pipeline_microbatches={microbatches}"
  return Sized(batch * seq, keys)


def _activation_embed_axes(config: Any) -> tuple[str, ...]:
  """The mesh axes maxtext's logical axis rules shard the activations' embed dim over (first rule that names it;
  maxtext 0.2.5's default: tensor). Found by compiling for 4 B200s (fsdp 2 x tensor 2): TE's partitioner then
  Hadamard-transforms x and dY shards of emb / tensor columns."""
  for rule in maxtext_keys(config).logical_axis_rules:
    name, axes = rule[0], rule[1]
    if name == "activation_embed":
      return (axes,) if isinstance(axes, str) else tuple(a for a in (axes or ()) if a)
  return ()


def model_shape(config: Any) -> ModelShape:
  """The MLP shape of maxtext's validated `config` (derived values set: emb_dim, mlp_dim, micro batch sizes,
  resolved parallelism). Eval tokens are given only when the run evaluates (eval_interval > 0)."""
  sizes = mesh_sizes(config)
  emb, mlp = int(config.emb_dim), int(config.mlp_dim)
  phases = ["train"] + (["eval"] if maxtext_keys(config).eval_interval > 0 else [])
  return ModelShape(
      emb=Sized(emb, f"emb_dim={emb} (base_emb_dim={config.base_emb_dim})"),
      mlp=Sized(mlp, f"mlp_dim={mlp} (base_mlp_dim={config.base_mlp_dim})"),
      num_activations=len(config.mlp_activations), fused=maxtext_keys(config).fused_mlp,
      tokens={phase: _tokens(config, phase) for phase in phases},
      row_shards=_shards(sizes, _BATCH_AXES + _LENGTH_AXES), mlp_shards=_shards(sizes, _MLP_AXES),
      embed_shards=_shards(sizes, _activation_embed_axes(config)), attention=_attention_shape(config, sizes))


def _attention_shape(config: Any, sizes: dict[str, int]) -> AttentionShape | None:
  """The attention projections' widths as maxtext's config derives them (heads x head_dim); None for MLA
  (attention_type=mla), whose low-rank projections have other widths: their NVFP4 GEMMs check their own dims when the
  step is traced."""
  if plain(maxtext_keys(config).attention_type) == "mla":
    return None
  heads, kv_heads, head_dim = int(config.num_query_heads), int(config.num_kv_heads), int(config.head_dim)
  return AttentionShape(
      query=Sized(heads * head_dim, f"num_query_heads={heads} x head_dim={head_dim}"),
      kv=Sized(kv_heads * head_dim, f"num_kv_heads={kv_heads} x head_dim={head_dim}"),
      fused_qkv=maxtext_keys(config).fused_qkv, heads_shards=_shards(sizes, _HEAD_AXES))


def gemm_dims(config: Any, settings: Settings) -> list[GemmDims]:
  """The NVFP4 GEMMs of `config` (nvfp4_gemm_dims of its model_shape): the MLP's, and the attention projections'
  under nvfp4_attention_precision=nvfp4."""
  return nvfp4_gemm_dims(model_shape(config), settings)


def mlp_widths(config: Any) -> frozenset[int]:
  """The MLP hidden sizes a GEMM of this config carries on one device: mlp_dim (and moe_mlp_dim with experts),
  whole and divided by the mesh axes maxtext shards the `mlp` axis over (fsdp_transpose, tensor, tensor_sequence,
  autoregressive); with fused_mlp also twice mlp_dim's, the fused gate/up GEMM's N (its wo carries mlp_dim). An
  axis sized -1 (the rest of the devices) counts every power-of-two share."""
  widths = {int(config.mlp_dim)}
  if maxtext_keys(config).num_experts > 1:
    widths.add(int(config.moe_mlp_dim))
  sizes = maxtext_keys(config).mlp_parallelism
  shares = {1}
  if any(size < 0 for size in sizes):
    shares |= {2**i for i in range(1, 16)}
  else:
    shares.add(math.prod(sizes))
  found = {width // share for width in widths for share in shares if width % share == 0}
  if maxtext_keys(config).fused_mlp:  # gate and up as one `wi` GEMM: its N is both (activations are unsharded)
    found |= {2 * (int(config.mlp_dim) // share) for share in shares if int(config.mlp_dim) % share == 0}
  return frozenset(found)


def fused_attention_on_te(config: Any) -> bool:
  """Whether attention runs as TransformerEngine's cuDNN fused attention (attention=cudnn_flash_te), whose workspace
  cuDNN sizes only on a GPU."""
  return maxtext_keys(config).attention == "cudnn_flash_te"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayoutFacts:
  """What the pre-flight's layout search (`--tune`) reads of a maxtext config: a dense transformer's sizes, the layout
  the run has (every mesh axis's size, batch, accumulation, remat) and whether maxtext lets it use context
  parallelism."""

  layers: int
  emb: int
  mlp: int
  heads: int
  kv_heads: int
  head_dim: int
  vocab: int
  sequence: int
  mlp_matrices: int  # wi_0, wi_1, wo with a gated activation; 2 without
  mesh: dict[str, int]
  per_device_batch: float
  accumulation: int
  remat: str
  context_parallel: bool
  microbatches: int = 0  # num_pipeline_microbatches (maxtext sets it to the stages when a pipeline leaves it -1)


def layout_facts(config: Any) -> LayoutFacts:
  """The LayoutFacts of maxtext's validated `config`. Context parallelism: maxtext refuses it with packed sequences
  of a real dataset unless attention is its load-balanced ring ("Packing is only supported for load balanced ring
  attention with context parallelism", raised as the attention is traced)."""
  found = maxtext_keys(config)
  ring = str(found.context_parallel_strategy) == "ring" and found.context_parallel_load_balance
  packed = found.packing and found.dataset_type != "synthetic"
  return LayoutFacts(layers=int(config.num_decoder_layers), emb=int(config.emb_dim), mlp=int(config.mlp_dim),
                     heads=int(config.num_query_heads), kv_heads=int(config.num_kv_heads),
                     head_dim=int(config.head_dim), vocab=int(config.vocab_size),
                     sequence=int(config.max_target_length), mlp_matrices=len(config.mlp_activations) + 1,
                     mesh=mesh_sizes(config), per_device_batch=float(config.per_device_batch_size),
                     accumulation=int(config.gradient_accumulation_steps), remat=str(config.remat_policy),
                     context_parallel=ring or not packed, microbatches=int(config.num_pipeline_microbatches))
