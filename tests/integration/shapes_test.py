# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""MaxText.integration.shapes' reads of maxtext config keys that the pre-flight's prediction uses (the GEMM shapes
themselves are tested through the precision plan, tests/precision/gemm_shapes_test.py)."""

from __future__ import annotations

import types

from MaxText.integration import shapes


def test_mlp_widths_follow_the_mesh_axes_that_shard_the_mlp():
  config = types.SimpleNamespace(mlp_dim=14336, num_experts=1, ici_tensor_parallelism=4, dcn_tensor_parallelism=1)
  assert shapes.mlp_widths(config) == {14336, 3584}
  config.ici_tensor_parallelism = -1
  assert {14336, 7168, 3584, 1792} <= shapes.mlp_widths(config)


def test_only_te_s_cudnn_attention_counts_as_fused_attention():
  assert shapes.fused_attention_on_te(types.SimpleNamespace(attention="cudnn_flash_te"))
  assert not shapes.fused_attention_on_te(types.SimpleNamespace(attention="dot_product"))
