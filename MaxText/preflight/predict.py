# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""A training step's time on a GPU that is not here, predicted from its compiled program: a roofline per kernel.

The model, all of it (a reviewer can check each line against the code below):

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
     with the target's datasheet peaks, dense (MaxText.preflight.targets.Peaks). Attention runs at the BF16 peak
     (FP8 when its operands are FP8: not in these recipes).
  4. The step's time is the sum over kernels of runs x time. Nothing overlaps: not communication with compute, not
     one kernel with the next. `overlapped_seconds` is the other bound: collectives hidden entirely behind compute.
  5. Model TFLOP/s per GPU = maxtext's own FLOP count for the step (what its trainer logs per device) / the step's
     time. A speedup of one program over another is the ratio of their step times. The Amdahl ceiling of a run over
     a baseline is the baseline's time / (the run's time without its MLP GEMMs): the speedup if the MLP GEMMs,
     the only ones NVFP4 runs, cost nothing.
  6. No efficiency factor: every kernel is assumed to reach its datasheet peak or bandwidth. None of the published
     ratios this is validated against (docs/prediction.md) set any number here.

What it cannot see, so what it leaves out (each makes the prediction faster than a real step):
  - overlap: XLA overlaps the FSDP all-gathers and reduce-scatters with compute; the sum counts them in full,
    `overlapped_seconds` not at all; a real step lies between.
  - kernel efficiency: real GEMMs and fused attention run below their peaks, small GEMMs far below, and an FP4
    GEMM also handles block scales a BF16 one has not. Not modelled: it would need a measured microbenchmark
    per GPU and shape, and none is cited here.
  - launch overheads and gaps between kernels (microseconds each, hundreds of kernels per layer).
  - cache reuse: a kernel's bytes all come from HBM; L2 hits make memory-bound kernels faster than this says.
  - the softmax's exponentials (attention's special-function throughput) and power or clock throttling.
  - data loading and the host.
A GEMM's bytes are its operands and result once each; a tile re-read from HBM is not counted.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence
from typing import Any

from MaxText.preflight import origins
from MaxText.preflight.classify import Math
from MaxText.preflight.kernels import Kernel
from MaxText.preflight.targets import Peaks

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
  """Collectives, timed as if none overlapped compute (the 'overlapped' column hides them)."""
  UNCLASSIFIED = "unclassified"
  """Kernels the classification cannot read (Math.UNCLASSIFIED), kept apart so their bytes stay visible."""


def _peak(math: Math, peaks: Peaks) -> float | None:
  """FLOP/s that bound a kernel of this math type; None for those bound by bytes alone."""
  if math is Math.FP4_GEMM:
    if peaks.fp4 is None:
      raise ValueError("an FP4 GEMM in a program for a GPU without FP4 tensor cores; compile for a Blackwell target")
    return peaks.fp4
  return {Math.FP8_GEMM: peaks.fp8, Math.BF16_GEMM: peaks.bf16, Math.ATTENTION: peaks.bf16}.get(math)


def kernel_seconds(kernel: Kernel, peaks: Peaks) -> float:
  """Seconds one run of `kernel` takes on a GPU with these peaks (the model's rule 3)."""
  work = kernel.work
  if work.math is Math.COLLECTIVE:
    if work.members:
      beyond = peaks.crosses_domains(work.members, max(work.devices, max(work.members) + 1))
    else:  # a collective read without its group's devices
      beyond = work.group > peaks.nvlink_domain
    bandwidth = peaks.network if beyond else peaks.nvlink
    return work.wire_bytes / bandwidth
  memory = kernel.bytes / peaks.hbm
  peak = _peak(work.math, peaks)
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
  """One program's predicted step on one GPU: seconds, bytes and kernel counts per group, FLOPs per math type
  (all per step), maxtext's model FLOPs for the step (0 when not given), and the elementwise group's seconds and
  bytes per (origin, phase) (MaxText.preflight.origins; they sum to the group's)."""

  seconds: dict[Group, float]
  bytes: dict[Group, int]
  kernels: dict[Group, int]
  flops: dict[Math, int]
  model_flops: float = 0.0
  elementwise_seconds: dict[tuple[origins.Origin, str], float] = dataclasses.field(default_factory=dict)
  elementwise_bytes: dict[tuple[origins.Origin, str], int] = dataclasses.field(default_factory=dict)

  @property
  def step_seconds(self) -> float:
    return sum(self.seconds.values())

  @property
  def overlapped_seconds(self) -> float:
    """The step with every collective hidden behind compute: max(compute, communication)."""
    communication = self.seconds[Group.COMMUNICATION]
    return max(self.step_seconds - communication, communication)

  @property
  def mlp_free_seconds(self) -> float:
    """The step if its MLP GEMMs cost nothing."""
    return self.step_seconds - self.seconds[Group.MLP_GEMMS]

  @property
  def tflops_per_gpu(self) -> float:
    """Model TFLOP/s per GPU at the predicted step time (maxtext's FLOP count)."""
    return self.model_flops / self.step_seconds / 1e12 if self.step_seconds else 0.0

  def as_dict(self) -> dict[str, Any]:
    return {"step_seconds": self.step_seconds, "overlapped_seconds": self.overlapped_seconds,
            "model_tflops_per_gpu": self.tflops_per_gpu, "model_tflops_per_step": self.model_flops / 1e12,
            "seconds": {g.value: s for g, s in self.seconds.items()},
            "bytes": {g.value: b for g, b in self.bytes.items()},
            "kernels": {g.value: n for g, n in self.kernels.items()},
            "tflops_per_step": {m.value: f / 1e12 for m, f in self.flops.items()},
            "elementwise_by_origin": [
                {"origin": o.value, "phase": p, "seconds": self.elementwise_seconds[(o, p)],
                 "bytes": self.elementwise_bytes.get((o, p), 0)} for o, p in self.elementwise_seconds]}


def predict(found: Iterable[Kernel], peaks: Peaks, mlp_widths: frozenset[int], model_flops: float = 0.0) -> Prediction:
  """The predicted step of a program's kernels (MaxText.preflight.kernels.kernels) on a GPU with `peaks`.

  Args:
    found: the program's kernels, each with its runs per step.
    peaks: the target GPU's (MaxText.preflight.targets).
    mlp_widths: the config's MLP hidden sizes, per device (see `group_of`).
    model_flops: maxtext's FLOPs per device and step, for TFLOP/s per GPU.
  """
  seconds = dict.fromkeys(Group, 0.0)
  moved = dict.fromkeys(Group, 0)
  counts = dict.fromkeys(Group, 0)
  flops = dict.fromkeys((Math.FP4_GEMM, Math.FP8_GEMM, Math.BF16_GEMM, Math.ATTENTION), 0)
  split = {(o, p): 0.0 for o in origins.Origin for p in origins.PHASES}
  split_bytes = dict.fromkeys(split, 0)
  for kernel in found:
    group = group_of(kernel, mlp_widths)
    kernel_time = kernel_seconds(kernel, peaks) * kernel.runs
    seconds[group] += kernel_time
    moved[group] += kernel.step_bytes
    counts[group] += 1
    if kernel.work.math in flops:
      flops[kernel.work.math] += kernel.work.flops * kernel.runs
    if group is Group.ELEMENTWISE:
      key = origins.split_key(kernel)
      split[key] += kernel_time
      split_bytes[key] += kernel.step_bytes
  return Prediction(seconds=seconds, bytes=moved, kernels=counts, flops=flops, model_flops=model_flops,
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
