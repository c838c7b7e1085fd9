# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""One pre-flight: the run's step compiled for N described GPUs, and the programs it is compared with (the run
without the plugin's additions, without each periodic tap, and maxtext's own modes for --predict); what it returns
is the report's lines and its JSON, which the command line (MaxText.preflight.__main__) prints and writes.

Call it inside `environment.answering(library.target_environment(target, devices))`: the backend choice and TE's
trace-time queries must see the target, not this machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from MaxText.integration import shapes
from MaxText.integration.settings import settings_of
from MaxText.preflight import kernels as kernels_lib
from MaxText.preflight import library, programs, report
from MaxText.preflight.targets import TARGETS, Target

__all__ = ["Outcome", "comparison_kernels", "preflight", "without_taps"]


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What one pre-flight found: the report's lines, its JSON, and the run's memory against the target's."""

  lines: list[str]
  payload: dict[str, Any]
  memory: report.Memory
  target: Target


def comparison_kernels(config_path: str, overrides: Sequence[str], target: str, devices: int,
                       comparison: programs.Comparison, memories: dict[str, report.Memory] | None = None,
                       left_out: list[str] | None = None) -> list[kernels_lib.Kernel] | None:
  """The kernels of one comparison program made from the run's config and `overrides` (its memory into `memories`,
  by name); one that does not load or compile is one line, exit 2. With `left_out` (the comparisons were not named,
  `--predict` alone), it is a line there and None instead: a default the run's model cannot compile, such as
  upstream's every-GEMM te_nvfp4 for a MoE whose router TE's NVFP4 GEMM refuses, must not cost the other rows."""
  theirs = programs.overrides_for(overrides, comparison)
  try:
    with comparison.context():
      compiled = library.compile_step(library.load_config(config_path, theirs, devices), target, devices,
                                      f"{comparison.name} ({' '.join(comparison.overrides)}), to compare with")
    if memories is not None:
      memories[comparison.name] = report.Memory.of(compiled, TARGETS[target], library.mem_fraction())
    return kernels_lib.kernels(compiled.as_text())
  except Exception as e:  # pylint: disable=broad-exception-caught  # any failure of that program is one line
    line = (f"the comparison program {comparison.name} ({' '.join(comparison.overrides)}) does not compile for "
            f"{devices} x {target}: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
    if left_out is None:
      library.fail(line)
    left_out.append(f"left out: {line} (not named; one named with --predict-against is an error)")
    return None


def without_taps(config_path: str, overrides: Sequence[str], target: str, devices: int, config: Any
                 ) -> list[tuple[programs.ActiveTap, list[kernels_lib.Kernel]]]:
  """For each periodic tap the run (`config`) has on, the run's kernels compiled without it (one more compile each)."""
  out = []
  for tap in programs.taps(settings_of(config)):
    compiled = library.compile_step(library.load_config(config_path, programs.replaced(overrides, [tap.off]), devices),
                                    target, devices, f"the run without {tap.what} ({tap.off}), to count what it adds")
    out.append((tap, kernels_lib.kernels(compiled.as_text())))
    del compiled
  return out


def preflight(config_path: str, overrides: Sequence[str], target_name: str, devices: int, *, fraction: float,
              overhead: bool = True, against: Sequence[str] | None = None, named: bool = True) -> Outcome:
  """The pre-flight of the run `config_path` + `overrides` on `devices` GPUs of `target_name`.

  Args:
    fraction: the share of the GPU jax may allocate (library.mem_fraction), what the memory fits within.
    overhead: measure what the plugin adds around TE's kernels (one more compile, for an NVFP4 run on TE only).
    against: predict the step time, for the run and these comparisons (programs.COMPARISONS' names); None: no
      prediction.
    named: the user named `against` (--predict-against); False (the defaults of --predict): a comparison that does
      not compile is left out with a line in the report instead of exit 2.

  A device count the config's parallelism cannot use, a named comparison that does not compile, or a program the model
  cannot predict for the target is one line, exit 2. A step that does not fit is not: the caller reports it after
  the report (Outcome.memory.fits).
  """
  target = TARGETS[target_name]
  config = library.load_config(config_path, overrides, devices)
  compiled = library.compile_step(config, target_name, devices, "this run")
  memory = report.Memory.of(compiled, target, fraction)
  found = kernels_lib.kernels(compiled.as_text())
  del compiled  # the comparison programs compile next; keep one executable at a time
  lines = [*report.memory_lines(memory, target, devices), *report.kernel_lines(found)]
  if shapes.fused_attention_on_te(config):
    lines.append("not counted: cuDNN's fused-attention workspace (cuDNN sizes it on the GPU; the pre-flight "
                 "answers 0 bytes)")
  payload: dict[str, Any] = {"config": config_path, "overrides": list(overrides), "target": target_name,
                             "devices": devices, "memory": memory.as_dict(),
                             "te_kernels": kernels_lib.counts(kernels_lib.te_kernels(found))}
  overhead_wanted = overhead and library.te_nvfp4(config)
  without = without_taps(config_path, overrides, target_name, devices, config) \
      if overhead_wanted or against is not None else []
  predicted = None
  memories = {"this run": memory}
  left_out: list[str] | None = None if named else []
  if against is not None:
    try:
      predicted = programs.predict_all(
          config, found, target, against,
          lambda comparison: comparison_kernels(config_path, overrides, target_name, devices, comparison, memories,
                                                left_out),
          without)
    except ValueError as e:
      library.fail(f"cannot predict the step on {devices} x {target.name}: {e}")
  taps = tuple(report.TapCost(tap=tap, step_bytes=kernels_lib.total_bytes(found) - kernels_lib.total_bytes(kernels),
                              seconds=predicted.tap_seconds[tap.key] if predicted else None)
               for tap, kernels in without)
  if overhead_wanted:
    bare = library.compile_step(
        library.load_config(config_path, programs.replaced(overrides, library.BARE_OVERRIDES), devices),
        target_name, devices, f"the overhead comparison ({' '.join(library.BARE_OVERRIDES)})")
    measured = report.Overhead.between(found, kernels_lib.kernels(bare.as_text()), taps)
    lines += report.overhead_lines(measured, "against the same step with " + " ".join(library.BARE_OVERRIDES))
    payload["overhead"] = measured.as_dict()
  if predicted is not None:
    lines += report.prediction_lines(predicted.run, predicted.against, target, devices, taps, memories)
    lines += left_out or []
    payload["prediction"] = {**predicted.as_dict(), "fits": {name: m.fits for name, m in memories.items()},
                             "peak_bytes": {name: m.peak for name, m in memories.items()}, "left_out": left_out or []}
  return Outcome(lines=lines, payload=payload, memory=memory, target=target)
