# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The calibrated step (MaxText.preflight.calibration) on hand-built kernels, against arithmetic done here: the
cited library shares and the fitted constants applied per kernel, wave and tile quantization, a launch gap per
kernel run, and communication hidden only behind its own computation's compute (XLA's latency-hiding scheduler),
with the interval from all hidden to none; the kernels' computation and asynchrony as read from compiled HLO; the
records the fit reads; every factor named with its basis."""

from __future__ import annotations

import dataclasses

import pytest

from MaxText.preflight import calibration, kernels
from MaxText.preflight.calibration import Basis
from MaxText.preflight.classify import Math, Work
from MaxText.preflight.kernels import Kernel
from MaxText.preflight.targets import TARGETS

GB300 = TARGETS["gb300"]
FACTORS = calibration.Factors(gemm_scale=0.9, memory_efficiency=0.8, launch_seconds=3e-6)


def _kernel(math: Math, *, flops: int = 0, nbytes: int = 0, runs: int = 1, wire: int = 0, group: int = 1,
            dims: tuple[int, int, int] | None = None, computation: str = "entry", asynchronous: bool = False) -> Kernel:
  return Kernel(name="k", opcode="", target="", bytes=nbytes, op_name="", runs=runs, computation=computation,
                asynchronous=asynchronous,
                work=Work(math=math, flops=flops, wire_bytes=wire, group=group, gemm_dims=dims))


def test_tiles_fill_the_last_wave_or_pay_for_it():
  """128 x 256 tiles, one per SM at a time: 152 tiles on GB300's 152 SMs are one full wave; one tile more is a second
  wave for one tile (152 / 304 of the work); a dim that is not a multiple of the tile pads its last tile."""
  assert calibration.tile_efficiency(128 * 8, 256 * 19, 152) == pytest.approx(1.0)  # 152 tiles
  assert calibration.tile_efficiency(128 * 153, 256, 152) == pytest.approx(153 / 304)
  assert calibration.tile_efficiency(64, 256 * 152, 152) == pytest.approx(0.5)  # half of each tile's rows
  # the library picks the orientation: 256 x 128 tiles cover M = 256 x 152 in one wave
  assert calibration.tile_efficiency(256 * 152, 128, 152) == pytest.approx(1.0)
  # fewer tiles than SMs: K is split, at least 512 each: 16 tiles x 8 splits of K = 4096 fill 128 of the 152 SMs
  assert calibration.tile_efficiency(128, 256 * 16, 152, k=4096) == pytest.approx(128 / 152)
  assert calibration.tile_efficiency(128, 256 * 16, 152, k=256) == pytest.approx(16 / 152)  # too short to split


def test_a_gemm_runs_at_the_peak_times_the_cited_share_the_fitted_scale_and_its_tiles():
  m, n, k = 128 * 8, 256 * 19 * 2, 8192  # two full waves
  flops = 2 * m * n * k
  for math, peak in ((Math.FP8_GEMM, 5e15), (Math.FP4_GEMM, 15e15), (Math.BF16_GEMM, 2.5e15)):
    gemm = _kernel(math, flops=flops, nbytes=10**6, dims=(m, n, k))
    share = calibration.LIBRARY[10][math].value
    assert calibration.kernel_seconds(gemm, GB300, FACTORS) == pytest.approx(flops / (peak * share * 0.9)), math
  attention = _kernel(Math.ATTENTION, flops=10**15)
  assert calibration.kernel_seconds(attention, GB300, FACTORS) == pytest.approx(
      10**15 / (2.5e15 * calibration.LIBRARY[10][Math.ATTENTION].value * 0.9))
  thin = _kernel(Math.BF16_GEMM, flops=2 * 16 * 4096 * 4096, nbytes=4096 * 4096 * 2, dims=(16, 4096, 4096))
  assert calibration.kernel_seconds(thin, GB300, FACTORS) > thin.work.flops / (2.5e15 * 0.776 * 0.9)  # its tiles
  assert calibration.kernel_seconds(thin, GB300, FACTORS) == pytest.approx(4096 * 4096 * 2 / (8e12 * 0.8))


def test_collectives_run_at_the_cited_bus_bandwidth_of_their_link():
  inside = _kernel(Math.COLLECTIVE, wire=10**9, group=64)
  beyond = _kernel(Math.COLLECTIVE, wire=10**9, group=128)
  assert calibration.kernel_seconds(inside, GB300, FACTORS) == pytest.approx(1e9 / (0.9e12 * 0.755))
  assert calibration.kernel_seconds(beyond, GB300, FACTORS) == pytest.approx(1e9 / (0.1e12 * 0.92))


def test_communication_hides_only_behind_its_own_computations_compute_and_the_interval_spans_none_to_all():
  """The layer loop's asynchronous all-gather (40 ms) behind the loop's 30 ms of compute exposes 10 ms; a
  synchronous all-reduce in the entry (5 ms) hides behind nothing, though the entry has 50 ms of compute; an
  asynchronous one in the entry (20 ms) hides there. Interval: all 65 ms hidden behind 80 ms of compute, or none."""
  hbm = 8e12 * 0.8
  nvlink = 0.9e12 * 0.755
  body_compute = _kernel(Math.ELEMENTWISE, nbytes=int(0.003 * hbm), runs=10, computation="body")
  body_gather = _kernel(Math.COLLECTIVE, wire=int(0.004 * nvlink), group=4, runs=10, computation="body",
                        asynchronous=True)
  entry_compute = _kernel(Math.ELEMENTWISE, nbytes=int(0.05 * hbm))
  entry_sync = _kernel(Math.COLLECTIVE, wire=int(0.005 * nvlink), group=4)
  entry_async = _kernel(Math.COLLECTIVE, wire=int(0.02 * nvlink), group=4, asynchronous=True)
  step = calibration.step([body_compute, body_gather, entry_compute, entry_sync, entry_async], GB300, FACTORS)
  assert step.compute == pytest.approx(0.08, rel=1e-6)
  assert step.communication == pytest.approx(0.065, rel=1e-6)
  assert step.exposed == pytest.approx(0.010 + 0.005, rel=1e-6)
  assert step.launches == pytest.approx(23 * 3e-6)  # 10 + 10 + 1 + 1 + 1 runs
  assert step.step_seconds == pytest.approx(0.08 + 23 * 3e-6 + 0.015, rel=1e-6)
  low, high = step.interval
  assert low == pytest.approx(0.08 + 23 * 3e-6, rel=1e-6) and high == pytest.approx(0.08 + 23 * 3e-6 + 0.065, rel=1e-6)


def test_the_compiled_program_says_which_computation_runs_a_kernel_and_whether_it_is_asynchronous():
  hlo = """HloModule m, num_partitions=4

%add (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %sum = bf16[] add(%a, %b)
}

%wrapped_scatter (w: bf16[4096,1024]) -> bf16[1024,1024] {
  %w = bf16[4096,1024]{1,0} parameter(0)
  ROOT %rs = bf16[1024,1024]{1,0} reduce-scatter(%w), channel_id=3, replica_groups=mesh['fsdp'=4] {'fsdp'}, dimensions={0}, to_apply=%add
}

%body (p: (s32[], bf16[1024,1024])) -> (s32[], bf16[1024,1024]) {
  %p = (s32[], bf16[1024,1024]{1,0}) parameter(0)
  %w = bf16[1024,1024]{1,0} get-tuple-element(%p), index=1
  %ag = ((bf16[1024,1024]{1,0}), bf16[4096,1024]{1,0}) all-gather-start(%w), channel_id=1, replica_groups=mesh['fsdp'=4] {'fsdp'}, dimensions={0}
  %agd = bf16[4096,1024]{1,0} all-gather-done(%ag)
  %start = ((bf16[4096,1024]{1,0}), bf16[1024,1024]{1,0}) async-start(%agd), calls=%wrapped_scatter
  %done = bf16[1024,1024]{1,0} async-done(%start)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], bf16[1024,1024]{1,0}) tuple(%i, %done)
}

%cond (c: (s32[], bf16[1024,1024])) -> pred[] {
  %c = (s32[], bf16[1024,1024]{1,0}) parameter(0)
  %j = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(32)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (x: bf16[1024,1024]) -> bf16[1024,1024] {
  %x = bf16[1024,1024]{1,0} parameter(0)
  %ar = bf16[1024,1024]{1,0} all-reduce(%x), channel_id=2, replica_groups=mesh['fsdp'=4] {'fsdp'}, to_apply=%add
  %zero = s32[] constant(0)
  %init = (s32[], bf16[1024,1024]{1,0}) tuple(%zero, %ar)
  %loop = (s32[], bf16[1024,1024]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"32"}}
  ROOT %out = bf16[1024,1024]{1,0} get-tuple-element(%loop), index=1
}
"""  # noqa: E501  HLO text as XLA prints it: one instruction a line, however long
  found = {k.name: k for k in kernels.kernels(hlo)}
  assert (found["ar"].computation, found["ar"].asynchronous) == ("main", False)
  assert (found["ag"].computation, found["ag"].asynchronous, found["ag"].runs) == ("body", True, 32)
  # a collective wrapped in an async start runs in its caller's schedule, overlapping it
  assert (found["rs"].computation, found["rs"].asynchronous, found["rs"].runs) == ("body", True, 32)
  assert found["lt"].computation == "cond" and not found["lt"].asynchronous


def test_records_keep_what_the_calibrated_step_reads():
  found = [_kernel(Math.FP8_GEMM, flops=2 * 4096**3, nbytes=3 * 4096**2, dims=(4096, 4096, 4096), runs=32,
                   computation="body"),
           _kernel(Math.FP8_GEMM, flops=2 * 4096**3, nbytes=3 * 4096**2, dims=(4096, 4096, 4096), runs=32,
                   computation="body"),
           _kernel(Math.COLLECTIVE, wire=10**8, group=128, runs=32, computation="body", asynchronous=True),
           _kernel(Math.ELEMENTWISE, nbytes=10**9)]
  rows = calibration.records(found)
  assert len(rows) == 3 and rows[0]["runs"] == 64  # the two identical GEMMs merged
  again = calibration.step(calibration.from_records(rows), GB300, FACTORS)
  direct = calibration.step(found, GB300, FACTORS)
  assert dataclasses.replace(again, seconds_by_kernel=()) == dataclasses.replace(direct, seconds_by_kernel=())


def test_every_factor_is_named_with_its_basis_and_source_and_at_most_four_are_fitted():
  table = calibration.factors_for(GB300).table(GB300)
  assert {f.basis for f in table} >= {Basis.CITED, Basis.FIRST_PRINCIPLES, Basis.FITTED}
  assert all(f.source and f.unit for f in table)
  assert 1 <= sum(f.basis is Basis.FITTED for f in table) <= 4
  assert {f.name for f in calibration.factors_for(TARGETS["h100"]).table(TARGETS["h100"])} >= {
      "library_fp8", "library_bf16", "library_attention"}
