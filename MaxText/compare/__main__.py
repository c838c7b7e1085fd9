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
from MaxText.compare.schema import Report, Settings

_DEFAULTS = Settings()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m MaxText.compare",
      description="Compare training runs against a baseline: loss gap in nats, step-0 agreement, throughput.",
  )
  parser.add_argument("runs", nargs="*", metavar="RUN", help="run dir, metrics .jsonl, or NAME=PATH")
  parser.add_argument("--baseline", help="name of the baseline run (a run dir's basename, or NAME of NAME=PATH)")
  parser.add_argument("--out", default="results/compare", help="output dir for report.md/json and the plots")
  parser.add_argument(
      "--window-start", type=int, default=None, help="first step of the gap window (default: end of warm-up)"
  )
  parser.add_argument("--smooth", type=int, default=_DEFAULTS.smooth, help="steps in the trailing means")
  parser.add_argument(
      "--step0-tol", type=float, default=_DEFAULTS.step0_tolerance, help="nats within which step-0 losses agree"
  )
  parser.add_argument(
      "--perf-start-step", type=int, default=_DEFAULTS.perf_start_step, help="throughput medians use steps >= this"
  )
  parser.add_argument(
      "--band-rel", type=float, default=_DEFAULTS.band_rel, help="verdict ok: |gap| / baseline loss <= this"
  )
  parser.add_argument(
      "--drift-rel", type=float, default=_DEFAULTS.drift_rel, help="verdict drifting up to this relative gap, off above"
  )
  parser.add_argument(
      "--contention-cores", type=float, default=_DEFAULTS.contention_cores,
      help="other work busier than this many cores during a run (machine.json) withholds the speedup",
  )  # fmt: skip
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
    settings = Settings(
        window_start=args.window_start,
        smooth=args.smooth,
        step0_tolerance=args.step0_tol,
        perf_start_step=args.perf_start_step,
        band_rel=args.band_rel,
        drift_rel=args.drift_rel,
        contention_cores=args.contention_cores,
    )
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
