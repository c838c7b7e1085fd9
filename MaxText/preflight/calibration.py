# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The calibrated step: the roofline (MaxText.preflight.predict) with what it leaves out put back, factor by factor.

Why: a roofline at datasheet peaks bounds a step; it does not say how long one takes. NVIDIA's measured maxtext
steps are 1.4-1.7x the roofline's, and the gap is not one factor: GEMMs below their peak, memory-bound kernels
below the HBM's bandwidth, a launch gap per kernel, collectives below the link's rate, and communication that the
scheduler could not hide. Each of these is a `Factor` here with where its value comes from (`Basis`): cited (a
public figure, named), first-principles (worked out from the GPU's SM count and the kernel's shape), or fitted (to
a declared subset of NVIDIA's published maxtext figures by scripts/fit_prediction.py, which reports the held-out
figures beside the fitted ones; docs/prediction.md). No factor is set by hand to make a figure come out.

One kernel run, calibrated:
  GEMM:          max(FLOPs / (peak x library(math) x gemm_scale x tiles(M, N)), bytes / (HBM x memory_efficiency))
  attention:     FLOPs / (BF16 peak x library(attention) x gemm_scale), or its bytes as above when longer
  collective:    wire bytes / (link x its bus-bandwidth efficiency)
  anything else: bytes / (HBM x memory_efficiency)
plus `launch_seconds` for every kernel launched (runs per step x kernels).

`library(math)` is the share of the datasheet peak the GPU's GEMM library (cuBLASLt) or attention kernel (cuDNN)
reaches on large shapes in a published microbenchmark, per architecture and math type (`LIBRARY`, cited);
`gemm_scale` is what a training step's GEMMs reach of that (sustained clocks under a whole step's power, shapes
between the large ones), fitted.

`tiles(M, N, K)` is wave and tile quantization: a GEMM is cut into 128 x 256 output tiles, one per SM at a time, so a
GEMM whose tiles do not fill the last wave of SMs, or whose dims are not multiples of a tile, computes the padding
too: tiles = M x N x s / (waves x SMs x 128 x 256), waves = ceil(ceil(M/128) x ceil(N/256) x s / SMs), the better of
the two orientations (the library picks). s is the split of K a library makes when a GEMM has fewer tiles than SMs
(split-K: each SM takes a share of K, at least 512, the partial sums reduced after): s = min(SMs // tiles, K // 512),
at least 1.

Overlap follows XLA's latency-hiding scheduler: it overlaps an asynchronous collective (an all-gather, reduce-
scatter, all-reduce or permute started and finished apart, `Kernel.asynchronous`) with the kernels of the same
computation (the layer loop's body, the entry) that do not depend on it; it cannot move one across computations, and
a synchronous collective overlaps nothing. So the step's exposed communication, per computation C, is
  point:  synchronous(C) + max(0, asynchronous(C) - compute(C))   (each computation hides what its compute covers)
and the interval around it is
  low:    max(0, all communication - all compute)                   (everything hidden wherever it ran)
  high:   all communication                                         (nothing hidden)
The step is compute + launch gaps + exposed communication; the interval is the same with the low and high exposure.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import pathlib
from collections.abc import Iterable, Mapping

from MaxText.preflight.classify import Math, Work
from MaxText.preflight.kernels import Kernel
from MaxText.preflight.targets import Peaks, Target

__all__ = ["Basis", "Calibrated", "Factor", "Factors", "FITTED", "LIBRARY", "beyond_domain", "factors_for", "from_records",
           "kernel_seconds", "peak_of", "records", "step", "tile_efficiency"]

#: The fitted constants, written by scripts/fit_prediction.py --write (the fit, its subset and its hold-out are in
#: that file, and docs/prediction.md says them).
FITTED = pathlib.Path(__file__).with_name("calibration.json")
#: One SM's output tile of a GEMM (rows, columns): Blackwell's tcgen05 MMA runs 256 x 256 over a pair of SMs,
#: 128 x 256 each; Hopper's largest wgmma tile in cuBLAS is 128 x 256.
TILE = (128, 256)


class Basis(enum.StrEnum):
  """Where a factor's value comes from."""

  CITED = "cited"
  MEASURED = "measured"
  FIRST_PRINCIPLES = "first-principles"
  FITTED = "fitted"


@dataclasses.dataclass(frozen=True)
class Factor:
  """One named factor of the calibrated step: its value, its unit, where it comes from."""

  name: str
  value: float
  unit: str
  basis: Basis
  source: str

  def as_dict(self) -> dict[str, object]:
    return {"value": self.value, "unit": self.unit, "basis": self.basis.value, "source": self.source}


#: Cited: the share of a link's rate a large collective reaches (nccl-tests' bus bandwidth over the link's rate).
NVLINK_BUS_EFFICIENCY = Factor(
    "nvlink_bus_efficiency", 0.755, "of the NVLink rate each way", Basis.CITED,
    "nccl-tests all_reduce_perf, ring, 4 x GB200 of one tray, 8 GiB: 679.61 of 900 GB/s bus bandwidth "
    "(Azure/AI-benchmarking-guide, Azure_Results/ND_GB200_v6_results.md); a full NVL72 rack reaches 835-847 GB/s "
    "at 4-8 GiB with NVLink SHARP (coreweave/nccl-tests, the GB200 NVL72 Slurm script's run), which FSDP's "
    "all-gathers and reduce-scatters do not use")
NETWORK_BUS_EFFICIENCY = Factor(
    "network_bus_efficiency", 0.92, "of the NIC's rate each way", Basis.CITED,
    "NCCL's maintainers, NVIDIA/nccl-tests issue 290: 'For NDR @ 400Gbps you should see 46-48GB/s per NIC' (46 of "
    "50 GB/s)")
TILES = Factor("tiles", 1.0, "computed per GEMM", Basis.FIRST_PRINCIPLES,
               f"wave and tile quantization: {TILE[0]} x {TILE[1]} output tiles, one per SM at a time")
OVERLAP = Factor("overlap", 1.0, "computed per computation", Basis.FIRST_PRINCIPLES,
                 "XLA's latency-hiding scheduler: asynchronous collectives hidden behind their own computation's "
                 "compute, synchronous ones not; interval from all hidden to none")

_MAMF = ("maximum achievable matmul FLOPS (MAMF: the best of many large shapes, mamf-finder.py), stas00/ml-engineering, "
         "'When Is It Worth Upgrading GPUs?'")
_MAMF_FP4 = ("Stas Bekman's NVFP4 MAMF on B200 with torch 2.14 (6,624 TFLOPS, reported 2026-10-02, quoted in "
             "'Experiment: NVFP4 vs MXFP4 on decode-bound LLM inference'; the FP4 peak there is 9,000)")
#: Cited: the share of the dense datasheet peak the GEMM library and the fused attention reach on large shapes, by
#: compute capability major (9: Hopper, 10: Blackwell). One method for every math type (MAMF on B200 and H200);
#: GB200 and GB300 have no published MAMF: B200's shares (the same tensor cores; GB300's FP4 peak is 1.5x).
LIBRARY: dict[int, dict[Math, Factor]] = {
    10: {Math.FP4_GEMM: Factor("library_fp4", 0.736, "of the FP4 peak", Basis.CITED,
                               f"6,624 of 9,000 TFLOP/s on B200: {_MAMF_FP4}"),
         Math.FP8_GEMM: Factor("library_fp8", 0.763, "of the FP8 peak", Basis.CITED,
                               f"3,432.5 of 4,500 TFLOP/s on B200, {_MAMF}"),
         Math.BF16_GEMM: Factor("library_bf16", 0.776, "of the BF16 peak", Basis.CITED,
                                f"1,745.0 of 2,250 TFLOP/s on B200, {_MAMF}"),
         Math.ATTENTION: Factor("library_attention", 0.55, "of the BF16 peak", Basis.CITED,
                                "cuDNN 9.13 on B200: the FlashAttention-4 paper's abstract: it reaches 1,613 TFLOP/s, "
                                "1.3x cuDNN's, so about 1,240 of 2,250")},
    9: {Math.FP8_GEMM: Factor("library_fp8", 0.734, "of the FP8 peak", Basis.CITED,
                              f"1,453.4 of 1,979 TFLOP/s on H200, {_MAMF}"),
        Math.BF16_GEMM: Factor("library_bf16", 0.803, "of the BF16 peak", Basis.CITED,
                               f"794.5 of 989 TFLOP/s on H100/H200, {_MAMF}"),
        Math.ATTENTION: Factor("library_attention", 0.75, "of the BF16 peak", Basis.CITED,
                               "the FlashAttention-3 paper's abstract, H100 FP16: 740 TFLOP/s, 75% (cuDNN's is alike)")},
}

#: The fitted factors' names, units and what each stands for.
_FITTED_UNITS = {
    "gemm_scale": ("of the library's share", "what a training step's GEMMs and attention reach of the cited "
                                             "microbenchmark's share of the peak"),
    "memory_efficiency": ("of the HBM bandwidth", "what a memory-bound kernel reaches"),
    "launch_seconds": ("seconds per kernel launched", "the gap between one kernel and the next"),
}


def _fitted() -> dict[str, float]:
  data = json.loads(FITTED.read_text(encoding="utf-8"))
  return {name: float(data["values"][name]) for name in _FITTED_UNITS}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Factors:
  """The calibrated model's factors for one target."""

  gemm_scale: float
  memory_efficiency: float
  launch_seconds: float
  nvlink_bus_efficiency: float = NVLINK_BUS_EFFICIENCY.value
  network_bus_efficiency: float = NETWORK_BUS_EFFICIENCY.value

  @classmethod
  def fitted(cls, values: Mapping[str, float] | None = None) -> "Factors":
    """The factors with the fitted constants from `values`, else from calibration.json."""
    return cls(**(dict(values) if values is not None else _fitted()))

  def table(self, target: Target | None = None) -> list[Factor]:
    """Every factor, named, with its value and basis (the report's and the JSON's list); the library shares of
    `target`'s architecture."""
    fitted = [Factor(name, getattr(self, name), unit, Basis.FITTED,
                     f"{what}; fitted by scripts/fit_prediction.py (MaxText/preflight/calibration.json)")
              for name, (unit, what) in _FITTED_UNITS.items()]
    library = list(LIBRARY[target.capability[0]].values()) if target is not None else []
    return [*fitted, *library, dataclasses.replace(NVLINK_BUS_EFFICIENCY, value=self.nvlink_bus_efficiency),
            dataclasses.replace(NETWORK_BUS_EFFICIENCY, value=self.network_bus_efficiency), TILES, OVERLAP]


def factors_for(_target: Target) -> Factors:
  """The factors a target is predicted with: one set for every GPU (the fit is across GPUs, by design: a factor per
  GPU would be fitted on one or two figures each)."""
  return Factors.fitted()


#: The least share of K one SM takes when a library splits K (split-K).
SPLIT_K = 512


def tile_efficiency(m: int, n: int, sm_count: int, k: int = 0) -> float:
  """The share of the SMs' tile work that is the GEMM's own (see the module's docstring), in (0, 1]."""
  best = 0.0
  for rows, cols in (TILE, TILE[::-1]):
    tiles = math.ceil(m / rows) * math.ceil(n / cols)
    splits = max(1, min(sm_count // tiles, k // SPLIT_K))
    waves = math.ceil(tiles * splits / sm_count)
    best = max(best, m * n * splits / (waves * sm_count * rows * cols))
  return min(best, 1.0)


def peak_of(math_type: Math, peaks: Peaks) -> float | None:
  """FLOP/s that bound a kernel of this math type at the datasheet; None for those bound by bytes alone."""
  if math_type is Math.FP4_GEMM:
    if peaks.fp4 is None:
      raise ValueError("an FP4 GEMM in a program for a GPU without FP4 tensor cores; compile for a Blackwell target")
    return peaks.fp4
  return {Math.FP8_GEMM: peaks.fp8, Math.BF16_GEMM: peaks.bf16, Math.ATTENTION: peaks.bf16}.get(math_type)


def beyond_domain(work: Work, peaks: Peaks) -> bool:
  """Whether a collective runs on the scale-out network: its group's device ids span NVLink domains
  (targets.Peaks.crosses_domains), or, read without its members, it joins more GPUs than a domain holds."""
  if work.members:
    return peaks.crosses_domains(work.members, max(work.devices, max(work.members) + 1))
  return work.group > peaks.nvlink_domain


def bus_rate(spans: bool, peaks: Peaks, factors: Factors) -> float:
  """Bytes a second one GPU moves in a collective: NVLink's calibrated bus bandwidth, or the network's when the
  collective `spans` NVLink domains."""
  return peaks.network * factors.network_bus_efficiency if spans else peaks.nvlink * factors.nvlink_bus_efficiency


def collective_seconds(work: Work, peaks: Peaks, factors: Factors) -> float:
  """Seconds one run of a collective takes: its wire bytes at its link's calibrated bus bandwidth."""
  return work.wire_bytes / bus_rate(beyond_domain(work, peaks), peaks, factors)


def kernel_seconds(kernel: Kernel, target: Target, factors: Factors) -> float:
  """Seconds one run of `kernel` takes, calibrated (no launch gap: `step` adds those)."""
  peaks, work = target.peaks, kernel.work
  if work.math is Math.COLLECTIVE:
    return collective_seconds(work, peaks, factors)
  memory = kernel.bytes / (peaks.hbm * factors.memory_efficiency)
  peak = peak_of(work.math, peaks)
  if not peak:
    return memory
  share = LIBRARY[target.capability[0]][work.math].value * factors.gemm_scale
  if work.gemm_dims:
    m, n, k = work.gemm_dims
    share *= tile_efficiency(m, n, target.sm_count, k)
  return max(work.flops / (peak * share), memory)


@dataclasses.dataclass(frozen=True)
class Calibrated:
  """One program's calibrated step: compute (every kernel but collectives, calibrated), the launch gaps, and the
  communication: all of it and the part exposed at the point and at the interval's ends."""

  compute: float
  launches: float
  communication: float
  exposed: float
  exposed_low: float
  seconds_by_kernel: tuple[float, ...] = ()  # each kernel's calibrated seconds per step, in the kernels' order

  @property
  def step_seconds(self) -> float:
    return self.compute + self.launches + self.exposed

  @property
  def interval(self) -> tuple[float, float]:
    """(all communication hidden, none hidden)."""
    base = self.compute + self.launches
    return base + self.exposed_low, base + self.communication


def step(found: Iterable[Kernel], target: Target, factors: Factors) -> Calibrated:
  """The calibrated step of a program's kernels on `target`."""
  found = list(found)
  compute: dict[str, float] = {}
  hidden: dict[str, float] = {}
  exposed_sync = 0.0
  launches = 0
  per_kernel = []
  for kernel in found:
    seconds = kernel_seconds(kernel, target, factors) * kernel.runs
    per_kernel.append(seconds)
    launches += kernel.runs
    if kernel.work.math is Math.COLLECTIVE:
      if kernel.asynchronous:
        hidden[kernel.computation] = hidden.get(kernel.computation, 0.0) + seconds
      else:
        exposed_sync += seconds
    else:
      compute[kernel.computation] = compute.get(kernel.computation, 0.0) + seconds
  total_compute = sum(compute.values())
  communication = exposed_sync + sum(hidden.values())
  exposed = exposed_sync + sum(max(0.0, s - compute.get(c, 0.0)) for c, s in hidden.items())
  return Calibrated(compute=total_compute, launches=launches * factors.launch_seconds, communication=communication,
                    exposed=exposed, exposed_low=max(0.0, communication - total_compute),
                    seconds_by_kernel=tuple(per_kernel))


def records(found: Iterable[Kernel]) -> list[dict[str, object]]:
  """The kernels as what the calibrated step reads of them, identical ones merged (their runs added): what
  scripts/predict_speedup.py keeps of each published program so that scripts/fit_prediction.py fits without
  compiling (a 405B program compiles in minutes; its records load in milliseconds)."""
  merged: dict[tuple[object, ...], int] = {}
  for kernel in found:
    work = kernel.work
    key = (work.math.value, work.flops, kernel.bytes, work.wire_bytes, work.group, work.members, work.devices,
           work.gemm_dims, kernel.computation, kernel.asynchronous)
    merged[key] = merged.get(key, 0) + kernel.runs
  names = ("math", "flops", "bytes", "wire_bytes", "group", "members", "devices", "gemm_dims", "computation",
           "asynchronous")
  return [dict(zip(names, key), runs=runs) for key, runs in merged.items()]


def from_records(rows: Iterable[Mapping[str, object]]) -> list[Kernel]:
  """The kernels `records` kept, as the calibrated step reads them."""
  found = []
  for i, row in enumerate(rows):
    dims = row["gemm_dims"]
    work = Work(math=Math(row["math"]), flops=int(row["flops"]), wire_bytes=int(row["wire_bytes"]),
                group=int(row["group"]), members=tuple(row["members"]), devices=int(row["devices"]),
                gemm_dims=tuple(dims) if dims else None)
    found.append(Kernel(name=f"k{i}", opcode="", target="", bytes=int(row["bytes"]), op_name="", runs=int(row["runs"]),
                        work=work, computation=str(row["computation"]), asynchronous=bool(row["asynchronous"])))
  return found
