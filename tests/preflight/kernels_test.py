# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""MaxText.preflight.kernels reads a compiled program as kernels with bytes: checked on HLO text in the form XLA's
GPU compiler prints it (the cases the Llama 3 8B step showed: a layer loop, in-place updates of the saved-layer
stacks, TE's calls wrapped in dynamic-slice fusions, async fusions, cuBLAS workspaces)."""

from __future__ import annotations

from MaxText.preflight import kernels

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
"""

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
