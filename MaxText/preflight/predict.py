# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""A training step's time on a GPU that is not here, predicted from its compiled program: the calibrated step, and
the roofline that bounds it.

The roofline, the bound (a reviewer can check each line against the code below):

  1. The program is the one XLA's GPU compiler made for N target GPUs (MaxText.preflight.compile), read as the
     kernels one GPU launches per step (MaxText.preflight.kernels: a kernel in the layer loop counts once per
     layer; both branches of a conditional count).
  2. Each kernel's work comes from its HLO (MaxText.preflight.classify): FLOPs by math type (FP4, FP8 or BF16 GEMM;
     fused attention), the bytes it reads and writes (result plus operands, slices counted as slices), and for a
     collective the bytes one GPU sends in a ring.
  3. One run of a kernel takes
        GEMM or attention:   max(FLOPs / peak of its math type, bytes / HBM bandwidth)
        collective:          wire bytes / NVLink bandwidth each way (the scale-out network's when its group's
                             GPUs lie in more than one NVLink domain: targets.Peaks.crosses_domains)
        anything else:       bytes / HBM bandwidth (elementwise, reductions, copies, TE's quantize and amax
                             kernels; an unclassified kernel too, shown in a row of its own)
     with the target's datasheet peaks, dense (MaxText.preflight.targets.Peaks). Attention runs at the BF16 peak.
  4. The bound is the sum over kernels of runs x time with every collective hidden behind compute
     (`roofline_seconds`): no real step is faster.

The prediction is the calibrated step (MaxText.preflight.calibration): the same kernels with every factor the
roofline leaves out named, cited, worked out or fitted (GEMM and memory efficiency, a launch gap per kernel,
collectives at their measured bus bandwidth, wave and tile quantization), communication overlapped as XLA's
latency-hiding scheduler can, and an interval from all communication hidden to none (`interval`). Its groups'
seconds (`seconds`) sum to it; `bound` holds the roofline's per group.

  5. Model TFLOP/s per GPU = maxtext's own FLOP count for the step (what its trainer logs per device) / the step's
     time. A speedup of one program over another is the ratio of their step times. The Amdahl ceiling of a run over
     a baseline is the baseline's time / (the run's time without its MLP GEMMs): the speedup if the MLP GEMMs,
     the only ones NVFP4 runs, cost nothing.

What neither sees: cache reuse (a kernel's bytes all come from HBM), the softmax's exponentials, power or clock
throttling beyond what the fit absorbs, data loading and the host.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence
from typing import Any

from MaxText.preflight import calibration, origins
from MaxText.preflight.classify import Math
from MaxText.preflight.kernels import Kernel
from MaxText.preflight.targets import Peaks, Target

__all__ = ["Group", "Prediction", "amdahl_ceiling", "group_of", "kernel_seconds", "predict", "speedup"]


class Group(enum.StrEnum):
  """Where the step's time goes, in the report's rows."""

  MLP_GEMMS = "MLP GEMMs"
  """GEMMs with an MLP width among their dims (`group_of`): what NVFP4 speeds up."""
  ATTENTION = "attention"
  """The attention core (cuDNN's fused attention)."""
  OTHER_GEMMS = "other GEMMs"
  """Attention projections, the output head, and any other GEMM."""
  ELEMENTWISE = "elementwise"
  """Fusions, copies and reductions: norms, activations, quantization, the optimizer update."""
  COMMUNICATION = "communication"
  """Collectives: in the calibrated step the part compute does not hide; in the bound, all of it."""
  LAUNCHES = "launch gaps"
  """The calibrated gap between one kernel and the next, per kernel launched (none in the bound)."""
  UNCLASSIFIED = "unclassified"
  """Kernels the classification cannot read (Math.UNCLASSIFIED), kept apart so their bytes stay visible."""


def kernel_seconds(kernel: Kernel, peaks: Peaks) -> float:
  """Seconds one run of `kernel` takes on a GPU with these peaks (the model's rule 3)."""
  work = kernel.work
  if work.math is Math.COLLECTIVE:
    bandwidth = peaks.network if calibration.beyond_domain(work, peaks) else peaks.nvlink
    return work.wire_bytes / bandwidth
  memory = kernel.bytes / peaks.hbm
  peak = calibration.peak_of(work.math, peaks)
  return max(work.flops / peak, memory) if peak else memory


def group_of(kernel: Kernel, mlp_widths: frozenset[int]) -> Group:
  """The report row of a kernel. A GEMM is an MLP GEMM when one of its M, N, K is an MLP width of this config
  (the MLP's hidden size, or its shard under tensor parallelism): wi_0/wi_1 forward (N), wo forward (K), and
  every gradient GEMM of them carry it; no attention projection or output head does."""
  math = kernel.work.math
  if math.gemm:
    dims = kernel.work.gemm_dims or ()
    return Group.MLP_GEMMS if mlp_widths.intersection(dims) else Group.OTHER_GEMMS
  return {Math.ATTENTION: Group.ATTENTION, Math.COLLECTIVE: Group.COMMUNICATION,
          Math.UNCLASSIFIED: Group.UNCLASSIFIED}.get(math, Group.ELEMENTWISE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prediction:
  """One program's predicted step on one GPU: the calibrated seconds per group (`seconds`, the prediction), the
  roofline's per group (`bound`), the exposed communication's interval (all hidden, none hidden), bytes and kernel
  counts per group, FLOPs per math type (all per step), maxtext's model FLOPs for the step (0 when not given), and
  the elementwise group's calibrated seconds and bytes per (origin, phase) (MaxText.preflight.origins; they sum to
  the group's)."""

  seconds: dict[Group, float]
  bytes: dict[Group, int]
  kernels: dict[Group, int]
  flops: dict[Math, int]
  model_flops: float = 0.0
  bound: dict[Group, float] = dataclasses.field(default_factory=dict)
  communication_range: tuple[float, float] = (0.0, 0.0)
  elementwise_seconds: dict[tuple[origins.Origin, str], float] = dataclasses.field(default_factory=dict)
  elementwise_bytes: dict[tuple[origins.Origin, str], int] = dataclasses.field(default_factory=dict)

  @property
  def step_seconds(self) -> float:
    """The calibrated step: the prediction."""
    return sum(self.seconds.values())

  @property
  def interval(self) -> tuple[float, float]:
    """The calibrated step with all communication hidden behind compute, and with none hidden."""
    rest = self.step_seconds - self.seconds[Group.COMMUNICATION]
    return rest + self.communication_range[0], rest + self.communication_range[1]

  @property
  def roofline_seconds(self) -> float:
    """The bound: every kernel at its datasheet peak, every collective hidden behind compute."""
    communication = self.bound.get(Group.COMMUNICATION, 0.0)
    return max(sum(self.bound.values()) - communication, communication)

  @property
  def mlp_free_seconds(self) -> float:
    """The step if its MLP GEMMs cost nothing."""
    return self.step_seconds - self.seconds[Group.MLP_GEMMS]

  @property
  def tflops_per_gpu(self) -> float:
    """Model TFLOP/s per GPU at the predicted step time (maxtext's FLOP count)."""
    return self.model_flops / self.step_seconds / 1e12 if self.step_seconds else 0.0

  @property
  def roofline_tflops_per_gpu(self) -> float:
    """Model TFLOP/s per GPU at the bound."""
    return self.model_flops / self.roofline_seconds / 1e12 if self.roofline_seconds else 0.0

  def as_dict(self) -> dict[str, Any]:
    return {"step_seconds": self.step_seconds, "step_interval_seconds": list(self.interval),
            "model_tflops_per_gpu": self.tflops_per_gpu,
            "model_tflops_per_gpu_interval": [self.model_flops / s / 1e12 if s else 0.0 for s in self.interval[::-1]],
            "roofline_step_seconds": self.roofline_seconds, "roofline_tflops_per_gpu": self.roofline_tflops_per_gpu,
            "model_tflops_per_step": self.model_flops / 1e12,
            "seconds": {g.value: s for g, s in self.seconds.items()},
            "roofline_seconds": {g.value: s for g, s in self.bound.items()},
            "bytes": {g.value: b for g, b in self.bytes.items()},
            "kernels": {g.value: n for g, n in self.kernels.items()},
            "tflops_per_step": {m.value: f / 1e12 for m, f in self.flops.items()},
            "elementwise_by_origin": [
                {"origin": o.value, "phase": p, "seconds": self.elementwise_seconds[(o, p)],
                 "bytes": self.elementwise_bytes.get((o, p), 0)} for o, p in self.elementwise_seconds]}


def predict(found: Iterable[Kernel], target: Target, mlp_widths: frozenset[int], model_flops: float = 0.0,
            factors: calibration.Factors | None = None) -> Prediction:
  """The predicted step of a program's kernels (MaxText.preflight.kernels.kernels) on `target`.

  Args:
    found: the program's kernels, each with its runs per step.
    target: the GPU (MaxText.preflight.targets): its peaks for the bound, its SMs for the calibration.
    mlp_widths: the config's MLP hidden sizes, per device (see `group_of`).
    model_flops: maxtext's FLOPs per device and step, for TFLOP/s per GPU.
    factors: the calibrated model's (default: calibration.factors_for(target)).
  """
  found = list(found)
  factors = factors or calibration.factors_for(target)
  calibrated = calibration.step(found, target, factors)
  seconds = dict.fromkeys(Group, 0.0)
  bound = dict.fromkeys(Group, 0.0)
  moved = dict.fromkeys(Group, 0)
  counts = dict.fromkeys(Group, 0)
  flops = dict.fromkeys((Math.FP4_GEMM, Math.FP8_GEMM, Math.BF16_GEMM, Math.ATTENTION), 0)
  split = {(o, p): 0.0 for o in origins.Origin for p in origins.PHASES}
  split_bytes = dict.fromkeys(split, 0)
  for kernel, kernel_time in zip(found, calibrated.seconds_by_kernel):
    group = group_of(kernel, mlp_widths)
    bound[group] += kernel_seconds(kernel, target.peaks) * kernel.runs
    if group is not Group.COMMUNICATION:
      seconds[group] += kernel_time
    moved[group] += kernel.step_bytes
    counts[group] += 1
    if kernel.work.math in flops:
      flops[kernel.work.math] += kernel.work.flops * kernel.runs
    if group is Group.ELEMENTWISE:
      key = origins.split_key(kernel)
      split[key] += kernel_time
      split_bytes[key] += kernel.step_bytes
  seconds[Group.COMMUNICATION] = calibrated.exposed
  seconds[Group.LAUNCHES] = calibrated.launches
  return Prediction(seconds=seconds, bound=bound, bytes=moved, kernels=counts, flops=flops, model_flops=model_flops,
                    communication_range=(calibrated.exposed_low, calibrated.communication),
                    elementwise_seconds=split, elementwise_bytes=split_bytes)


def averaged(full: Prediction, without: Sequence[tuple[Prediction, int]]) -> Prediction:
  """`full`'s mean step when it holds periodic taps: each (the same program without one tap, its interval N) takes
  away that tap's part but 1/N of it: full - sum((full - without) * (1 - 1/N)). The kernel count of `full` holds both
  branches of each tap's conditional, as if every tap ran every step."""

  def mean(ours: dict[Any, Any], theirs: list[tuple[dict[Any, Any], int]]) -> dict[Any, Any]:
    return {key: type(value)(value - sum((value - other[key]) * (1 - 1 / n) for other, n in theirs))
            for key, value in ours.items()}

  return dataclasses.replace(
      full, seconds=mean(full.seconds, [(w.seconds, n) for w, n in without]),
      bound=mean(full.bound, [(w.bound, n) for w, n in without]),
      communication_range=tuple(mean(dict(enumerate(full.communication_range)),
                                     [(dict(enumerate(w.communication_range)), n) for w, n in without]).values()),
      bytes=mean(full.bytes, [(w.bytes, n) for w, n in without]),
      flops=mean(full.flops, [(w.flops, n) for w, n in without]),
      elementwise_seconds=mean(full.elementwise_seconds, [(w.elementwise_seconds, n) for w, n in without]),
      elementwise_bytes=mean(full.elementwise_bytes, [(w.elementwise_bytes, n) for w, n in without]))


def speedup(baseline: Prediction, run: Prediction) -> float:
  """How many times faster `run`'s step is than `baseline`'s."""
  return baseline.step_seconds / run.step_seconds


def amdahl_ceiling(baseline: Prediction, run: Prediction) -> float:
  """The speedup of `run` over `baseline` if `run`'s MLP GEMMs cost nothing."""
  return baseline.step_seconds / run.mlp_free_seconds
