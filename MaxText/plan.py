# Copyright 2026 The NVFP4-for-MaxText Authors. Licensed under the Apache License, Version 2.0.
"""The precision plan: what each DenseGeneral of the built model actually runs, written and printed at startup.

A known complaint about NVFP4 elsewhere is that it is silently not used. The plan is read off the model maxtext
built (every DenseGeneral node and the dot_general module it really holds), not off the config, and lands in
`<base_output_directory>/<run_name>/precision_plan.json` plus a short table on stdout.
"""

import dataclasses
import json
import logging
from collections.abc import Iterable
from typing import Any

from etils import epath
from flax import nnx

from MaxText.adapter import Nvfp4Quantization, implementation_name

_LOG = logging.getLogger(__name__)
PLAN_FILE = "precision_plan.json"
_reported: set[tuple[str, str]] = set()  # plans already written/printed in this process (maxtext builds models repeatedly)


@dataclasses.dataclass(frozen=True)
class PlanEntry:
  module: str  # NNX path, e.g. decoder/layers/mlp/wi_0 (scanned layers share one entry)
  kernel_axes: tuple[str | None, ...]
  precision: str  # nvfp4 | fp8 | bf16
  backend: str  # emulated | te | "-" (unquantized)
  implementation: str  # the dot_general module that runs it


def collect(model: Any) -> tuple[Nvfp4Quantization | None, list[PlanEntry]]:
  """(the NVFP4 quant object, one entry per DenseGeneral holding it); the logits projection holds none."""
  quant, entries = None, []
  for path, node in nnx.iter_graph(model):
    name = getattr(node, "_quant_dot_general_name", None)
    if type(node).__name__ != "DenseGeneral" or name is None or not isinstance(node.quant, Nvfp4Quantization):
      continue
    quant = node.quant
    axes = tuple(node.kernel_axes)
    precision = quant.policy.precision_for(axes)
    held = type(getattr(node, name).to_nnx__module).__name__
    impl = implementation_name(precision, quant.backend)
    entries.append(PlanEntry(
        module="/".join(str(p) for p in path), kernel_axes=axes, precision=precision.value,
        backend="-" if precision.value == "bf16" else quant.backend.value, implementation=f"{impl} [{held}]"))
  return quant, entries


def format_table(entries: Iterable[PlanEntry]) -> str:
  rows = [("module", "kernel axes", "precision", "backend")]
  rows += [(e.module, ",".join(str(a) for a in e.kernel_axes), e.precision, e.backend) for e in entries]
  widths = [max(len(r[i]) for r in rows) for i in range(4)]
  lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


def report(model: Any, output_dir: str) -> list[PlanEntry]:
  """Writes PLAN_FILE under output_dir and prints the table, once per distinct plan in this process.

  Does nothing for a model without an NVFP4 quant object.
  """
  quant, entries = collect(model)
  if quant is None:
    return entries
  payload = json.dumps({"backend": quant.backend.value, "recipe": dataclasses.asdict(quant.policy.recipe),
                        "gemms": [dataclasses.asdict(e) for e in entries]}, indent=2)
  if (output_dir, payload) in _reported:
    return entries
  _reported.add((output_dir, payload))
  path = epath.Path(output_dir) / PLAN_FILE
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(payload + "\n")
  counts = {p: sum(e.precision == p for e in entries) for p in ("nvfp4", "fp8", "bf16")}
  print(f"NVFP4 precision plan ({quant.backend.value} backend; {counts['nvfp4']} nvfp4, {counts['fp8']} fp8, "
        f"{counts['bf16']} bf16 GEMM modules; written to {path}):\n{format_table(entries)}", flush=True)
  return entries
