# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Each NVFP4 GEMM's decoder layer index, written into the model maxtext built (for BF16 first/last layers).

maxtext's decoders keep their layers in containers named by stack: "layers" (one scanned stack, or "layers_3"
... unscanned), and for DeepSeek-style models "dense_layers" then "moe_layers", whose indices continue after the
`first_num_dense_layers` dense ones. Each GEMM's `nvfp4_layer` variable (MaxText.backends.flags) gets its index,
stacked along the layer axis under scan.
"""

from __future__ import annotations

import re
from typing import Any

import jax.numpy as jnp
from flax import nnx

from MaxText.backends.flags import LAYER_NAME

__all__ = ["assign_layer_indices", "layer_indices"]

#: Decoder layer containers of maxtext's NNX decoders, in model order: scanned stacks ("layers", "dense_layers",
#: "moe_layers") and their unscanned forms ("layers_3", ...).
_STACK_RE = re.compile(r"^(?P<stack>dense_layers|moe_layers|layers)(?:_(?P<index>\d+))?$")


def layer_indices(path: tuple[str, ...], shape: tuple[int, ...], first_num_dense_layers: int = 0) -> list[int] | None:
  """The decoder layer index of each slice of a per-layer variable at `path` (model-rooted), or None outside the
  decoder layouts the plugin knows. A scanned stack ("layers", ...) holds one slice per layer along axis 0; an
  unscanned layer ("layers_3") holds one."""
  match = _STACK_RE.match(path[1]) if len(path) > 1 and path[0] == "decoder" else None
  if match is None:
    return None
  offset = first_num_dense_layers if match["stack"] == "moe_layers" else 0
  if match["index"] is not None:
    return [offset + int(match["index"])]
  return [offset + i for i in range(shape[0])] if shape else [offset]


def assign_layer_indices(model: Any, first_num_dense_layers: int = 0) -> int:
  """Writes each NVFP4 GEMM's decoder layer index into its `nvfp4_layer` variable; returns how many were set.

  Raises:
    ValueError: a GEMM holding the variable sits in a decoder layout this does not know (e.g. scanned blocks of
      several layers), so BF16 first/last layers cannot be honoured there.
  """
  assigned = 0
  for path, node in nnx.iter_graph(model):
    if not (isinstance(node, nnx.Variable) and path and path[-1] == LAYER_NAME):
      continue
    parts = tuple(str(p) for p in path)
    shape = tuple(getattr(node.get_value(), "shape", ()))
    indices = layer_indices(parts, shape, first_num_dense_layers)
    if indices is None:
      raise ValueError(f"nvfp4_bf16_first_layers/last_layers/layers: the NVFP4 GEMM at {'/'.join(parts[:-1])} is "
                       "not in a decoder layer layout the plugin knows (decoder/layers, dense_layers, moe_layers, "
                       "scanned or not); unset those keys for this model.")
    one = len(indices) == 1  # an unscanned layer (any shape), or a scanned stack of one layer: the same values
    node.set_value(jnp.full(shape, indices[0], jnp.int32) if one else jnp.asarray(indices, jnp.int32).reshape(shape))
    assigned += 1
  return assigned
