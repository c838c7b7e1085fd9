# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What the pipeline's taps cost: mean training step time with nvfp4_stats_interval and nvfp4_audit_interval every step
and every 10th, against neither.

The mean, not the median: with interval N only one step in N measures (the others run the same program with the
statistics branch of a `lax.cond` not taken), so the median would hide exactly the cost asked about. The timed
window starts after `--skip` steps (compilation) and spans a multiple of every interval, so each interval's
statistics steps are counted in their true proportion. All rows run in one invocation, in turn; with --rounds R the
ratio to the no-statistics row is taken within each round (rows run back to back, under about the same load) and
the median over rounds is reported. Goals: statistics <= 1.05x at interval 10 (issue 17); the audit <= 1.01x at
interval 100 (issue 28), which the printout derives from the two audit rows: x(N) = 1 + o + (x(1) - 1 - o) / N, o the
cost on the steps that do not audit, o = (x(10) - 1 - (x(1) - 1) / 10) / (1 - 1 / 10).

  .venv/bin/python scripts/bench_stats.py [--config configs/bench_mlp.yml] [--rounds 1] [--json PATH] [key=value ...]
"""

import argparse
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_step import train_step_times, write_json  # pylint: disable=wrong-import-position

#: name -> overrides; the first is the reference every row is divided by.
ROWS = {
    "te_nvfp4": ["quantization=te_nvfp4"],
    "te_nvfp4 stats every 10": ["quantization=te_nvfp4", "nvfp4_stats_interval=10"],
    "te_nvfp4 stats every step": ["quantization=te_nvfp4", "nvfp4_stats_interval=1"],
    "te_nvfp4 audit every 10": ["quantization=te_nvfp4", "nvfp4_audit_interval=10"],
    "te_nvfp4 audit every step": ["quantization=te_nvfp4", "nvfp4_audit_interval=1"],
}


def audit_at(interval: int, every_10: float, every_step: float) -> tuple[float, float]:
  """(x at `interval`, o): the audit's step-time ratio at `interval` from the two measured rows (module docstring)."""
  audit_step = every_step - 1.0
  off_steps = (every_10 - 1.0 - audit_step / 10) / (1 - 1 / 10)
  return 1.0 + off_steps + (audit_step - off_steps) / interval, off_steps


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/bench_mlp.yml")
  parser.add_argument("--skip", type=int, default=10, help="leading steps left out (compilation); a multiple of 10")
  parser.add_argument("--timed", type=int, default=30, help="steps timed after --skip; a multiple of 10")
  parser.add_argument("--rounds", type=int, default=1, help="run every row this many times; keep the best")
  parser.add_argument("--json", type=pathlib.Path, default=pathlib.Path("results/bench_stats.json"))
  parser.add_argument("overrides", nargs="*", help="extra key=value for every run")
  args = parser.parse_args()
  if args.skip % 10 or args.timed % 10 or args.timed <= 0:
    raise SystemExit(f"bench_stats: --skip {args.skip} and --timed {args.timed} must be multiples of 10 (and "
                     "--timed > 0), so every interval's statistics steps are counted in proportion")
  config = str(pathlib.Path(args.config).resolve())
  steps = args.skip + args.timed
  means: dict[str, list[float]] = {name: [] for name in ROWS}
  with tempfile.TemporaryDirectory() as tmp:
    for round_ in range(args.rounds):
      for i, (name, overrides) in enumerate(ROWS.items()):
        times = train_step_times(config, f"row{i}", [*overrides, *args.overrides], steps, pathlib.Path(tmp))
        means[name].append(statistics.fmean(times[args.skip:steps]))
        print(f"  round {round_ + 1}: {name}: {means[name][-1] * 1e3:.1f} ms", flush=True)
  reference = next(iter(means.values()))
  rows = [{"row": name, "overrides": ROWS[name], "mean_step_s": min(m), "round_means_s": m,
           # Paired per round (the rows of one round ran back to back, under about the same load), then the median.
           "round_ratios": [a / b for a, b in zip(m, reference)],
           "x_no_stats": statistics.median(a / b for a, b in zip(m, reference))} for name, m in means.items()]
  print(f"\nmean step time over steps {args.skip}-{steps - 1}, {args.config} {' '.join(args.overrides)} ({args.rounds} "
        "round(s); ms/step: the best round; x no stats: the median over rounds of the ratio within a round)")
  print(f"{'row':<28}{'ms/step':>10}{'x no stats':>12}  per round")
  for r in rows:
    per_round = " ".join(f"{x:.3f}" for x in r["round_ratios"])
    print(f"{r['row']:<28}{r['mean_step_s'] * 1e3:>10.1f}{r['x_no_stats']:>12.3f}  {per_round}")
  by_name = {r["row"]: r["x_no_stats"] for r in rows}
  at_100, off_steps = audit_at(100, by_name["te_nvfp4 audit every 10"], by_name["te_nvfp4 audit every step"])
  print(f"audit at interval 100, derived: {at_100:.4f}x (steps that do not audit: {1 + off_steps:.4f}x)")
  write_json(args.json, {"config": args.config, "overrides": args.overrides, "skip": args.skip, "timed": args.timed,
                         "rounds": args.rounds, "rows": rows,
                         "audit_at_100_derived": at_100, "audit_off_steps": 1 + off_steps})


if __name__ == "__main__":
  main()
