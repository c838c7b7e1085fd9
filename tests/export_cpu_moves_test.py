# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""MaxText.export.moves on Llama's key projection, in the CPU suite: rows that move with factor 1.

Why here and not in tests/export/moves_test.py: `make test-cpu` ignores tests/export (its group runs under
`make test-export`, which needs .venv-export), and this needs none of the serving libraries, only maxtext's own
conversion hooks. The key is the case that group alone caught: RoPE reorders its rows as it does the query's, but
without the query's sqrt(head_dim), so `apply` takes its factor-1 path, where the block scales must move with the
codes."""

from __future__ import annotations

import numpy as np

from MaxText.export import layouts, mapping
from MaxText.export.moves import apply, moves
from tests.helpers import TINY_YML, load_config

EMB, KV_HEADS, HEAD_DIM = 64, 4, 32  # head_dim 32: RoPE's row order crosses the 16-row weight tiles
#: A Llama 3.1 model sized down (tests/export/checks.py's DENSE with head_dim 32), one layer per parameter.
LLAMA = ["model_name=llama3.1-8b", "override_model_config=true", f"base_emb_dim={EMB}", "base_num_query_heads=4",
         f"base_num_kv_heads={KV_HEADS}", f"head_dim={HEAD_DIM}", "base_num_decoder_layers=2", "vocab_size=256",
         "base_mlp_dim=256", "scan_layers=false"]


def test_llamas_key_moves_its_rows_codes_and_block_scales_together_with_factor_1():
  """maxtext's Llama key conversion is RoPE's row order (each head's even dims, then its odd) and no scale; applied
  to the forward's quantized operand, every Hugging Face row gets the codes and the 16x16 tile's scale of the
  operand row it holds, and the tensor scales are unchanged. Rows of different magnitudes make the tiles' scales
  differ, so scales left in the operand's row order would be other rows' (red where the factor-1 path moves only
  the codes)."""
  config = load_config(TINY_YML, *LLAMA)
  shape = (EMB, KV_HEADS, HEAD_DIM)
  key = "params-decoder-layers_0-self_attention-key-kernel"
  (piece,) = mapping.converted(mapping.model_of(config), key, np.zeros(shape, np.float32), config)
  (move,) = moves(piece.probe, shape)
  assert move.factor == 1
  rope = np.concatenate([np.arange(0, HEAD_DIM, 2), np.arange(1, HEAD_DIM, 2)])
  rows = (np.arange(KV_HEADS)[:, None] * HEAD_DIM + rope).reshape(-1)
  np.testing.assert_array_equal(move.rows, rows)

  magnitudes = 1.0 + np.arange(KV_HEADS * HEAD_DIM)  # per operand row (a column of the kernel)
  w = (np.random.default_rng(0).normal(size=(EMB, KV_HEADS * HEAD_DIM)) * magnitudes).astype(np.float32)
  w = w.reshape(shape)
  trained = layouts.quantize_weight(w.reshape(EMB, -1).T, np.float32, two_d=True)
  assert not np.array_equal(trained.scale[rows], trained.scale)  # the test can see scales left unmoved
  q = apply(move, layouts.quantize_weight(move.operand(w), np.float32, two_d=True))
  np.testing.assert_array_equal(q.packed, trained.packed[rows])
  np.testing.assert_array_equal(q.scale.view(np.uint8), trained.scale[rows].view(np.uint8))
  assert (q.s_enc, q.s_dec) == (trained.s_enc, trained.s_dec)
  ((_, hf),) = piece.probe(w)
  np.testing.assert_array_equal(move.operand(w)[move.rows], hf)  # the rows are the conversion's
