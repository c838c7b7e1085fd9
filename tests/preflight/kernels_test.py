# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""MaxText.preflight.kernels reads a compiled program as kernels with bytes: checked on HLO text in the form XLA's
GPU compiler prints it (the cases the Llama 3 8B step showed: a layer loop, in-place updates of the saved-layer
stacks, TE's calls wrapped in dynamic-slice fusions, async fusions, cuBLAS workspaces)."""

from __future__ import annotations

from MaxText.preflight import kernels
from MaxText.preflight.classify import Math

HLO = """HloModule jit_train_step, entry_computation_layout={()->()}

%fused_dus (param_0: bf16[32,1024], param_1: s32[], param_2: bf16[1,1024]) -> bf16[32,1024] {
  %param_0 = bf16[32,1024]{1,0} parameter(0)
  %param_2 = bf16[1,1024]{1,0} parameter(2)
  %param_1 = s32[] parameter(1)
  %c = s32[] constant(0)
  ROOT %dynamic-update-slice = bf16[32,1024]{1,0} dynamic-update-slice(%param_0, %param_2, %param_1, %c)
}

%fused_slice (param_0.1: bf16[32,1024], param_1.1: s32[]) -> bf16[1,1024] {
  %param_0.1 = bf16[32,1024]{1,0} parameter(0)
  %param_1.1 = s32[] parameter(1)
  %c.1 = s32[] constant(0)
  ROOT %dynamic-slice = bf16[1,1024]{1,0} dynamic-slice(%param_0.1, %param_1.1, %c.1), dynamic_slice_sizes={1,1024}
}

%wrapped_te (p0: bf16[32,1024], p1: s32[]) -> (f4e2m1fn[1,1024], u8[4096]) {
  %p0 = bf16[32,1024]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %c.2 = s32[] constant(0)
  %slice.te = bf16[1,1024]{1,0} dynamic-slice(%p0, %p1, %c.2), dynamic_slice_sizes={1,1024}
  ROOT %te_dbias_quantize_ffi.1 = (f4e2m1fn[1,1024]{1,0}, u8[4096]{0}) custom-call(%slice.te), custom_call_target="te_dbias_quantize_ffi"
}

%fused_max (param_0.2: bf16[1,1024]) -> bf16[] {
  %param_0.2 = bf16[1,1024]{1,0} parameter(0)
  %c.3 = bf16[] constant(-inf)
  ROOT %reduce.1 = bf16[] reduce(%param_0.2, %c.3), dimensions={0,1}, to_apply=%max
}

%max (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %maximum = bf16[] maximum(%a, %b)
}

%body (arg: (s32[], bf16[32,1024])) -> (s32[], bf16[32,1024]) {
  %arg = (s32[], bf16[32,1024]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %stack = bf16[32,1024]{1,0} get-tuple-element(%arg), index=1
  %layer = bf16[1,1024]{1,0} fusion(%stack, %i), kind=kLoop, calls=%fused_slice, metadata={op_name="jit(train_step)/while/body/dynamic_slice"}
  %quantized = (f4e2m1fn[1,1024]{1,0}, u8[4096]{0}) fusion(%stack, %i), kind=kCustom, calls=%wrapped_te, metadata={op_name="jit(train_step)/while/body/TeDotGeneral_nvfp4/te_dbias_quantize_ffi"}
  %gemm = (bf16[1,1024]{1,0}, u8[33554432]{0}) custom-call(%layer, %layer), custom_call_target="te_gemm_v2_ffi", metadata={op_name="jit(train_step)/while/body/TeDotGeneral_nvfp4/te_gemm_v2_ffi"}
  %y = bf16[1,1024]{1,0} get-tuple-element(%gemm), index=0
  %amax = bf16[] fusion(%y), kind=kInput, calls=%fused_max, metadata={op_name="jit(train_step)/while/body/TeDotGeneral_nvfp4/reduce_max"}
  %start = ((bf16[32,1024]{1,0}, bf16[1,1024]{1,0}, s32[]), bf16[32,1024]{1,0}, u32[]) fusion-start(%stack, %y, %i), kind=kLoop, calls=%fused_dus
  %saved = bf16[32,1024]{1,0} fusion-done(%start)
  ROOT %out = (s32[], bf16[32,1024]{1,0}) tuple(%i, %saved)
}

%cond (arg.1: (s32[], bf16[32,1024])) -> pred[] {
  %arg.1 = (s32[], bf16[32,1024]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%arg.1), index=0
  %n = s32[] constant(32)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

ENTRY %main (p: bf16[32,1024]) -> bf16[32,1024] {
  %p = bf16[32,1024]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[32,1024]{1,0}) tuple(%zero, %p)
  %loop = (s32[], bf16[32,1024]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %result = bf16[32,1024]{1,0} get-tuple-element(%loop), index=1
}
"""  # noqa: E501  HLO text as XLA prints it: one instruction a line, however long

ROW = 1024 * 2  # one bf16[1,1024] layer slice


def _by_name() -> dict[str, kernels.Kernel]:
  return {k.name: k for k in kernels.kernels(HLO)}


def test_shape_bytes_counts_every_array_and_packs_fp4():
  assert kernels.shape_bytes("(bf16[8192,4096]{1,0}, f32[1]{0})") == 8192 * 4096 * 2 + 4
  assert kernels.shape_bytes("f4e2m1fn[16,32]{1,0}") == 16 * 32 // 2
  assert kernels.shape_bytes("(bf16[4]{0}, u8[100]{0})", workspace=False) == 8


def test_kernels_of_the_layer_loop_are_found_and_bookkeeping_is_not():
  found = _by_name()
  assert sorted(found) == ["amax", "gemm", "layer", "lt", "quantized", "start"]


def test_slices_and_in_place_updates_count_what_they_touch():
  found = _by_name()
  assert found["layer"].bytes == ROW + ROW + 4  # reads one layer (and the index), writes it
  assert found["start"].bytes == ROW + ROW + 4  # the update read and written; the stack is aliased, not copied


def test_te_calls_count_their_slices_without_workspaces():
  found = _by_name()
  assert found["quantized"].target == "te_dbias_quantize_ffi" and found["quantized"].te
  assert found["quantized"].bytes == ROW + 1024 // 2  # bf16 slice in, FP4 out; the u8 workspace left out
  assert found["gemm"].bytes == 2 * ROW + ROW  # two operands, the result; not cuBLAS's 32 MiB workspace
  assert kernels.counts(kernels.te_kernels(found.values())) == {"te_dbias_quantize_ffi": 1, "te_gemm_v2_ffi": 1}


def test_added_is_what_one_program_has_beyond_the_other():
  ours = kernels.kernels(HLO)
  bare = [k for k in ours if k.name != "amax"]
  assert [k.name for k in kernels.added(ours, bare)] == ["amax"]
  assert kernels.total_bytes(ours) - kernels.total_bytes(bare) == ROW + 2


def test_a_slice_or_update_through_a_bitcast_counts_what_it_touches_not_the_stack():
  """XLA bitcasts the saved-layer stack to the layer loop's layout and slices that: only the slice is read (the
  8B recipe's f32 stack of 32 layers was counted whole, 60 GB a step, before)."""
  hlo = """HloModule m, num_partitions=1

%fused_bitcast_slice (param_0: f32[32,1024], param_1: s32[]) -> bf16[1,1024] {
  %param_0 = f32[32,1024]{1,0} parameter(0)
  %bitcast.1 = f32[1024,32]{0,1} bitcast(%param_0)
  %param_1 = s32[] parameter(1)
  %c = s32[] constant(0)
  %dynamic-slice = f32[1024,1]{0,1} dynamic-slice(%bitcast.1, %c, %param_1), dynamic_slice_sizes={1024,1}
  ROOT %convert = bf16[1,1024]{1,0} convert(%dynamic-slice)
}

%fused_bitcast_dus (param_0.1: f32[32,1024], param_1.1: bf16[1,1024], param_2: s32[]) -> f32[32,1024] {
  %param_0.1 = f32[32,1024]{1,0} parameter(0)
  %bitcast.2 = f32[32,1024]{1,0} bitcast(%param_0.1)
  %param_1.1 = bf16[1,1024]{1,0} parameter(1)
  %convert.1 = f32[1,1024]{1,0} convert(%param_1.1)
  %param_2 = s32[] parameter(2)
  %c.1 = s32[] constant(0)
  ROOT %dynamic-update-slice = f32[32,1024]{1,0} dynamic-update-slice(%bitcast.2, %convert.1, %param_2, %c.1)
}

ENTRY %main (p: f32[32,1024], i: s32[], u: bf16[1,1024]) -> f32[32,1024] {
  %p = f32[32,1024]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %u = bf16[1,1024]{1,0} parameter(2)
  %read = bf16[1,1024]{1,0} fusion(%p, %i), kind=kLoop, calls=%fused_bitcast_slice
  ROOT %write = f32[32,1024]{1,0} fusion(%p, %u, %i), kind=kLoop, calls=%fused_bitcast_dus
}
"""
  found = {k.name: k for k in kernels.kernels(hlo)}
  assert found["read"].bytes == 1024 * 4 + 4 + 1024 * 2  # the f32 slice and the index read, the bf16 row written
  assert found["write"].bytes == 1024 * 2 + 4 + 1024 * 4  # the bf16 update and the index read, the f32 row written


def test_the_done_half_of_an_async_collective_is_no_kernel():
  hlo = """HloModule m, num_partitions=4

%add (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %sum = bf16[] add(%a, %b)
}

ENTRY %main (p: bf16[4096,1024]) -> bf16[1024,1024] {
  %p = bf16[4096,1024]{1,0} parameter(0)
  %rs-start = ((bf16[4096,1024]{1,0}), bf16[1024,1024]{1,0}) reduce-scatter-start(%p), channel_id=1, replica_groups=mesh['fsdp'=4] {'fsdp'}, dimensions={0}, to_apply=%add
  ROOT %rs-done = bf16[1024,1024]{1,0} reduce-scatter-done(%rs-start)
}
"""  # noqa: E501  HLO text as XLA prints it: one instruction a line, however long
  (scatter,) = kernels.kernels(hlo)
  assert scatter.name == "rs-start" and scatter.work.math is Math.COLLECTIVE
  assert scatter.work.group == 4 and scatter.work.wire_bytes == 4096 * 1024 * 2 * 3 // 4  # (n-1)/n of the operand


# The compiled Llama 3 8B step on GB300s, cut down to one kernel of each kind the prediction classifies; shapes,
# attributes and backend configs as XLA's GPU compiler prints them (MLP width 14336, hidden 4096, 2 x 8192 tokens).
CLASSIFIED_HLO = """HloModule jit_train_step, num_partitions=4

%fp8_gemm (param_0: f8e4m3fn[16384,4096], param_1: f8e4m3fn[4096,14336], param_2: bf16[]) -> bf16[16384,14336] {
  %param_0 = f8e4m3fn[16384,4096]{1,0} parameter(0)
  %param_1 = f8e4m3fn[4096,14336]{1,0} parameter(1)
  %dot.88 = bf16[16384,14336]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %param_2 = bf16[] parameter(2)
  %broadcast = bf16[16384,14336]{1,0} broadcast(%param_2), dimensions={}
  ROOT %mul = bf16[16384,14336]{1,0} multiply(%dot.88, %broadcast)
}

%bf16_batched (param_0.1: bf16[8,128,64], param_1.1: bf16[8,64,256]) -> bf16[8,128,256] {
  %param_0.1 = bf16[8,128,64]{2,1,0} parameter(0)
  %param_1.1 = bf16[8,64,256]{2,1,0} parameter(1)
  ROOT %dot.2 = bf16[8,128,256]{2,1,0} dot(%param_0.1, %param_1.1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}

%scale (param_0.2: bf16[16384,14336]) -> bf16[16384,14336] {
  %param_0.2 = bf16[16384,14336]{1,0} parameter(0)
  ROOT %neg = bf16[16384,14336]{1,0} negate(%param_0.2)
}

ENTRY %main (x: f4e2m1fn[2,8192,4096], xs: f8e4m3fn[2,8192,256], w: f4e2m1fn[14336,4096], ws: f8e4m3fn[14336,256], a: f32[1], xf: f8e4m3fn[16384,4096], wf: f8e4m3fn[4096,14336], s: bf16[], q: bf16[2,8192,32,128], kv: bf16[2,8192,8,128], lhs: bf16[8,128,64], rhs: bf16[8,64,256], g: bf16[1024,14336], m: s32[4,4]) -> bf16[2,8192,14336] {
  %x = f4e2m1fn[2,8192,4096]{2,1,0} parameter(0)
  %xs = f8e4m3fn[2,8192,256]{2,1,0} parameter(1)
  %w = f4e2m1fn[14336,4096]{1,0} parameter(2)
  %ws = f8e4m3fn[14336,256]{1,0} parameter(3)
  %a = f32[1]{0} parameter(4)
  %xf = f8e4m3fn[16384,4096]{1,0} parameter(5)
  %wf = f8e4m3fn[4096,14336]{1,0} parameter(6)
  %s = bf16[] parameter(7)
  %q = bf16[2,8192,32,128]{3,2,1,0} parameter(8)
  %kv = bf16[2,8192,8,128]{3,2,1,0} parameter(9)
  %lhs = bf16[8,128,64]{2,1,0} parameter(10)
  %rhs = bf16[8,64,256]{2,1,0} parameter(11)
  %g = bf16[1024,14336]{1,0} parameter(12)
  %m = s32[4,4]{1,0} parameter(13)
  %te_gemm = (bf16[2,8192,14336]{2,1,0}, u8[41419008]{0}) custom-call(%x, %xs, %w, %ws, %a), custom_call_target="te_gemm_v2_ffi", operand_layout_constraints={f4e2m1fn[2,8192,4096]{2,1,0}, f8e4m3fn[2,8192,256]{2,1,0}, f4e2m1fn[14336,4096]{1,0}, f8e4m3fn[14336,256]{1,0}, f32[1]{0}}, api_version=API_VERSION_TYPED_FFI, backend_config={config = {collective_op = 0 : i64, lhs_axis_boundary = 2 : i64, lhs_transposed = false, rhs_axis_boundary = 1 : i64, rhs_transposed = true, scaling_mode = 4 : i64, use_split_accumulator = false}}
  %y = bf16[2,8192,14336]{2,1,0} get-tuple-element(%te_gemm), index=0
  %gemm_fusion = bf16[16384,14336]{1,0} fusion(%xf, %wf, %s), kind=kCustom, calls=%fp8_gemm, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %batched = bf16[8,128,256]{2,1,0} fusion(%lhs, %rhs), kind=kCustom, calls=%bf16_batched
  %loop = bf16[16384,14336]{1,0} fusion(%gemm_fusion), kind=kLoop, calls=%scale
  %attn = (bf16[2,8192,32,128]{3,2,1,0}, f32[2,8192,32,1]{3,2,1,0}, u8[0]{0}) custom-call(%q, %kv, %kv), custom_call_target="te_fused_attn_forward_ffi", api_version=API_VERSION_TYPED_FFI, backend_config={attn_heads = 32 : i64, input_batch = 2 : i64, kv_max_seqlen = 8192 : i64, mask_type = 3 : i64, num_gqa_groups = 8 : i64, q_max_seqlen = 8192 : i64, qk_head_dim = 128 : i64, v_head_dim = 128 : i64}
  %gather = ((bf16[1024,14336]{1,0}), bf16[4096,14336]{1,0}) all-gather-start(%g), channel_id=1, replica_groups=mesh['data'=1,'fsdp'=4] {'fsdp'}, dimensions={0}
  %gathered = bf16[4096,14336]{1,0} all-gather-done(%gather)
  %reduced = s32[4,4]{1,0} all-reduce-start(%m), channel_id=2, replica_groups=[2,2]<=[4], to_apply=%add
  %unknown = f32[1]{0} custom-call(%a), custom_call_target="SomeVendorKernel"
  ROOT %out = bf16[2,8192,14336]{2,1,0} get-tuple-element(%te_gemm), index=0
}
"""  # noqa: E501  HLO text as XLA prints it: one instruction a line, however long
MLP_GEMM_FLOPS = 2 * 16384 * 14336 * 4096  # 2 M N K: 2 x 8192 tokens, MLP width 14336, hidden 4096


def _classified() -> dict[str, kernels.Kernel]:
  return {k.name: k for k in kernels.kernels(CLASSIFIED_HLO)}


def test_te_s_nvfp4_gemm_is_an_fp4_gemm_of_2mnk_flops_from_its_layout_attributes():
  gemm = _classified()["te_gemm"].work
  assert gemm.math is Math.FP4_GEMM and gemm.gemm_dims == (16384, 14336, 4096) and gemm.flops == MLP_GEMM_FLOPS


def test_an_fp8_dot_fused_by_xla_is_an_fp8_gemm_and_a_batched_bf16_dot_folds_its_batch_into_m():
  found = _classified()
  assert found["gemm_fusion"].work.math is Math.FP8_GEMM and found["gemm_fusion"].work.flops == MLP_GEMM_FLOPS
  assert found["batched"].work.math is Math.BF16_GEMM and found["batched"].work.gemm_dims == (8 * 128, 256, 64)
  assert found["loop"].work.math is Math.ELEMENTWISE and found["loop"].work.flops == 0


def test_an_elementwise_fusion_counts_one_instruction_per_element_of_each_fused_op():
  """work.lane_ops (what scripts/top_kernels.py sets against the SMs' lanes): each fused op's result elements, a
  reduce's input elements, an in-place update's update; parameters, constants and views nothing. GEMMs, TE's calls
  and collectives count none (the prediction prices those by their FLOPs or bytes)."""
  found = _by_name()
  assert found["amax"].work.lane_ops == 1024  # max over bf16[1,1024]: one op per element read
  assert found["start"].work.lane_ops == 1024  # a bf16[1,1024] row written into the bf16[32,1024] stack
  assert found["layer"].work.lane_ops == 1024  # the dynamic slice's row; its constant index counts nothing
  assert found["quantized"].work.lane_ops == 0 and found["gemm"].work.lane_ops == 0
  classified = _classified()
  assert classified["loop"].work.lane_ops == 16384 * 14336  # one negate per element
  assert classified["gemm_fusion"].work.lane_ops == 0


def test_te_s_causal_fused_attention_counts_half_of_qk_and_pv():
  attention = _classified()["attn"].work
  assert attention.math is Math.ATTENTION
  assert attention.flops == 2 * 2 * 32 * 8192 * 8192 * (128 + 128) // 2  # forward: QK^T and PV, causal half


def test_collectives_count_ring_bytes_over_their_group_and_unknown_calls_stay_unclassified():
  found = _classified()
  assert found["gather"].work.math is Math.COLLECTIVE and found["gather"].work.group == 4
  assert found["gather"].work.wire_bytes == 1024 * 14336 * 2 * 3  # all-gather: (n-1) x the shard
  assert found["reduced"].work.group == 2 and found["reduced"].work.wire_bytes == 2 * 64 * 1 // 2  # 2(n-1)/n
  assert "gathered" not in found
  assert found["unknown"].work.math is Math.UNCLASSIFIED and found["unknown"].bytes == 8


def test_net_by_group_rows_sum_to_the_difference_of_the_totals():
  ours = kernels.kernels(HLO)
  other = [k for k in ours if k.name not in ("amax", "gemm")]
  rows = kernels.net_by_group(ours, other)
  assert sum(row.net_bytes for row in rows) == kernels.total_bytes(ours) - kernels.total_bytes(other)
  assert [row.group for row in rows] == ["elsewhere, TransformerEngine kernels", "elsewhere, XLA kernels"]
