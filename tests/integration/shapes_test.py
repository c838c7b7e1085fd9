# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""MaxText.integration.shapes' reads of maxtext config keys that the pre-flight's prediction uses, and the attention
widths it reads off a loaded config (the GEMM shapes computed from them: tests/precision/gemm_shapes_test.py)."""

from __future__ import annotations

import types

from MaxText.integration import shapes
from MaxText.integration.settings import settings_of
from tests.helpers import TINY_YML, load_config


def test_mlp_widths_follow_the_mesh_axes_that_shard_the_mlp():
  config = types.SimpleNamespace(mlp_dim=14336, num_experts=1, ici_tensor_parallelism=4, dcn_tensor_parallelism=1)
  assert shapes.mlp_widths(config) == {14336, 3584}
  config.ici_tensor_parallelism = -1
  assert {14336, 7168, 3584, 1792} <= shapes.mlp_widths(config)


def test_the_fused_gate_and_up_gemm_is_an_mlp_gemm():
  """fused_mlp=true: wi's N is gate and up together (2 x mlp per device); the pre-flight files it under MLP GEMMs,
  not "other GEMMs" (its Amdahl ceiling and MLP FLOP share read that row)."""
  # pylint: disable-next=import-outside-toplevel
  from MaxText.preflight.classify import Math, Work
  from MaxText.preflight.kernels import Kernel  # pylint: disable=import-outside-toplevel
  from MaxText.preflight.predict import Group, group_of  # pylint: disable=import-outside-toplevel

  config = types.SimpleNamespace(mlp_dim=14336, num_experts=1, ici_tensor_parallelism=4, fused_mlp=True)
  assert shapes.mlp_widths(config) == {14336, 3584, 28672, 7168}
  wi = Kernel(name="wi", opcode="custom-call", target="te_gemm_v2_ffi", bytes=0, op_name="mlp/wi",
              work=Work(math=Math.FP4_GEMM, flops=1, gemm_dims=(8192, 7168, 4096)))  # M, N = 2 x 14336 / 4, K
  assert group_of(wi, shapes.mlp_widths(config)) is Group.MLP_GEMMS
  config.fused_mlp = False
  assert group_of(wi, shapes.mlp_widths(config)) is Group.OTHER_GEMMS


def test_only_te_s_cudnn_attention_counts_as_fused_attention():
  assert shapes.fused_attention_on_te(types.SimpleNamespace(attention="cudnn_flash_te"))
  assert not shapes.fused_attention_on_te(types.SimpleNamespace(attention="dot_product"))


def test_grouped_query_attention_gives_key_and_value_their_own_heads_width():
  """GQA (Llama 3 8B: 32 query heads, 8 key/value heads): the key and value projections are num_kv_heads x
  head_dim wide, the query and out projections num_query_heads x head_dim. Every other config of the suite has as
  many kv heads as query heads, where the two widths agree and a k/v width read off the query heads passes unseen.
  The pre-flight's layout facts (kv_heads: the context-parallel all-gathers, the saved qkv bytes) read the same."""
  config = load_config(TINY_YML, "quantization=te_nvfp4", "nvfp4_backend=emulated", "nvfp4_attention_precision=nvfp4",
                       "base_num_query_heads=4", "base_num_kv_heads=2")
  widths = {d.module.split("/")[-1]: (d.k, d.n) for d in shapes.gemm_dims(config, settings_of(config))}
  assert {m: widths[m] for m in ("query", "key", "value", "out")} == {
      "query": (64, 4 * 16), "key": (64, 2 * 16), "value": (64, 2 * 16), "out": (4 * 16, 64)}, widths
  attention = shapes.model_shape(config).attention
  assert (attention.kv.size, attention.kv.keys) == (32, "num_kv_heads=2 x head_dim=16"), attention
  facts = shapes.layout_facts(config)
  assert (facts.heads, facts.kv_heads, facts.head_dim) == (4, 2, 16), facts
