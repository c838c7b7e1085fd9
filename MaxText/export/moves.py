# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Where maxtext's conversion puts each element of a GEMM weight, so that the export quantizes the weight in the
training forward's own layout and moves the codes and scales as the conversion moves the elements.

Why: the conversion does more than transpose some weights. For Llama's query and key it reorders each head's rows
(RoPE: maxtext's interleaved pairs to Hugging Face's halves) and scales the query by sqrt(head_dim) (maxtext folds
1/sqrt(head_dim) into the query kernel). Quantized after that, the recipe's 16x16 weight tiles would be other sets of
elements than the training forward's, and the codes other codes. Quantized before, every 1x16 block of a Hugging
Face row is a block of one of the operand's rows, so a row move keeps codes and scales, and the scale goes into the
FP32 tensor scale (docs/export.md#attention-projections).

How: the conversion is run, in float32, on arrays of element indices (in base-16 digits, which float32 holds exactly
even scaled by sqrt(head_dim)) and on ones (the scale); a conversion that does anything else than move
and scale, or that moves elements across the operand's rows, is refused.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from MaxText.export.layouts import QuantizedWeight
from MaxText.export.mapping import ExportError

__all__ = ["Move", "apply", "moves"]

_DIGIT = 16


@dataclasses.dataclass(frozen=True)
class Move:
  """One Hugging Face weight [out, in] as the training operand's rows, moved and scaled.

  source: [out, in] flat indices into the maxtext parameter (one layer's piece) of the operand's elements, in the
    operand's own row order: quantizing `piece.ravel()[source]` is the training forward's quantization.
  rows: for each Hugging Face row, the operand's row it holds.
  factor: the conversion's scale (sqrt(head_dim) for Llama's query, else 1), a float32 as maxtext multiplies.
  """

  source: np.ndarray
  rows: np.ndarray
  factor: np.float32

  def operand(self, piece: Any) -> np.ndarray:
    """The training operand of this weight, transposed ([out, in]), from the maxtext parameter's piece."""
    return np.asarray(piece).reshape(-1)[self.source]


def moves(convert: Callable[[Any], list[tuple[str, np.ndarray]]], shape: tuple[int, ...]) -> list[Move]:
  """The Move of each Hugging Face tensor that `convert` (maxtext's conversion of one parameter's piece, keeping
  float32: mapping.Piece.probe) makes of an array shaped `shape`, in its order; ExportError when a tensor is not a
  moved (and scaled) copy of an [in, out] operand's rows."""

  def converted(values: np.ndarray) -> list[tuple[str, np.ndarray]]:
    return [(name, np.asarray(a, np.float64)) for name, a in convert(values)]

  size = math.prod(shape)
  ones = converted(np.ones(shape, np.float32))
  index = np.arange(size, dtype=np.int64)
  places = [np.zeros(a.shape, np.int64) for _, a in ones]
  whole = [True] * len(ones)  # every digit came back a whole multiple of the scale: nothing but moves and scales
  for d in range(max(1, math.ceil(math.log(size, _DIGIT)))):
    digit = ((index // _DIGIT ** d) % _DIGIT).astype(np.float32).reshape(shape)
    for i, (place, (_, got), (_, scale)) in enumerate(zip(places, converted(digit), ones)):
      found = got / scale
      place += np.rint(found).astype(np.int64) * _DIGIT ** d
      whole[i] = whole[i] and bool(np.all(np.abs(found - np.rint(found)) < 0.25))
  return [_move(name, place, scale, ok) for place, (name, scale), ok in zip(places, ones, whole)]


def _move(name: str, place: np.ndarray, scale: np.ndarray, whole: bool) -> Move:
  """The Move of one tensor from its elements' flat indices `place` [out, in], its ones' image `scale`, and whether
  every index came back whole."""
  factor = np.float32(scale.reshape(-1)[0])
  why = None
  if place.ndim != 2 or not whole or not np.all(scale == factor) or factor == 0:
    why = "does not only move and scale its elements"
  else:
    order = np.argsort(place[:, 0], kind="stable")
    source = place[order]
    out, inputs = source.shape
    # The operand [in, out] flattened: row r of its transpose, feature j, is element j * out + r after the first.
    if not np.array_equal(source, source[0, 0] + np.arange(inputs)[None, :] * out + np.arange(out)[:, None]):
      why = "moves elements across the training operand's rows (only whole rows may move)"
  if why is not None:
    raise ExportError(f"{name}: maxtext's conversion {why}, so the trained NVFP4 blocks cannot be written; "
                      "export with --format bf16")
  return Move(source=source, rows=np.argsort(order), factor=factor)


def apply(move: Move, q: QuantizedWeight) -> QuantizedWeight:
  """The quantized operand `q` ([out, in] in the operand's row order) as the Hugging Face weight: rows moved, the
  conversion's scale in the tensor scales (codes and block scales unchanged)."""
  if move.factor == 1:
    return dataclasses.replace(q, packed=q.packed[move.rows], scale=q.scale[move.rows])
  return QuantizedWeight(packed=q.packed[move.rows], scale=q.scale[move.rows],
                         s_enc=np.float32(q.s_enc / move.factor), s_dec=np.float32(q.s_dec * move.factor))
