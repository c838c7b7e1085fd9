# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""CLI: `python -m MaxText.compare RUN ... --baseline NAME [--out DIR] [--window-start STEP] [--smooth N] ...`.

A RUN is a run dir (`<base_output_directory>/<run_name>`, named by its basename), a metrics .jsonl (named by its
`run_name` field), or NAME=PATH to name it explicitly. Exit status: 0 when the report was written (a diverged run
is a result, not an error), 2 for bad arguments or unreadable runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from MaxText.compare.metrics import RunMetrics, load_run
from MaxText.compare.report import build_report, markdown_summary, write_report
from MaxText.compare.schema import ComparisonSettings, Report

#: Each option and the ComparisonSettings field it sets; its type, default and help come from the field (one declaration).
_OPTIONS = (("--window-start", "window_start"), ("--smooth", "smooth"), ("--step0-tol", "step0_tolerance"),
            ("--perf-start-step", "perf_start_step"), ("--band-rel", "band_rel"), ("--drift-rel", "drift_rel"),
            ("--contention-cores", "contention_cores"))


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m MaxText.compare",
      description="Compare training runs against a baseline: loss gap in nats, step-0 agreement, throughput.",
  )
  parser.add_argument("runs", nargs="*", metavar="RUN", help="run dir, metrics .jsonl, or NAME=PATH")
  parser.add_argument("--baseline", help="name of the baseline run (a run dir's basename, or NAME of NAME=PATH)")
  parser.add_argument("--out", default="results/compare", help="output dir for report.md/json and the plots")
  for flag, field in _OPTIONS:
    info = ComparisonSettings.model_fields[field]
    number = int if "int" in str(info.annotation) else float
    parser.add_argument(flag, dest=field, type=number, default=info.default, help=info.description.replace("%", "%%"))
  parser.add_argument("--print-schema", action="store_true", help="print report.json's JSON Schema and exit")
  return parser.parse_args(argv)


def _load(spec: str) -> RunMetrics:
  name, sep, path = spec.partition("=")
  if sep and name and "/" not in name:
    return load_run(path, name)
  return load_run(spec)


def main(argv: Sequence[str] | None = None) -> int:
  args = _parse_args(argv)
  if args.print_schema:
    print(json.dumps(Report.model_json_schema(), indent=2))
    return 0
  if len(args.runs) < 2 or not args.baseline:
    print("error: give at least two runs and --baseline NAME (see --help)", file=sys.stderr)
    return 2
  try:
    settings = ComparisonSettings(**{field: getattr(args, field) for _, field in _OPTIONS})
    runs = [_load(spec) for spec in args.runs]
    report = build_report(runs, args.baseline, settings)
  except ValueError as e:  # pydantic's ValidationError is a ValueError too
    print(f"error: {e}", file=sys.stderr)
    return 2
  paths = write_report(runs, report, args.out)
  print(markdown_summary(report))
  print("wrote " + ", ".join(str(p) for p in paths.values()))
  return 0


if __name__ == "__main__":
  sys.exit(main())
