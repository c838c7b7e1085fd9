# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What a run ran on, read from the files next to its metrics: the precision plan, maxtext's config, machine load.

Why the comparison needs it: a step time means "NVFP4 speed" only when the NVFP4 GEMMs ran on real FP4 hardware
(TransformerEngine), and a step time measured while other processes used the CPUs measures them too. Each source is
optional; a missing or unreadable one leaves its fields None and never fails the comparison.

  * `precision_plan.json` (written by the plugin into `<base_output_directory>/<run_name>/`): the resolved backend
    ("emulated", "fused" or "te") and the precision of each GEMM module.
  * maxtext's config, which it writes into the TensorBoard events as text summaries (`<key>/text_summary`):
    `quantization` and `hardware`.
  * `machine.json` (written by the quickstart around each training process; `machine_sample` /
    `machine_record` below): load averages and CPU seconds of this run and of everything else on the machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
from collections.abc import Iterable
from pathlib import Path

from MaxText.integration import artifacts

PLAN_FILE = artifacts.PLAN_FILE
MACHINE_FILE = "machine.json"
#: Config keys read from the TensorBoard text summaries.
CONFIG_KEYS = ("quantization", "hardware")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunInfo:
  """Facts about a run other than its per-step metrics; None where the run dir does not say."""

  backend: str | None = None  # the plan's resolved NVFP4 backend: "emulated" | "te" | "fused"
  nvfp4_gemms: int | None = None  # GEMM modules the plan runs in NVFP4 (0 for a bf16 baseline with a quant object)
  mlp_flop_share: float | None = None  # the MLP GEMMs' share of the training FLOPs (maxtext's count), from the plan
  quantization: str | None = None  # maxtext's `quantization`, lower case ("" when unquantized)
  hardware: str | None = None  # maxtext's `hardware` ("cpu", "gpu", "tpu", ...)
  machine: dict | None = None  # machine.json as written by `machine_record`


def _enum_text(text: str) -> str:
  """maxtext logs enum values as `QuantizationType.TE_NVFP4`; the key's value as a user types it is `te_nvfp4`."""
  value = text.rsplit(".", 1)[-1] if text.startswith(("QuantizationType.", "HardwareType.")) else text
  return "" if value.upper() == "NONE" else value.lower()


def read_plan(run_dir: Path) -> tuple[str | None, int | None, float | None]:
  """(backend, number of NVFP4 GEMM modules, the MLP GEMMs' share of the training FLOPs) from the run dir's
  precision_plan.json; None for each thing it does not say (plans before the share was recorded lack it)."""
  try:
    plan = artifacts.Plan.model_validate_json((run_dir / PLAN_FILE).read_text(encoding="utf-8"))
  except (OSError, ValueError):  # missing, or another version's plan (pydantic's ValidationError is a ValueError)
    return None, None, None
  return plan.backend, plan.nvfp4_gemms, plan.flops.mlp_flop_share if plan.flops else None


def read_machine(run_dir: Path) -> dict | None:
  """machine.json as a dict, or None."""
  try:
    data = json.loads((run_dir / MACHINE_FILE).read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return None
  return data if isinstance(data, dict) else None


def config_from_texts(texts: dict[str, str]) -> dict[str, str]:
  """The CONFIG_KEYS among TensorBoard text summaries (tag `<key>/text_summary` -> value), normalised."""
  out = {}
  for key in CONFIG_KEYS:
    text = texts.get(f"{key}/text_summary")
    if text is not None:
      out[key] = _enum_text(text)
  return out


def read_info(run_dir: Path | None, texts: dict[str, str] | None = None) -> RunInfo:
  """Everything this module knows about the run in `run_dir` (None: nothing but the TensorBoard `texts`)."""
  backend, nvfp4, mlp_share = read_plan(run_dir) if run_dir is not None else (None, None, None)
  config = config_from_texts(texts or {})
  return RunInfo(
      backend=backend,
      nvfp4_gemms=nvfp4,
      mlp_flop_share=mlp_share,
      quantization=config.get("quantization"),
      hardware=config.get("hardware"),
      machine=read_machine(run_dir) if run_dir is not None else None,
  )


def _busy_cpu_seconds() -> float | None:
  """CPU seconds all processes have spent since boot (Linux /proc/stat: every state but idle and iowait)."""
  try:
    fields = Path("/proc/stat").read_text(encoding="ascii").splitlines()[0].split()
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
  except (OSError, ValueError, IndexError):
    return None
  return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class MachineSample:
  """One reading of the machine, taken just before and just after a training process."""

  loadavg: tuple[float, float, float]
  busy_cpu_s: float | None  # the whole machine, since boot
  children_cpu_s: float  # this process's waited-for children (the training processes), user + system


def machine_sample() -> MachineSample:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return MachineSample(tuple(os.getloadavg()), _busy_cpu_seconds(), usage.ru_utime + usage.ru_stime)


def machine_record(before: MachineSample, after: MachineSample, wall_s: float) -> dict:
  """machine.json: what the run used and what everything else on the machine used meanwhile.

  `other_cores` = (machine busy CPU seconds - this run's CPU seconds) / wall seconds: the cores other work kept
  busy on average while the run trained (None where /proc/stat is unreadable).
  """
  run_cpu = after.children_cpu_s - before.children_cpu_s
  other = None
  if before.busy_cpu_s is not None and after.busy_cpu_s is not None and wall_s > 0:
    other = max(0.0, (after.busy_cpu_s - before.busy_cpu_s - run_cpu) / wall_s)
  return {
      "cpu_count": os.cpu_count(),
      "loadavg_before": list(before.loadavg),
      "loadavg_after": list(after.loadavg),
      "wall_s": wall_s,
      "run_cpu_s": run_cpu,
      "other_cores": other,
  }


def other_cores(infos: Iterable[RunInfo]) -> list[float]:
  """The `other_cores` values the runs recorded (runs without machine.json are left out)."""
  return [float(i.machine["other_cores"]) for i in infos if i.machine and i.machine.get("other_cores") is not None]
