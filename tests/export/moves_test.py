# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""MaxText.export.moves on conversions built here (a transpose, RoPE's row order with a scale, and ones it must
refuse) and on maxtext's own Llama conversion of a query kernel: no serving library."""

from __future__ import annotations

import numpy as np
import pytest

from MaxText.export import layouts
from MaxText.export.mapping import ExportError
from MaxText.export.moves import apply, moves

IN, HEADS, HEAD_DIM = 32, 2, 32
SCALE = np.float32(np.sqrt(HEAD_DIM))


def _transpose(w: np.ndarray) -> list[tuple[str, np.ndarray]]:
  return [("w.weight", np.asarray(w).reshape(w.shape[0], -1).T)]


def _rope_scaled(w: np.ndarray) -> list[tuple[str, np.ndarray]]:
  """Llama's query conversion as maxtext writes it: scale in float32, each head's dims 0, 2, ... then 1, 3, ...,
  then [out, in]."""
  w = (np.asarray(w, np.float32) * SCALE).astype(np.asarray(w).dtype)
  return _transpose(np.concatenate([w[..., ::2], w[..., 1::2]], axis=-1))


def test_a_transpose_moves_nothing():
  (move,) = moves(_transpose, (IN, HEADS, HEAD_DIM))
  np.testing.assert_array_equal(move.rows, np.arange(HEADS * HEAD_DIM))
  assert move.factor == 1
  w = np.random.default_rng(0).normal(size=(IN, HEADS, HEAD_DIM)).astype(np.float32)
  np.testing.assert_array_equal(move.operand(w), w.reshape(IN, -1).T)


def test_ropes_rows_and_the_query_scale_are_found_and_applied():
  """The operand quantized and moved is the conversion's weight, code for code; its tensor scale carries the factor
  (red when the rows or the factor are left out of `apply`)."""
  (move,) = moves(_rope_scaled, (IN, HEADS, HEAD_DIM))
  assert move.factor == SCALE
  w = np.random.default_rng(1).normal(size=(IN, HEADS, HEAD_DIM)).astype(np.float32)
  q = apply(move, layouts.quantize_weight(move.operand(w), np.float32, two_d=True))
  trained = layouts.quantize_weight(w.reshape(IN, -1).T, np.float32, two_d=True)
  ((_, hf),) = _rope_scaled(w)
  rows = np.concatenate([np.arange(0, HEAD_DIM, 2), np.arange(1, HEAD_DIM, 2)])
  rows = (np.arange(HEADS)[:, None] * HEAD_DIM + rows).reshape(-1)
  np.testing.assert_array_equal(q.packed, trained.packed[rows])
  np.testing.assert_array_equal(q.scale, trained.scale[rows])
  assert q.s_enc == np.float32(trained.s_enc / SCALE) and q.s_dec == np.float32(trained.s_dec * SCALE)
  np.testing.assert_array_equal(move.operand(w)[move.rows] * SCALE, hf)  # the rows are the conversion's


@pytest.mark.parametrize("convert, why", [
    (lambda w: _transpose(np.asarray(w)[::-1].copy()), "across the training operand's rows"),
    (lambda w: [("w.weight", np.asarray(w).reshape(IN, -1))], "across the training operand's rows"),
    (lambda w: _transpose(np.asarray(w) + 1), "does not only move and scale"),
], ids=["inputs_reversed", "not_transposed", "shifted"])
def test_a_conversion_that_does_more_is_refused_naming_the_tensor(convert, why):
  with pytest.raises(ExportError, match=f"w.weight: maxtext's conversion .*{why}.*--format bf16"):
    moves(convert, (IN, HEADS, HEAD_DIM))


def test_maxtexts_llama_query_conversion_is_ropes_rows_and_sqrt_head_dim():
  """The real hooks (maxtext.checkpoint_conversion, Llama 3.1): what the export's attention relies on. A bf16
  weight_dtype rounds what the conversion writes, not the scale the probe reads."""
  from MaxText.export import mapping  # pylint: disable=import-outside-toplevel
  from tests.export.checks import DENSE, config_of  # pylint: disable=import-outside-toplevel

  config = config_of([*DENSE, "head_dim=32", "scan_layers=false", "weight_dtype=bfloat16"])
  model = mapping.model_of(config)
  key = "params-decoder-layers_0-self_attention-query-kernel"
  (piece,) = mapping.converted(model, key, np.zeros((64, 4, 32), np.float32), config)
  assert piece.tensors[0][1].dtype.name == "bfloat16"  # what the export writes; the probe keeps float32
  (move,) = moves(piece.probe, (64, 4, 32))
  assert move.factor == np.float32(np.sqrt(32))
  rows = np.concatenate([np.arange(0, 32, 2), np.arange(1, 32, 2)])
  np.testing.assert_array_equal(move.rows, (np.arange(4)[:, None] * 32 + rows).reshape(-1))
