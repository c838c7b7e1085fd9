# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The dimensions of every NVFP4 GEMM a run will have, computed from its model's shape, before any model exists.

Why: a GEMM dimension that is not a multiple of NVFP4's 16-element block otherwise fails deep inside the traced
train step, after compilation has started, with a traceback naming shapes but not the config keys that set them.
The integration layer reads the shape off the config (`ModelShape`, with the keys behind each number), so the config
validator refuses such a run in one line that names the keys.

For y = x W with x: M x K and W: K x N, per dense MLP GEMM:
  wi_0 / wi_1 (or the fused wi): K = emb_dim, N = mlp_dim (fused: len(mlp_activations) x mlp_dim)
  wo:                            K = mlp_dim, N = emb_dim
and per attention projection, where they run in NVFP4 (nvfp4_attention_precision=nvfp4):
  query:                         K = emb_dim, N = num_query_heads x head_dim
  key / value:                   K = emb_dim, N = num_kv_heads x head_dim (fused qkv: N = both plus the query's)
  out:                           K = num_query_heads x head_dim, N = emb_dim
  M = the tokens of one forward pass (one microbatch; one pipeline microbatch under pipeline parallelism).
Two views of each:
  global: what the emulated backend's GEMM sees (it runs under jit on global arrays; GSPMD shards it).
  per shard: what one device's kernel sees (TransformerEngine's partitioned GEMM): M over the batch and length
    mesh axes (data, fsdp, fsdp_transpose, expert; context, context_usp_ulysses), the mlp dim over tensor and
    tensor_sequence (Megatron-style tensor parallelism, as maxtext's logical axis rules lay it out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator

from MaxText.nvfp4.formats import next_multiple
from MaxText.precision.policy import Precision
from MaxText.precision.settings import Settings

__all__ = ["AttentionShape", "Check", "GemmDims", "ModelShape", "Sized", "block_errors", "misaligned",
           "nvfp4_gemm_dims"]


@dataclasses.dataclass(frozen=True)
class Sized:
  """A dimension (or a shard count) and the config keys, with their values, that set it: the words of an error."""

  size: int
  keys: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionShape:
  """The attention projections' widths: the query's heads x head_dim, the key's and value's (each), whether maxtext
  fuses the three into one qkv GEMM, and how many devices split the heads (tensor parallelism)."""

  query: Sized
  kv: Sized
  fused_qkv: bool
  heads_shards: Sized


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelShape:
  """What a run's MLP GEMM dims depend on, as plain numbers: read off a maxtext config by the integration layer
  (`MaxText.integration.shapes.model_shape`), so nothing here knows a config key beyond the words in `keys`.

  emb, mlp: the model's widths. num_activations: the up projections (wi_0, wi_1 for SwiGLU), fused into one wi when
  `fused`. tokens: per phase ("train", and "eval" when the run evaluates), the rows of one forward pass.
  row_shards / mlp_shards / embed_shards: how many devices split the token rows, the mlp dim and the activations'
  embed dim (size 1 and keys '' where nothing splits them).
  """

  emb: Sized
  mlp: Sized
  num_activations: int
  fused: bool
  tokens: dict[str, Sized]
  row_shards: Sized
  mlp_shards: Sized
  embed_shards: Sized
  attention: AttentionShape | None = None


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


def _split(dim: Sized, shards: Sized) -> tuple[int, str]:
  """A dimension per shard, with keys that say how it is split."""
  return dim.size // max(shards.size, 1), dim.keys + (f" split by {shards.keys}" if shards.keys else "")


def nvfp4_gemm_dims(shape: ModelShape, settings: Settings) -> list[GemmDims]:
  """The dense GEMMs that run in NVFP4 for a model of `shape`: the MLP's (unless it runs in BF16) and the attention
  projections' (under nvfp4_attention_precision=nvfp4), train and (when the run evaluates) eval."""
  dims = _mlp_dims(shape) if settings.mlp is Precision.NVFP4 else []
  if settings.attention is Precision.NVFP4 and shape.attention is not None:
    dims += _attention_dims(shape, shape.attention)
  return dims


def _attention_dims(shape: ModelShape, attention: AttentionShape) -> list[GemmDims]:
  """The attention projections' GEMMs: query, key and value (or the fused qkv) into the heads, out back to emb."""
  query = _split(attention.query, attention.heads_shards)
  kv = _split(attention.kv, attention.heads_shards)
  if attention.fused_qkv:
    qkv = Sized(attention.query.size + 2 * attention.kv.size, f"{attention.query.keys} + 2 x {attention.kv.keys}")
    ins = [("self_attention/qkv_proj", qkv.size, query[0] + 2 * kv[0], qkv.keys)]
  else:
    ins = [("self_attention/query", attention.query.size, *query), ("self_attention/key", attention.kv.size, *kv),
           ("self_attention/value", attention.kv.size, *kv)]
  return _in_and_out(shape, ins, "self_attention/out", attention.query, attention.heads_shards)


def _mlp_dims(shape: ModelShape) -> list[GemmDims]:
  """The dense MLP GEMMs: gate/up (or the fused wi) and wo."""
  mlp_per_shard, mlp_keys = _split(shape.mlp, shape.mlp_shards)
  if shape.fused:
    fused = Sized(shape.num_activations * shape.mlp.size, f"{shape.num_activations} mlp_activations x {mlp_keys}")
    ins = [("mlp/wi", fused.size, fused.size // max(shape.mlp_shards.size, 1), fused.keys)]
  else:
    ins = [(f"mlp/wi_{i}" if shape.num_activations > 1 else "mlp/wi", shape.mlp.size, mlp_per_shard, mlp_keys)
           for i in range(shape.num_activations)]
  return _in_and_out(shape, ins, "mlp/wo", shape.mlp, shape.mlp_shards)


def _in_and_out(shape: ModelShape, ins: list[tuple[str, int, int, str]], out: str, hidden: Sized,
                hidden_shards: Sized) -> list[GemmDims]:
  """Per phase, the GEMMs that take x (tokens, emb) into a hidden width (`ins`: module, N whole, N per shard, its
  keys) and the one (`out`) that takes the `hidden` width, split over `hidden_shards`, back to emb: the MLP's shape
  and the attention projections' alike."""
  emb = shape.emb.size
  act_emb, act_emb_keys = _split(shape.emb, shape.embed_shards)
  k, k_keys = _split(hidden, hidden_shards)
  dims = []
  for phase, tokens in shape.tokens.items():
    m, m_keys = _split(tokens, shape.row_shards)
    for module, n_global, n, n_keys in ins:
      dims.append(GemmDims(module, phase, m, emb, n, tokens.size, emb, n_global, m_keys, shape.emb.keys, n_keys,
                           x_cols=act_emb, dy_cols=n, x_cols_keys=act_emb_keys, dy_cols_keys=n_keys))
    dims.append(GemmDims(out, phase, m, k, emb, tokens.size, hidden.size, emb, m_keys, k_keys, shape.emb.keys,
                         x_cols=k, dy_cols=act_emb, x_cols_keys=k_keys, dy_cols_keys=act_emb_keys))
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
          f"multiple of {block} (e.g. {next_multiple(size, block)}), or set {precision_key(d)}=bf16"
          for d, (axis, size, keys, _) in misaligned(dims, checks)]


def precision_key(d: GemmDims) -> str:
  """The key that takes GEMM `d` out of NVFP4: the attention projections' or the MLP's precision."""
  return "nvfp4_attention_precision" if d.module.startswith("self_attention/") else "nvfp4_mlp_precision"
