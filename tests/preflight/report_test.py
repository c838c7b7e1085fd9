# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The pre-flight's fit: a step fits when its peak is within the share of the GPU jax may allocate (75% by default,
XLA_PYTHON_CLIENT_MEM_FRACTION when set), not within the whole GPU."""

from __future__ import annotations

import dataclasses

import pytest

from MaxText.preflight import kernels as kernels_lib
from MaxText.preflight import library, report
from MaxText.preflight.targets import TARGETS


@dataclasses.dataclass
class _Analysis:
  """What XLA's memory analysis of a compiled step reports (the fields report.Memory reads)."""

  argument_size_in_bytes: int
  output_size_in_bytes: int = 0
  alias_size_in_bytes: int = 0
  temp_size_in_bytes: int = 0
  generated_code_size_in_bytes: int = 0


@dataclasses.dataclass
class _Compiled:
  analysis: _Analysis

  def memory_analysis(self) -> _Analysis:
    return self.analysis


def _memory(peak_share: float) -> report.Memory:
  """report.Memory of a step whose peak is `peak_share` of a B200, judged with the fraction the pre-flight reads."""
  b200 = TARGETS["b200"]
  compiled = _Compiled(_Analysis(argument_size_in_bytes=int(peak_share * b200.memory_bytes)))
  return report.Memory.of(compiled, b200, library.mem_fraction())


def test_a_step_needing_90_percent_of_the_gpu_does_not_fit_jaxs_default_share(monkeypatch):
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  memory = _memory(0.90)
  assert memory.fraction == pytest.approx(0.75)
  assert not memory.fits and memory.margin < 0
  assert _memory(0.70).fits


@pytest.mark.parametrize(("fraction", "fits"), [("0.95", True), ("0.85", False)])
def test_the_fit_follows_xla_python_client_mem_fraction(monkeypatch, fraction, fits):
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", fraction)
  memory = _memory(0.90)
  assert memory.fraction == pytest.approx(float(fraction))
  assert memory.fits is fits


def test_the_overhead_rows_sum_to_the_total_and_say_how_kernels_were_matched():
  """The pre-flight used to list whole kernels that differed (2,348.9 MB, 1,409.3 MB, ... under a +272.1 MB
  total); now each row is a group's net bytes and the rows add up to the total."""
  from MaxText.preflight.classify import Work  # pylint: disable=import-outside-toplevel

  def kernel(name: str, nbytes: int, op_name: str, target: str = "") -> kernels_lib.Kernel:
    return kernels_lib.Kernel(name=name, opcode="fusion:kInput", target=target, bytes=nbytes, op_name=op_name,
                              runs=32, work=Work())

  bare = [kernel("mul", 2_000_000, "jit(train_step)/transpose(jvp())/while/body/mul"),
          kernel("q", 5_000_000, "jit(train_step)/jvp()/while/body/TeDotGeneral_nvfp4/x", "te_dbias_quantize_ffi")]
  ours = [kernel("check", 2_300_000, "jit(train_step)/transpose(jvp())/while/body/TeDotGeneral_nvfp4/reduce_max"),
          kernel("amax", 400_000, "jit(train_step)/jvp()/while/body/TeDotGeneral_nvfp4/reduce_max"), bare[1]]
  overhead = report.Overhead.between(ours, bare)
  lines = report.overhead_lines(overhead, "against the bare step")
  rows = [float(line.split()[0].replace(",", "")) for line in lines[3:]]
  assert overhead.added_bytes == 32 * 700_000 and sum(rows) == pytest.approx(overhead.added_bytes / 1e6)
  assert lines[3:] == ["         +12.8  forward, XLA kernels", "          +9.6  backward, XLA kernels"]
  assert "matched by phase of the step and origin" in lines[2]


def test_the_prediction_lines_give_step_times_speedups_and_the_ceiling():
  from MaxText.preflight import predict  # pylint: disable=import-outside-toplevel

  def prediction(mlp: float, rest: float) -> predict.Prediction:
    seconds = dict.fromkeys(predict.Group, 0.0)
    seconds.update({predict.Group.MLP_GEMMS: mlp, predict.Group.ELEMENTWISE: rest})
    bound = {group: s / 2 for group, s in seconds.items()}
    return predict.Prediction(seconds=seconds, bytes=dict.fromkeys(predict.Group, 0),
                              kernels=dict.fromkeys(predict.Group, 0), flops={}, model_flops=1e15, bound=bound,
                              communication_range=(0.0, 0.05))

  lines = report.prediction_lines(prediction(0.1, 0.2), {"fp8": prediction(0.3, 0.2)}, TARGETS["gb300"], 4)
  text = "\n".join(lines)
  assert "predicted step time on 4 x NVIDIA GB300 (the calibrated step" in lines[0]
  # the step, its interval (no communication exposed at the point, 50 ms when none is hidden), the roofline
  assert "  this run          300.0    300.0-350.0        150.0        3,333  2,857-3,333         1.67x" in text
  assert "  MLP GEMMs           100.0      300.0" in text
  assert "Amdahl ceiling over fp8 (this run's MLP GEMMs free): 2.50x" in text
  assert "not seen by the prediction" in lines[-1]


def test_a_periodic_tap_is_reported_on_its_steps_and_averaged_over_its_interval():
  """The audit at interval 100 adding 1,500 MB on its steps adds 15 MB per step on average; the fraction of TE's
  bytes is given both ways, and the prediction says the tap's cost on the mean step."""
  from MaxText.precision.taps import AUDIT  # pylint: disable=import-outside-toplevel
  from MaxText.preflight import predict  # pylint: disable=import-outside-toplevel
  from MaxText.preflight.classify import Work  # pylint: disable=import-outside-toplevel
  from MaxText.preflight.programs import ActiveTap  # pylint: disable=import-outside-toplevel

  te = kernels_lib.Kernel(name="q", opcode="custom-call", target="te_dbias_quantize_ffi", bytes=100_000_000,
                          op_name="jit(train_step)/jvp()/TeDotGeneral_nvfp4/x", runs=1, work=Work())
  audit = dataclasses.replace(te, name="audit", target="", opcode="fusion:kInput", bytes=1_500_000_000)
  tap = report.TapCost(tap=ActiveTap(AUDIT, 100),
                       step_bytes=1_500_000_000, seconds=0.2)
  overhead = report.Overhead.between([te, audit], [te], (tap,))
  assert overhead.fraction == pytest.approx(15.0) and overhead.mean_fraction == pytest.approx(0.15)
  text = "\n".join(report.overhead_lines(overhead, "against the bare step"))
  assert "the audit (nvfp4_audit_interval=100): +1,500.0 MB on the steps it runs, +15.0 MB per step" in text
  assert "per step on average: +15.0 MB, added_bytes_fraction 0.1500" in text
  assert overhead.as_dict()["mean_added_bytes_fraction"] == pytest.approx(0.15)

  seconds = dict.fromkeys(predict.Group, 0.0)
  seconds[predict.Group.ELEMENTWISE] = 0.302
  run = predict.Prediction(seconds=seconds, bytes=dict.fromkeys(predict.Group, 0),
                           kernels=dict.fromkeys(predict.Group, 0), flops={})
  lines = report.prediction_lines(run, {}, TARGETS["b200"], 8, (tap,))
  assert any("the audit (nvfp4_audit_interval=100): 200.0 ms more on the steps it runs; x1.0067 on the mean step"
             in line for line in lines)


def test_a_compared_program_that_does_not_fit_is_marked_in_its_row():
  """Issue 36: a prediction for a program that would not run as compiled says so (the JSON's prediction.fits)."""
  from MaxText.preflight import predict  # pylint: disable=import-outside-toplevel
  from MaxText.preflight.classify import Math, Work  # pylint: disable=import-outside-toplevel

  b200 = TARGETS["b200"]
  kernel = kernels_lib.Kernel(name="k", opcode="fusion", target="", bytes=10**9, op_name="",
                              work=Work(math=Math.ELEMENTWISE))
  step = predict.predict([kernel], b200, frozenset({14336}))
  fits = report.Memory.of(_Compiled(_Analysis(argument_size_in_bytes=int(0.5 * b200.memory_bytes))), b200)
  over = report.Memory.of(_Compiled(_Analysis(argument_size_in_bytes=int(0.9 * b200.memory_bytes))), b200)
  lines = report.prediction_lines(step, {"fp8": step, "bf16": step}, b200, 8, (),
                                  {"this run": fits, "fp8": fits, "bf16": over})
  rows = {line.split()[0]: line for line in lines[2:5]}
  assert "does NOT fit" not in rows["this"] + rows["fp8"]
  assert rows["bf16"].endswith(f"does NOT fit: {report.gib(over.peak)} > {report.gib(over.device)}, would not run "
                               "as compiled")
