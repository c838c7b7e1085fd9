# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The weight gradients' zero shares of training runs, side by side: each run's `.../wgrad/zero` and
`.../wgrad/zero_channels` (nvfp4_stats_interval; docs/statistics.md#zero-weight-gradients), per GEMM as the mean over
its decoder layers, at each statistics step and over all of them. Meant for an NVFP4 run and its BF16 baseline
(nvfp4_mlp_precision=bf16) trained with the same statistics interval. Not a test: it reads what the runs wrote.

  .venv/bin/python scripts/wgrad_zeros.py NAME=METRICS.jsonl [NAME=METRICS.jsonl ...] [--json results/wgrad_zeros.json]
"""

import argparse
import collections
import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_step import write_json  # noqa: E402  # pylint: disable=wrong-import-position

from MaxText.integration.artifacts import parse_stat_name  # noqa: E402  # pylint: disable=wrong-import-position
from MaxText.precision.taps import GRADIENT_ROW  # noqa: E402  # pylint: disable=wrong-import-position

COLUMNS = ("zero", "zero_channels")


def shares(path: pathlib.Path) -> dict[int, dict[str, dict[str, float]]]:
  """{step: {gemm: {column: mean over the decoder layers}}} of one run's metrics file (its train records)."""
  out: dict[int, dict[str, dict[str, float]]] = {}
  for line in path.read_text(encoding="utf-8").splitlines():
    record = json.loads(line)
    cells: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for name, value in record.items():
      parsed = parse_stat_name(name)
      if parsed is not None and parsed.operand == GRADIENT_ROW and parsed.stat in COLUMNS:
        cells[(parsed.gemm, parsed.stat)].append(float(value))
    if cells:
      step = int(record["step"])
      for (gemm, column), values in cells.items():
        out.setdefault(step, {}).setdefault(gemm, {})[column] = statistics.fmean(values)
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("runs", nargs="+", metavar="NAME=METRICS.jsonl")
  parser.add_argument("--json", type=pathlib.Path, default=pathlib.Path("results/wgrad_zeros.json"))
  args = parser.parse_args()
  runs = {}
  for item in args.runs:
    name, _, path = item.partition("=")
    runs[name] = shares(pathlib.Path(path))
    if not runs[name]:
      parser.error(f"{path}: no wgrad/zero metrics (was the run trained with nvfp4_stats_interval?)")
  print(f"{'run':<10}{'step':>6}  {'GEMM':<28}{'zero':>12}{'zero_channels':>15}")
  for name, steps in runs.items():
    for step, gemms in sorted(steps.items()):
      for gemm, values in sorted(gemms.items()):
        print(f"{name:<10}{step:>6}  {gemm:<28}{values['zero']:>12.4g}{values['zero_channels']:>15.4g}")
  print("\nmean over the statistics steps, then over the GEMMs")
  summary = {}
  for name, steps in runs.items():
    gemms = sorted({g for values in steps.values() for g in values})
    per_gemm = {g: {c: statistics.fmean(v[g][c] for v in steps.values() if g in v) for c in COLUMNS} for g in gemms}
    summary[name] = {"per_gemm": per_gemm, **{c: statistics.fmean(p[c] for p in per_gemm.values()) for c in COLUMNS}}
    print(f"{name:<10}  zero {summary[name]['zero']:.6g}  zero_channels {summary[name]['zero_channels']:.6g}  "
          f"({len(steps)} statistics steps, {len(gemms)} GEMMs)")
  write_json(args.json, {"runs": {n: {str(s): g for s, g in steps.items()} for n, steps in runs.items()},
                         "summary": summary})


if __name__ == "__main__":
  main()
