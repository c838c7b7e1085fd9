# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Median training step time of one config under several precisions, in one run; prints a table, writes JSON.

Each precision trains in its own subprocess through `python -m MaxText.train` (maxtext's own trainer), and
the step time is maxtext's own `perf/step_time_seconds` from the metrics file, median over the steps after
the first `--skip` (compilation). The BF16 baseline keeps a quant object (te_nvfp4 with
nvfp4_mlp_precision=bf16) so every row has the same initial weights and the same module structure; every row
is reported as a multiple of it (issue 11's target: te_nvfp4 and te_nvfp4_no_rht <= 1.10x) and of fp8.
With --rounds R the precisions run R times in turn and each keeps its lowest median: other processes on a
shared machine slow whichever run they overlap, and the fastest round is the least disturbed.

  .venv/bin/python scripts/bench_step.py --config configs/bench_mlp.yml
  .venv/bin/python scripts/bench_step.py [--config configs/tiny.yml] [--steps 30] [--rounds 1]
      [--precisions bf16 te_nvfp4 ...] [--json results/bench_step.json] [key=value ...]
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile

_REPO = pathlib.Path(__file__).resolve().parents[1]

#: name -> CLI overrides; the first is the baseline every row is divided by.
PRECISIONS = {
    "bf16": ["quantization=te_nvfp4", "nvfp4_mlp_precision=bf16"],
    "fp8": ["quantization=fp8"],
    "te_nvfp4": ["quantization=te_nvfp4"],
    "te_nvfp4_no_rht": ["quantization=te_nvfp4_no_rht"],
}
_BASELINE = "bf16"


def train_step_times(config: str, name: str, overrides: list[str], steps: int, out: pathlib.Path) -> list[float]:
  """Trains `config` with `overrides` in a subprocess; returns maxtext's per-step times (also used by bench_moe)."""
  metrics = out / f"{name}.jsonl"
  metrics.unlink(missing_ok=True)
  cmd = [sys.executable, "-m", "MaxText.train", config, f"run_name={name}", f"base_output_directory={out}",
         f"steps={steps}", f"metrics_file={metrics}", "enable_checkpointing=false", *overrides]
  proc = subprocess.run(cmd, cwd=_REPO, capture_output=True, text=True, check=False,
                        env=dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu")))
  if proc.returncode:
    raise SystemExit(f"{pathlib.Path(sys.argv[0]).stem}: {name} failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
  rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
  return [float(r["perf/step_time_seconds"]) for r in rows]


def write_json(path: pathlib.Path, payload: dict) -> None:
  """Writes a benchmark's result to `path` with the machine it ran on (host, CPU count), and says where."""
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({**payload, "host": platform.node(), "cpus": os.cpu_count()}, indent=2))
  print(f"wrote {path}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/tiny.yml")
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--skip", type=int, default=5, help="leading steps left out of the median (compilation)")
  parser.add_argument("--rounds", type=int, default=1, help="run every precision this many times; keep the best")
  parser.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
  parser.add_argument("--json", type=pathlib.Path, default=pathlib.Path("results/bench_step.json"))
  parser.add_argument("overrides", nargs="*", help="extra key=value for every run")
  args = parser.parse_args()
  config = str(pathlib.Path(args.config).resolve())
  names = [_BASELINE] + [p for p in args.precisions if p != _BASELINE]

  medians: dict[str, list[float]] = {name: [] for name in names}
  with tempfile.TemporaryDirectory() as tmp:
    for round_ in range(args.rounds):
      for name in names:
        times = train_step_times(config, name, [*PRECISIONS[name], *args.overrides], args.steps, pathlib.Path(tmp))
        medians[name].append(statistics.median(times[args.skip:]))
        print(f"  round {round_ + 1}: {name}: {medians[name][-1] * 1e3:.1f} ms", flush=True)
  rows = [{"precision": name, "median_step_s": min(m), "round_medians_s": m, "steps_timed": args.steps - args.skip}
          for name, m in medians.items()]
  base = rows[0]["median_step_s"]
  fp8 = next((r["median_step_s"] for r in rows if r["precision"] == "fp8"), None)
  for r in rows:
    r["x_bf16"] = r["median_step_s"] / base
    r["x_fp8"] = r["median_step_s"] / fp8 if fp8 else None

  print(f"\nmedian step time, {args.config} {' '.join(args.overrides)} ({args.steps} steps, first {args.skip} "
        f"skipped, best of {args.rounds} round(s)); bf16 = te_nvfp4 with nvfp4_mlp_precision=bf16")
  print(f"{'precision':<18}{'ms/step':>10}{'x bf16':>8}{'x fp8':>8}")
  for r in rows:
    x_fp8 = f"{r['x_fp8']:.2f}" if r["x_fp8"] else "-"
    print(f"{r['precision']:<18}{r['median_step_s'] * 1e3:>10.1f}{r['x_bf16']:>8.2f}{x_fp8:>8}")
  write_json(args.json, {"config": args.config, "overrides": args.overrides, "steps": args.steps, "skip": args.skip,
                         "rounds": args.rounds, "rows": rows})


if __name__ == "__main__":
  main()
