# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The elementwise group split by origin and phase (MaxText.preflight.origins): on hand-built kernels and on HLO text
in the form XLA's GPU compiler printed the Llama 3 8B step with FP8 attention projections (issue 36): a guard's
max|.| fused into the SwiGLU activation's kernel, TE's FP8 quantize calls left without metadata in the layer loop,
TE's NVFP4 quantize beside them; and the prediction's and report's rows summing to the elementwise group."""

from __future__ import annotations

import pytest

from MaxText.preflight import calibration, kernels, predict, report
from MaxText.preflight.classify import Math, Work
from MaxText.preflight.origins import Origin, origin, split_key
from MaxText.preflight.targets import TARGETS

LOOP = "jit(train_step)/jvp()/while/body/eval_jaxpr"


def _kernel(op_name: str, target: str = "", results: tuple[str, ...] = (), nbytes: int = 8 * 10**9,
            runs: int = 1) -> kernels.Kernel:
  return kernels.Kernel(name="k", opcode="custom-call" if target else "fusion:kLoop", target=target, bytes=nbytes,
                        op_name=op_name, runs=runs, work=Work(math=Math.ELEMENTWISE), results=results)


@pytest.mark.parametrize(("op_name", "target", "results", "expected"), [
    (f"{LOOP}/TeDotGeneral_nvfp4/nvfp4_guard/reduce_max", "", (), Origin.GUARD),  # the guard's scope, inside TE's
    (f"{LOOP}/TeDotGeneral_nvfp4/nvfp4_tap/cond/reduce_max", "", (), Origin.TAPS),
    ("jit(step)/transpose(jvp(nvfp4_guard))/mul", "", (), Origin.GUARD),  # jax folds an outermost scope in
    (f"{LOOP}/TeDotGeneral_nvfp4/custom_partitioning", "te_dbias_quantize_ffi", ("f4e2m1fn", "f8e4m3fn", "f32"),
     Origin.TE_NVFP4),  # NVFP4 writes FP4 data and E4M3 scales: FP4 decides
    (f"{LOOP}/TeDotGeneral_nvfp4/custom_partitioning", "te_rht_amax_ffi", ("f32",), Origin.TE_NVFP4),
    ("", "te_dbias_quantize_ffi", ("f8e4m3fn", "f32", "bf16"), Origin.FP8),  # TE's current scaling, no metadata
    # TE's hybrid FP8 recipe quantizes gradients to E5M2: FP8 as well, not NVFP4
    ("", "te_dbias_quantize_ffi", ("f8e5m2", "f32", "bf16"), Origin.FP8),
    (f"{LOOP}/TeDotGeneral_fp8/custom_partitioning", "te_dact_dbias_quantize_ffi", ("f8e5m2", "f32", "bf16"),
     Origin.FP8),
    (f"{LOOP}/TeDotGeneral_fp8/custom_partitioning", "", (), Origin.FP8),  # the amax TE leaves to XLA
    (f"{LOOP}/Fp8DirectDotGeneralOp/convert_element_type", "", (), Origin.FP8),  # maxtext's fp8
    (f"{LOOP}/TeDotGeneral_nvfp4/custom_partitioning", "", (), Origin.TE_NVFP4),
    (f"{LOOP}/nvfp4_guardian/mul", "", (), Origin.OTHER),  # a scope matches a whole name-stack component only
    # dx of wi_0 plus dx of wi_1: the sum jax makes lands in the guard's scope in the 8B step; it is no guard's work
    ("jit(train_step)/transpose(jvp())/while/body/eval_jaxpr/checkpoint/TeDotGeneral_nvfp4/nvfp4_guard/add_any", "",
     (), Origin.OTHER),
    (f"{LOOP}/jit(silu)/mul", "", (), Origin.OTHER),
    # The plugin's own quantizer (emulated and fused backends): its GEMM module, and its jits under a MoE layer
    (f"{LOOP}/Nvfp4DotGeneral/jit(_codes)/or", "", (), Origin.NVFP4_OURS),
    (f"{LOOP}/checkpoint/Nvfp4DotGeneral/mul", "", (), Origin.NVFP4_OURS),
    (f"{LOOP}/RoutedMoE_0/jit(_block_scaled)/reduce_max", "", (), Origin.NVFP4_OURS),
    (f"{LOOP}/Nvfp4DotGeneral/nvfp4_guard/reduce_max", "", (), Origin.GUARD),
    (f"{LOOP}/jit(_codes_of_something)/or", "", (), Origin.OTHER),
])
def test_each_origin_from_the_name_stack_and_te_s_result_types(op_name, target, results, expected):
  assert origin(_kernel(op_name, target, results)) is expected


# A layer loop cut down from the 8B FP8-attention step on 4 x GB300: the SwiGLU product (bf16[2,8192,14336]) and the
# guard's partial max|.| (bf16[28672]) in one multi-output fusion that XLA names after the reduction; TE's FP8
# quantize of x with no metadata; TE's NVFP4 quantize.
HLO = f"""HloModule jit_train_step, num_partitions=4

%max (a: bf16[], b: bf16[]) -> bf16[] {{
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %maximum = bf16[] maximum(%a, %b)
}}

%fused_multiply_reduce (p0: bf16[2,8192,14336], p1: bf16[2,8192,14336]) -> (bf16[28672], bf16[2,8192,14336]) {{
  %p0 = bf16[2,8192,14336]{{2,1,0}} parameter(0)
  %p1 = bf16[2,8192,14336]{{2,1,0}} parameter(1)
  %act = bf16[2,8192,14336]{{2,1,0}} multiply(%p0, %p1), metadata={{op_name="{LOOP}/mul"}}
  %abs = bf16[2,8192,14336]{{2,1,0}} abs(%act), metadata={{op_name="{LOOP}/TeDotGeneral_nvfp4/nvfp4_guard/abs"}}
  %c = bf16[] constant(-inf)
  %part = bf16[28672]{{0}} reduce(%abs, %c), dimensions={{2}}, to_apply=%max, metadata={{op_name="{LOOP}/TeDotGeneral_nvfp4/nvfp4_guard/reduce_max"}}
  ROOT %out = (bf16[28672]{{0}}, bf16[2,8192,14336]{{2,1,0}}) tuple(%part, %act)
}}

%fused_reduce (q0: bf16[28672]) -> bf16[] {{
  %q0 = bf16[28672]{{0}} parameter(0)
  %c.1 = bf16[] constant(-inf)
  ROOT %r = bf16[] reduce(%q0, %c.1), dimensions={{0}}, to_apply=%max, metadata={{op_name="{LOOP}/TeDotGeneral_nvfp4/nvfp4_guard/reduce_max"}}
}}

%body (arg: (s32[], bf16[2,8192,14336], bf16[2,8192,4096])) -> (s32[], bf16[2,8192,14336], bf16[2,8192,4096]) {{
  %arg = (s32[], bf16[2,8192,14336]{{2,1,0}}, bf16[2,8192,4096]{{2,1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %h = bf16[2,8192,14336]{{2,1,0}} get-tuple-element(%arg), index=1
  %x = bf16[2,8192,4096]{{2,1,0}} get-tuple-element(%arg), index=2
  %swiglu = (bf16[28672]{{0}}, bf16[2,8192,14336]{{2,1,0}}) fusion(%h, %h), kind=kInput, calls=%fused_multiply_reduce, metadata={{op_name="{LOOP}/TeDotGeneral_nvfp4/nvfp4_guard/reduce_max"}}
  %partial = bf16[28672]{{0}} get-tuple-element(%swiglu), index=0
  %verdict = bf16[] fusion(%partial), kind=kInput, calls=%fused_reduce, metadata={{op_name="{LOOP}/TeDotGeneral_nvfp4/nvfp4_guard/reduce_max"}}
  %fp8_x = (f8e4m3fn[2,8192,4096]{{2,1,0}}, f32[1]{{0}}) custom-call(%x), custom_call_target="te_dbias_quantize_ffi"
  %fp4_h = (f4e2m1fn[2,8192,14336]{{2,1,0}}, f8e4m3fn[2,8192,896]{{2,1,0}}) custom-call(%h), custom_call_target="te_dbias_quantize_ffi", metadata={{op_name="{LOOP}/TeDotGeneral_nvfp4/custom_partitioning"}}
  ROOT %next = (s32[], bf16[2,8192,14336]{{2,1,0}}, bf16[2,8192,4096]{{2,1,0}}) tuple(%i, %h, %x)
}}

%cond (arg.1: (s32[], bf16[2,8192,14336], bf16[2,8192,4096])) -> pred[] {{
  %arg.1 = (s32[], bf16[2,8192,14336]{{2,1,0}}, bf16[2,8192,4096]{{2,1,0}}) parameter(0)
  %i.1 = s32[] get-tuple-element(%arg.1), index=0
  %n = s32[] constant(32)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}}

ENTRY %main (h0: bf16[2,8192,14336], x0: bf16[2,8192,4096]) -> bf16[2,8192,14336] {{
  %h0 = bf16[2,8192,14336]{{2,1,0}} parameter(0)
  %x0 = bf16[2,8192,4096]{{2,1,0}} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[2,8192,14336]{{2,1,0}}, bf16[2,8192,4096]{{2,1,0}}) tuple(%zero, %h0, %x0)
  %loop = (s32[], bf16[2,8192,14336]{{2,1,0}}, bf16[2,8192,4096]{{2,1,0}}) while(%init), condition=%cond, body=%body, metadata={{op_name="jit(train_step)/jvp()/while"}}, backend_config={{"known_trip_count":{{"n":"32"}}}}
  ROOT %result = bf16[2,8192,14336]{{2,1,0}} get-tuple-element(%loop), index=1
}}
"""  # noqa: E501  HLO text as XLA prints it: one instruction a line, however long


def _found() -> dict[str, kernels.Kernel]:
  return {k.name: k for k in kernels.kernels(HLO)}


def test_a_fusion_is_attributed_to_its_largest_output_not_to_the_reduction_xla_names_it_after():
  """The SwiGLU kernel (805 MB a run) is XLA's; the guard's own kernel, the last reduction, is the guard's."""
  found = _found()
  assert found["swiglu"].op_name.endswith("nvfp4_guard/reduce_max")  # what XLA's metadata says
  assert split_key(found["swiglu"]) == (Origin.OTHER, "forward")
  assert split_key(found["verdict"]) == (Origin.GUARD, "forward")


def test_a_kernel_without_metadata_takes_the_phase_of_the_loop_that_runs_it():
  """TE's FP8 quantize calls carry no op_name in the compiled step; the forward layer loop's op_name says their
  phase, and their FP8 results their origin."""
  found = _found()
  assert found["fp8_x"].op_name == ""
  assert split_key(found["fp8_x"]) == (Origin.FP8, "forward")
  assert split_key(found["fp4_h"]) == (Origin.TE_NVFP4, "forward")


def test_the_split_sums_to_the_elementwise_group_also_for_the_mean_step_and_in_the_report():
  gb300 = TARGETS["gb300"]
  found = kernels.kernels(HLO)
  prediction = predict.predict(found, gb300, frozenset({14336}))
  elementwise = prediction.seconds[predict.Group.ELEMENTWISE]
  assert elementwise > 0 and sum(prediction.elementwise_seconds.values()) == pytest.approx(elementwise, rel=1e-12)
  assert sum(prediction.elementwise_bytes.values()) == prediction.bytes[predict.Group.ELEMENTWISE]
  xla = [k for k in found if k.name in ("swiglu", "lt")]  # the activation, and the loop condition's compare
  assert prediction.elementwise_seconds[(Origin.OTHER, "forward")] == pytest.approx(
      sum(k.step_bytes for k in xla) / (gb300.peaks.hbm * calibration.factors_for(gb300).memory_efficiency), rel=1e-12)
  without_guard = predict.predict([k for k in found if k.name != "verdict"], gb300, frozenset({14336}))
  mean = predict.averaged(prediction, [(without_guard, 10)])
  assert sum(mean.elementwise_seconds.values()) == pytest.approx(mean.seconds[predict.Group.ELEMENTWISE], rel=1e-12)
  rows = [row for row in prediction.as_dict()["elementwise_by_origin"] if row["seconds"]]
  assert {(row["origin"], row["phase"]) for row in rows} == {
      ("XLA's other kernels", "forward"), ("non-finite guard", "forward"), ("FP8 quantization", "forward"),
      ("TE NVFP4 quantize, RHT amax", "forward")}
  lines = report.elementwise_lines({"this run": prediction, "other": without_guard}, 4)
  cells = [float(line.split()[-2]) for line in lines[1:]]  # this run's column
  assert len(lines) == 5 and sum(cells) == pytest.approx(elementwise * 1e3, abs=1e-3)
