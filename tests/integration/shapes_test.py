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
