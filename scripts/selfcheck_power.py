# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The power of the self-check's stochastic-rounding mean test, measured: how often it fails a biased quantizer
(the `sr-bias-small` fault, 1/64 of a grid step, the smallest bias docs/blackwell.md claims it detects) and how often
it fails the unbiased emulator (its false alarm rate, 1 - SR_CONFIDENCE by design), over repeated seeds.

Each seed is one run of the self-check's quantization check (MaxText.selfcheck.checks.quantization) on the given GEMM
shape, with fresh test tensors and fresh random draws; the row is the dY operand of the data-gradient GEMM. The
default shape is the smallest the suite uses, smaller than any real layer's: a real run's tensors hold more elements,
and the test's power only grows with them.

  .venv/bin/python scripts/selfcheck_power.py [--seeds 200] [--draws 16] [--shape 64x32x64] [--json PATH]
"""

import argparse
import json
import pathlib
import statistics

from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.selfcheck import checks
from MaxText.selfcheck.candidates import FAULTS, Emulator

_OPERAND = "dgrad_dy"


def z_per_seed(candidate: Emulator, shape: checks.Shape, seeds: int, draws: int) -> list[float]:
  """The z of the operand's mean test at each seed (the check fails where |z| > Z_BOUND)."""
  zs = []
  for seed in range(seeds):
    rows = checks.quantization(candidate, [shape], GemmRecipe(), draws=draws, seed=seed)
    zs.append(next(r for r in rows if r.subject == _OPERAND).values["z"])
  return zs


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=200)
  parser.add_argument("--draws", type=int, default=16, help="the self-check's default (--draws)")
  parser.add_argument("--shape", default="64x32x64", help="MxKxN of the GEMM (dY is M x N)")
  parser.add_argument("--json", type=pathlib.Path, default=pathlib.Path("results/selfcheck_power.json"))
  args = parser.parse_args()
  m, k, n = (int(v) for v in args.shape.split("x"))
  shape = checks.Shape(m, k, n, ("mlp/wi_0",))
  rows = {}
  for name, candidate in (("unbiased emulator", Emulator()), ("sr-bias-small (1/64 step)",
                                                                Emulator(FAULTS["sr-bias-small"]))):
    zs = z_per_seed(candidate, shape, args.seeds, args.draws)
    failed = sum(abs(z) > checks.Z_BOUND for z in zs)
    rows[name] = {"seeds": args.seeds, "failed": failed, "fail_rate": failed / args.seeds,
                  "z_median": statistics.median(zs), "z_min": min(zs), "z_max": max(zs)}
  print(f"self-check SR mean test: |z| <= {checks.Z_BOUND:.4f} ({checks.SR_CONFIDENCE:.1%}), {args.draws} draws, "
        f"GEMM {args.shape}, operand {_OPERAND}, {args.seeds} seeds")
  print(f"{'candidate':<28} {'failed':>8} {'rate':>7} {'z median':>9} {'z min':>8} {'z max':>8}")
  for name, r in rows.items():
    print(f"{name:<28} {r['failed']:>8} {r['fail_rate']:>7.3f} {r['z_median']:>9.2f} {r['z_min']:>8.2f} "
          f"{r['z_max']:>8.2f}")
  args.json.parent.mkdir(parents=True, exist_ok=True)
  args.json.write_text(json.dumps({"z_bound": checks.Z_BOUND, "confidence": checks.SR_CONFIDENCE,
                                   "draws": args.draws, "shape": args.shape, "operand": _OPERAND, "rows": rows},
                                  indent=2) + "\n", encoding="utf-8")
  print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
