# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What the pre-flight reports about one compiled train step: per-device memory against the GPU's, the kernels, what
the plugin adds around TE's kernels compared with the same step without those additions, and the predicted step
time next to other programs of the same config (MaxText.preflight.predict)."""

from __future__ import annotations

import dataclasses
from typing import Any

from MaxText.preflight import kernels as kernels_lib
from MaxText.preflight import predict
from MaxText.preflight.programs import ActiveTap
from MaxText.preflight.targets import Target

GIB = 1024**3
#: jax's GPU allocator preallocates this share of each GPU unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise.
DEFAULT_MEM_FRACTION = 0.75


@dataclasses.dataclass(frozen=True, kw_only=True)
class Memory:
  """Per-device bytes from XLA's memory analysis of the executable.

  peak = arguments + outputs - aliased (donated state written in place) + temporaries + generated code: what the
  device must hold at once. `device` is what jax's allocator may use: the GPU's memory times
  XLA_PYTHON_CLIENT_MEM_FRACTION (jax's default 0.75). Not in the peak: the CUDA context, cuBLAS/cuDNN workspaces
  XLA does not allocate, NCCL buffers.
  """

  arguments: int
  outputs: int
  aliased: int
  temporaries: int
  code: int
  device: int  # what jax may allocate on the target GPU: its memory x fraction
  fraction: float = DEFAULT_MEM_FRACTION

  @classmethod
  def of(cls, compiled: Any, target: Target, fraction: float = DEFAULT_MEM_FRACTION) -> Memory:
    analysis = compiled.memory_analysis()
    return cls(arguments=int(analysis.argument_size_in_bytes), outputs=int(analysis.output_size_in_bytes),
               aliased=int(analysis.alias_size_in_bytes), temporaries=int(analysis.temp_size_in_bytes),
               code=int(analysis.generated_code_size_in_bytes), device=int(target.memory_bytes * fraction),
               fraction=fraction)

  @property
  def peak(self) -> int:
    return self.arguments + self.outputs - self.aliased + self.temporaries + self.code

  @property
  def fits(self) -> bool:
    return self.peak <= self.device

  @property
  def margin(self) -> int:
    """Bytes left on the device (negative: missing)."""
    return self.device - self.peak

  def as_dict(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self), "peak": self.peak, "fits": self.fits}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TapCost:
  """What one periodic tap of the run adds on the steps it runs: the run's kernels minus those of the run compiled
  without it, in bytes and (with --predict) predicted seconds."""

  tap: ActiveTap
  step_bytes: int
  seconds: float | None = None

  @property
  def mean_bytes(self) -> float:
    """Its bytes averaged over every step: it runs one step in `interval`."""
    return self.step_bytes / self.tap.interval

  def as_dict(self) -> dict[str, Any]:
    return {"key": self.tap.key, "interval": self.tap.interval, "bytes_on_its_steps": self.step_bytes,
            "mean_bytes_per_step": self.mean_bytes, "seconds_on_its_steps": self.seconds}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Overhead:
  """The kernels the plugin adds beside TE's: ours minus the same step compiled without the additions. The kernel
  count holds both branches of a periodic tap's conditional, so `added_bytes` is a step on which every tap runs;
  `mean_added_bytes` averages each tap (`taps`) over its interval."""

  added_kernels: list[kernels_lib.Kernel]  # kernels of ours with no twin (kind, bytes, runs) in the bare program
  added_bytes: int  # total kernel bytes of ours minus those of the bare program
  te_bytes: int  # bytes of TE's own quantized-GEMM kernels (quantize, RHT amax, GEMM) in the bare program
  net: list[kernels_lib.NetRow]  # the same difference per group of kernels; the rows sum to added_bytes
  taps: tuple[TapCost, ...] = ()

  @property
  def fraction(self) -> float:
    return self.added_bytes / self.te_bytes if self.te_bytes else 0.0

  @property
  def mean_added_bytes(self) -> float:
    return self.added_bytes - sum(t.step_bytes - t.mean_bytes for t in self.taps)

  @property
  def mean_fraction(self) -> float:
    return self.mean_added_bytes / self.te_bytes if self.te_bytes else 0.0

  @classmethod
  def between(cls, ours: list[kernels_lib.Kernel], bare: list[kernels_lib.Kernel],
              taps: tuple[TapCost, ...] = ()) -> Overhead:
    return cls(added_kernels=kernels_lib.added(ours, bare),
               added_bytes=kernels_lib.total_bytes(ours) - kernels_lib.total_bytes(bare),
               te_bytes=kernels_lib.total_bytes(kernels_lib.te_kernels(bare, gemm_path_only=True)),
               net=kernels_lib.net_by_group(ours, bare), taps=taps)

  def as_dict(self) -> dict[str, Any]:
    return {"added_bytes": self.added_bytes, "te_bytes": self.te_bytes, "added_bytes_fraction": self.fraction,
            "mean_added_bytes": self.mean_added_bytes, "mean_added_bytes_fraction": self.mean_fraction,
            "taps": [t.as_dict() for t in self.taps],
            "added_kernels": [dataclasses.asdict(k) for k in self.added_kernels],
            "net_by_group": [dataclasses.asdict(row) for row in self.net]}


def gib(n: int) -> str:
  return f"{n / GIB:.2f} GiB"


def memory_lines(memory: Memory, target: Target, devices: int) -> list[str]:
  verdict = (f"fits, {gib(memory.margin)} to spare" if memory.fits
             else f"does NOT fit: {gib(-memory.margin)} over")
  return [
      f"per-device memory on {devices} x {target.name} ({gib(memory.device)} each for jax: "
      f"{memory.fraction:.0%} of {gib(target.memory_bytes)}, XLA_PYTHON_CLIENT_MEM_FRACTION):",
      f"  arguments (params, optimizer state, batch)  {gib(memory.arguments):>12}",
      f"  outputs not written in place                {gib(memory.outputs - memory.aliased):>12}",
      f"  temporaries (activations, gradients, ...)   {gib(memory.temporaries):>12}",
      f"  generated code                              {gib(memory.code):>12}",
      f"  peak                                        {gib(memory.peak):>12}  -> {verdict}",
  ]


def kernel_lines(found: list[kernels_lib.Kernel]) -> list[str]:
  te = kernels_lib.counts(kernels_lib.te_kernels(found))
  lines = [f"kernels in the step (a scanned layer counted once): {len(found)}, of them TransformerEngine's: "
           f"{sum(te.values())}"]
  lines += [f"  {kind:<28} {count:>4}" for kind, count in sorted(te.items())]
  return lines


def overhead_lines(overhead: Overhead, what: str) -> list[str]:
  """The overhead, and its net bytes per group of kernels (phase of the step, TE's or XLA's), largest first: the
  rows sum to the total."""
  lines = [f"what the plugin adds around TE's kernels ({what}):",
           f"  {overhead.added_bytes / 1e6:+,.1f} MB per step against {overhead.te_bytes / 1e6:,.1f} MB moved by TE's "
           f"quantize, RHT-amax and GEMM kernels: added_bytes_fraction {overhead.fraction:.4f}",
           "  net MB per step by group (kernels matched by phase of the step and origin, not one by one: fusions "
           "differ between the two programs; the rows sum to the total):"]
  lines += [f"  {row.net_bytes / 1e6:>+12,.1f}  {row.group}" for row in overhead.net]
  if overhead.taps:
    lines.append("  periodic taps (counted above as if they ran every step: the program holds both branches of "
                 "their conditional):")
    lines += [f"    {t.tap.what} ({t.tap.key}={t.tap.interval}): {t.step_bytes / 1e6:+,.1f} MB on the steps it runs, "
              f"{t.mean_bytes / 1e6:+,.1f} MB per step on average" for t in overhead.taps]
    lines.append(f"  per step on average: {overhead.mean_added_bytes / 1e6:+,.1f} MB, added_bytes_fraction "
                 f"{overhead.mean_fraction:.4f}")
  return lines


def _ms(seconds: float, decimals: int) -> str:
  return f"{seconds * 1e3:,.{decimals}f}"


def elementwise_lines(programs: dict[str, predict.Prediction], decimals: int) -> list[str]:
  """The elementwise row of each program split by origin and phase (MaxText.preflight.origins), the rows any program
  has time in; they sum to the elementwise row."""
  keys = [key for key in next(iter(programs.values())).elementwise_seconds
          if any(p.elementwise_bytes.get(key, 0) for p in programs.values())]
  lines = ["  elementwise by origin and phase, ms per step (the rows sum to the elementwise row; "
           "MaxText/preflight/origins.py):"]
  for origin, phase in keys:
    cells = " ".join(f"{_ms(p.elementwise_seconds.get((origin, phase), 0.0), decimals):>10}"
                     for p in programs.values())
    lines.append(f"    {origin.value + ', ' + phase:<46} {cells}")
  return lines


def prediction_lines(run: predict.Prediction, against: dict[str, predict.Prediction], target: Target,
                     devices: int, taps: tuple[TapCost, ...] = (), memories: dict[str, Memory] | None = None
                     ) -> list[str]:
  """The predicted step of this run and of each program it is compared with: step time, model TFLOP/s per GPU,
  speedups over fp8 and bf16 (where compared), where the time goes, the Amdahl ceiling, what the model leaves out.
  `run` is the mean step, each of its periodic `taps` averaged over its interval; each tap's cost is said. A program
  whose `memories` entry (by row name) does not fit is marked in its row: its prediction is for a program that would
  not run as compiled."""
  programs = {"this run": run, **against}
  bases = [name for name in ("fp8", "bf16") if name in against]
  decimals = 1 if run.step_seconds >= 0.01 else 4  # a tiny test config's step is microseconds
  head = f"{'program':<12} {'step ms':>10} {'interval ms':>17} {'roofline':>9} {'TFLOP/s/GPU':>12} {'interval':>13}"
  head += "".join(f" {'x over ' + base:>12}" for base in bases)
  lines = [f"predicted step time on {devices} x {target.name} (the calibrated step, MaxText/preflight/calibration.py; "
           "interval: all communication hidden .. none; roofline: the bound at the datasheet peaks; "
           "docs/prediction.md):", "  " + head]
  for name, prediction in programs.items():
    low, high = prediction.interval
    slow, fast = (prediction.model_flops / s / 1e12 if s else 0.0 for s in (high, low))
    row = (f"{name:<12} {_ms(prediction.step_seconds, decimals):>10} "
           f"{_ms(low, decimals):>8}-{_ms(high, decimals):<8} {_ms(prediction.roofline_seconds, decimals):>9} "
           f"{prediction.tflops_per_gpu:>12,.0f} {slow:>6,.0f}-{fast:<6,.0f}")
    row += "".join(f" {predict.speedup(against[base], prediction) if name != base else 1.0:>11.2f}x" for base in bases)
    memory = (memories or {}).get(name)
    if memory is not None and not memory.fits:
      row += f"  does NOT fit: {gib(memory.peak)} > {gib(memory.device)}, would not run as compiled"
    lines.append("  " + row)
  lines.append("  where the time goes, ms per step: " + ", ".join(programs))
  for group in predict.Group:
    cells = " ".join(f"{_ms(p.seconds[group], decimals):>10}" for p in programs.values())
    note = ""
    if group is predict.Group.UNCLASSIFIED:
      note = f"  ({run.kernels[group]} kernels, {run.bytes[group] / 1e6:,.1f} MB per step in this run, timed by bytes)"
    lines.append(f"  {group.value:<14} {cells}{note}")
  lines += elementwise_lines(programs, decimals)
  for base in bases:
    lines.append(f"  Amdahl ceiling over {base} (this run's MLP GEMMs free): "
                 f"{predict.amdahl_ceiling(against[base], run):.2f}x")
  for t in taps:
    seconds = t.seconds or 0.0
    lines.append(f"  {t.tap.what} ({t.tap.key}={t.tap.interval}): {_ms(seconds, decimals)} ms more on the steps "
                 f"it runs; x{run.step_seconds / (run.step_seconds - seconds / t.tap.interval):.4f} on the mean step "
                 "(averaged in this run's row)")
  lines.append("  not seen by the prediction: cache reuse, clock and power changes beyond the fit, the host; each "
               "factor and its source is in the JSON's prediction.factors and docs/prediction.md")
  return lines
