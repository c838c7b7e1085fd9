# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""`python -m MaxText.preflight CONFIG.yml [key=value ...] --target b200|gb200|gb300|h100 --devices N [--predict]
[--predict-against fp8,bf16,nvfp4_all] [--tune [--global-batch B]] [--json PATH]`

Compiles the run's train step (maxtext's own, with the plugin registered) for N target GPUs with XLA's GPU compiler,
on this machine, without a GPU (`.venv-gpu`: the CUDA jax plugin and TransformerEngine), and prints:
  - per-device memory: arguments, temporaries, peak, against the GPU's memory: fits or not, by how much;
  - the kernels in the step and TransformerEngine's among them (its FP4 GEMMs, quantizations, RHT amaxes);
  - for an NVFP4 run on TE, what the plugin adds around TE's kernels: the same step compiled again without the
    non-finite guard, the statistics tap and the audit, and the difference in bytes per group of kernels;
  - for each periodic tap the run has on (nvfp4_stats_interval, nvfp4_audit_interval), the run compiled once more
    without it: what it adds on the steps it runs, and averaged over its interval (bytes, and seconds with --predict);
  - with --predict, the step time predicted from the compiled kernels (MaxText.preflight.predict) for this run and
    for the same config as maxtext's fp8, as bf16 and as upstream maxtext's te_nvfp4 (--predict-against narrows
    them): model TFLOP/s per GPU, speedups, where the time goes, the Amdahl ceiling;
  - with --tune instead, the fastest layout that fits (mesh, per-device batch, remat) for the run and for each
    program --predict-against names, each searched on its own, and the speedup best against best
    (MaxText.preflight.tune).
Python warnings and WARNING log lines raised while loading and compiling come after the report. Exit status: 0 when
it fits; 2 with one line on stderr for a config error, an unknown target or comparison, a device count the config's
parallelism cannot use, a comparison program that does not compile, or a step that does not fit. The answers a GPU
would give TE at trace time come from MaxText.preflight.deviceless; what that leaves out (cuDNN's attention
workspace) is said in the output.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import pathlib
import sys
import warnings
from collections.abc import Iterator, Sequence

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the compile-only GPUs come from the CUDA plugin's topology API
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # XLA's INFO lines (its scheduler's, per computation) bury the report

# pylint: disable=wrong-import-position  # after the environment above
# The arguments are checked before maxtext, jax and TransformerEngine import (about 6 s): these three import neither.
from MaxText.integration import cli
from MaxText.preflight import PROG, comparisons
from MaxText.preflight.targets import TARGETS


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  parser = cli.OneLineParser(PROG, f"CONFIG.yml [key=value ...] --target {'|'.join(TARGETS)} --devices N",
                             description=__doc__.split("\n\n")[1])
  parser.add_argument("config", help="the run's YAML config, as MaxText.train takes it")
  parser.add_argument("overrides", nargs="*", help="key=value overrides, as MaxText.train takes them")
  parser.add_argument("--target", required=True, help=f"the GPU: {', '.join(TARGETS)}")
  parser.add_argument("--devices", required=True, type=int, help="how many GPUs the run uses")
  parser.add_argument("--json", type=pathlib.Path, help="also write the report as JSON to this path")
  parser.add_argument("--no-overhead", action="store_true",
                      help="skip the second compile that measures what the plugin adds around TE's kernels")
  parser.add_argument("--predict", action="store_true",
                      help="predict the step time, also for the programs --predict-against names (one compile each)")
  parser.add_argument("--predict-against", metavar="NAMES",
                      help="comma-separated programs to compare with (implies --predict; default: all that run on the "
                           f"target): {', '.join(f'{c.name} ({c.what})' for c in comparisons.COMPARISONS.values())}")
  parser.add_argument("--tune", action="store_true",
                      help="search the layouts (mesh, per-device batch, remat) for the fastest that fits, for the run "
                           "and for each program --predict-against names, each its own search (docs/preflight.md)")
  parser.add_argument("--global-batch", type=int, metavar="SEQUENCES",
                      help="with --tune: hold the global batch at this many sequences; gradient accumulation varies "
                           "(default: the per-device batch varies, compared per token)")
  parser.add_argument("--tune-compiles", type=int, metavar="N",
                      help="with --tune: at most N compiles per program beside its reference (default 6)")
  args = parser.parse_intermixed_args(argv)  # key=value overrides may come after the options
  if args.target not in TARGETS:
    cli.fail(PROG, f"--target {args.target!r} is not a GPU the plugin describes; valid: {', '.join(sorted(TARGETS))}")
  try:
    args.against = comparisons.against(args.predict_against, TARGETS[args.target])
  except ValueError as e:
    cli.fail(PROG, str(e))
  args.predict = args.predict or args.predict_against is not None
  if args.devices < 1:
    cli.fail(PROG, f"--devices {args.devices}: give the number of GPUs the run uses (1 or more)")
  if (args.global_batch is not None or args.tune_compiles is not None) and not args.tune:
    cli.fail(PROG, "--global-batch and --tune-compiles go with --tune")
  if args.global_batch is not None and args.global_batch < 1:
    cli.fail(PROG, f"--global-batch {args.global_batch}: give the sequences per optimizer step (1 or more)")
  if args.tune_compiles is not None and args.tune_compiles < 1:
    cli.fail(PROG, f"--tune-compiles {args.tune_compiles}: give the compiles per program (1 or more)")
  bad = [o for o in args.overrides if "=" not in o]
  if bad:
    cli.fail(PROG, f"{bad[0]!r} is not key=value; overrides look like per_device_batch_size=2")
  return args


def main(argv: Sequence[str]) -> int:
  args = parse_args(argv)
  # maxtext, jax and TE import only once the arguments hold (seconds; parse_args says a mistake without them).
  from MaxText.backends import environment  # pylint: disable=import-outside-toplevel  # jax: after parse_args
  from MaxText.integration import seam  # pylint: disable=import-outside-toplevel  # maxtext: after parse_args
  from MaxText.preflight import library  # pylint: disable=import-outside-toplevel  # maxtext, TE: after parse_args

  fraction = library.mem_fraction()
  seam.register()
  seam.install_cli_error_handler(cli.one_line_config_errors([PROG, args.config], PROG))
  with _after_the_report():
    with environment.answering(library.target_environment(args.target, args.devices)):
      return _report(args, fraction)


class _Held(logging.Handler):
  """Holds log records (WARNING and above) instead of printing them."""

  def __init__(self) -> None:
    super().__init__(logging.WARNING)
    self.lines: list[str] = []

  def emit(self, record: logging.LogRecord) -> None:
    self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


@contextlib.contextmanager
def _after_the_report() -> Iterator[None]:
  """Python warnings and WARNING log records raised in the block (maxtext's, TE's, jax's, while configs load and
  programs compile) are printed after it, each distinct line once with how often it came, so they do not bury the
  report. Python's warning filters stay as they are; the root logger's handlers are back after the block."""
  root = logging.getLogger()
  handlers, held = root.handlers[:], _Held()
  root.handlers = [held]
  try:
    with warnings.catch_warnings(record=True) as caught:
      yield
  finally:
    root.handlers = handlers + [h for h in root.handlers if h is not held]
    lines = [f"{w.category.__name__}: {w.message}" for w in caught] + held.lines
    counts = collections.Counter(" ".join(line.split())[:300] for line in lines)
    if counts:
      print(f"warnings and log messages while loading and compiling, held until now ({len(counts)} distinct):")
      for line, count in counts.items():
        print(f"  {count} x {line}" if count > 1 else f"  {line}")


def _report(args: argparse.Namespace, fraction: float) -> int:
  """The pre-flight of `args` once the target's environment is being answered: the report, the JSON, the verdict."""
  from MaxText.preflight import library, report, run  # pylint: disable=import-outside-toplevel  # maxtext: as in main
  if args.tune:
    return _tune(args, fraction)
  outcome = run.preflight(args.config, args.overrides, args.target, args.devices, fraction=fraction,
                          overhead=not args.no_overhead, against=args.against if args.predict else None,
                          named=args.predict_against is not None)
  print("\n".join(outcome.lines))
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(outcome.payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")
  memory = outcome.memory
  if not memory.fits:
    library.fail(f"does not fit: {report.gib(memory.peak)} per device > {report.gib(memory.device)} jax may use on a "
                 f"{outcome.target.name} ({memory.fraction:.0%}) by {report.gib(-memory.margin)}")
  return 0


def _tune(args: argparse.Namespace, fraction: float) -> int:
  """--tune: the search's table and JSON (MaxText.preflight.tune); exit 2 when no layout of the run fits."""
  from MaxText.preflight import library, tune  # pylint: disable=import-outside-toplevel  # maxtext: as in main
  tuned = tune.tune(args.config, args.overrides, args.target, args.devices, fraction=fraction,
                    against=args.against if args.predict_against is not None else (), global_batch=args.global_batch,
                    budget=args.tune_compiles or tune.BUDGET)
  lines, payload = tuned.lines, tuned.payload
  print("\n".join(lines))
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")
  if payload["tune"]["best"]["run"] is None:
    library.fail(f"no layout of the run that compiled fits {args.devices} x {args.target} (the table above)")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
