# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""`python -m MaxText.selfcheck CONFIG.yml [key=value ...] [--json PATH] [--with-fault NAME | --with-variant NAME]`

Holds this node's NVFP4 quantizer and GEMMs against the plugin's bit-exact emulator at the run's own per-device MLP
GEMM shapes (wi_0/wi_1/wo, read from the config as MaxText.train reads it), and reports:
  quantization  every operand of the recipe (x, W, dY, and the wgrad copies with RHT) on hard distributions: codes,
                block scales and the tensor amax bit for bit; dY's stochastic rounding by its definition; the RHT'd
                copies up to the order of the transform's float32 sums (MaxText.nvfp4.audit.order_aware), the
                differences that order explains counted in the row;
  gemm          fprop, dgrad and wgrad within the float32-accumulation bound;
  step          the run's compiled train step has FP4 GEMMs in every NVFP4 layer ("is NVFP4 running?");
  speed         NVFP4, FP8 (current scaling) and BF16 GEMM forward + backward, TFLOP/s and ratios.
On a Blackwell GPU with TransformerEngine the candidate is TE's; anywhere else the emulator (held against itself and a
float64 reference), and the report says what cannot run here and why. `--with-fault NAME` injects a known bug into
the emulator's quantization of one operand: the check must then fail naming it (how CI tests the checks);
`--with-variant rht-order` runs a correct quantizer that sums the RHT in another order: the checks must pass.
`--compile-only --target b200|gb300` compiles the TE candidate's programs and the train step for that GPU without one
(the pre-flight's machinery). Exit 0 when every check holds, 1 naming each mismatch, 2 with one line for bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
if "--compile-only" in sys.argv[1:]:  # before jax loads: the compile-only GPUs come from the CUDA plugin's topology API
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # as the pre-flight's command line: XLA's INFO lines bury the rows

# pylint: disable=wrong-import-position  # after the environment above
from MaxText.integration import cli, seam
from MaxText.selfcheck import PROG
from MaxText.selfcheck.candidates import FAULTS, VARIANTS

TARGETS = ("b200", "gb300")


def fail(line: str) -> NoReturn:
  cli.fail(PROG, line)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  faults = ", ".join(f"{f.name} ({f.operand}: {f.what})" for f in FAULTS.values())
  parser = cli.OneLineParser(PROG, "CONFIG.yml [key=value ...] [--with-fault NAME | --with-variant NAME] [--json PATH]",
                             description=__doc__.split("\n\n")[1])
  parser.add_argument("config", help="the run's YAML config, as MaxText.train takes it")
  parser.add_argument("overrides", nargs="*", help="key=value overrides, as MaxText.train takes them")
  parser.add_argument("--json", type=pathlib.Path, help="also write the report as JSON to this path")
  parser.add_argument("--with-fault", choices=tuple(FAULTS), metavar="NAME",
                      help=f"inject a known fault into the emulator's quantization (the checks must fail): {faults}")
  parser.add_argument("--with-variant", choices=tuple(VARIANTS), metavar="NAME",
                      help="run a correct quantizer that is not ours bit for bit (the checks must pass, counting what "
                           f"they accept): {', '.join(f'{k} ({v})' for k, v in VARIANTS.items())}")
  parser.add_argument("--draws", type=int, default=16, help="stochastic-rounding draws per tensor (default 16)")
  parser.add_argument("--repeats", type=int, default=5, help="timed runs per GEMM, after 2 warm-up runs (default 5)")
  parser.add_argument("--compile-only", action="store_true",
                      help="compile TE's programs and the train step for --target, without a GPU (.venv-gpu)")
  parser.add_argument("--target", choices=TARGETS, help="the Blackwell GPU --compile-only compiles for")
  parser.add_argument("--devices", type=int, default=1, help="with --compile-only: the GPUs the run uses (default 1)")
  args = parser.parse_intermixed_args(argv)
  bad = [o for o in args.overrides if "=" not in o]
  if bad:
    fail(f"{bad[0]!r} is not key=value; overrides look like per_device_batch_size=2")
  if args.compile_only != (args.target is not None):
    fail("--compile-only and --target go together: --compile-only --target b200|gb300")
  if args.draws < 2 or args.repeats < 1 or args.devices < 1:
    fail(f"--draws {args.draws}, --repeats {args.repeats}, --devices {args.devices}: use --draws >= 2, --repeats >= 1, "
         "--devices >= 1")
  if (args.with_fault or args.with_variant) and args.compile_only:
    fail("--with-fault and --with-variant run the checks; --compile-only only compiles: use one of them")
  if args.with_fault and args.with_variant:
    fail("--with-fault and --with-variant each replace the candidate: give one")
  return args


def _table(rows: list[Any]) -> str:
  mark = {True: "ok", False: "FAIL", None: "-"}
  lines = [f"{'check':<13} {'subject':<26} {'':<5} detail"]
  lines += [f"{r.check:<13} {r.subject:<26} {mark[r.ok]:<5} {r.detail}" for r in rows]
  return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
  args = parse_args(argv)
  seam.register()
  seam.install_cli_error_handler(cli.one_line_config_errors([PROG, args.config], PROG))
  # pylint: disable-next=import-outside-toplevel  # maxtext, jax, and TE where installed: once the input is read
  from MaxText.selfcheck import run

  try:
    if args.compile_only:
      rows, facts = run.compile_only(args.config, args.overrides, args.target, args.devices)
    else:
      rows, facts = run.on_this_node(args.config, args.overrides, fault=FAULTS.get(args.with_fault),
                                     draws=args.draws, repeats=args.repeats, variant=args.with_variant)
  except run.BadInput as e:
    fail(str(e))
  print("\n".join(facts))
  print(_table(rows))
  failed = [r for r in rows if r.ok is False]
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"config": args.config, "overrides": list(args.overrides), "facts": facts,
                                     "results": [dataclasses.asdict(r) for r in rows],
                                     "ok": not failed}, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")
  for row in failed:
    print(f"{PROG}: mismatch: {row.check} {row.subject}: {row.detail}", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
