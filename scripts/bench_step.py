# Copyright 2026 The NVFP4-for-MaxText Authors. Licensed under the Apache License, Version 2.0.
"""Median training step time of one config under several precisions, in one run; prints a table, writes JSON.

Each precision trains in its own subprocess through `python -m MaxText.train` (maxtext's own trainer), and
the step time is maxtext's own `perf/step_time_seconds` from the metrics file, median over the steps after
the first `--skip` (compilation). The BF16 baseline keeps a quant object (te_nvfp4 with
nvfp4_mlp_precision=bf16) so every row has the same initial weights and the same module structure.

  .venv/bin/python scripts/bench_step.py [--config configs/tiny.yml] [--steps 60] [--json results/bench_step.json]
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

#: name -> CLI overrides
PRECISIONS = {
    "bf16 (quant object)": ["quantization=te_nvfp4", "nvfp4_mlp_precision=bf16"],
    "fp8": ["quantization=fp8"],
    "te_nvfp4": ["quantization=te_nvfp4"],
    "te_nvfp4_no_rht": ["quantization=te_nvfp4_no_rht"],
}


def _train(config: str, name: str, overrides: list[str], steps: int, out: pathlib.Path) -> list[float]:
  metrics = out / f"{name.split()[0]}.jsonl"
  cmd = [sys.executable, "-m", "MaxText.train", config, f"run_name={name.split()[0]}", f"base_output_directory={out}",
         f"steps={steps}", f"metrics_file={metrics}", "enable_checkpointing=false", *overrides]
  proc = subprocess.run(cmd, cwd=_REPO, capture_output=True, text=True, check=False,
                        env=dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu")))
  if proc.returncode:
    raise SystemExit(f"bench_step: {name} failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
  rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
  return [float(r["perf/step_time_seconds"]) for r in rows]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/tiny.yml")
  parser.add_argument("--steps", type=int, default=60)
  parser.add_argument("--skip", type=int, default=5, help="leading steps left out of the median (compilation)")
  parser.add_argument("--json", type=pathlib.Path, default=pathlib.Path("results/bench_step.json"))
  parser.add_argument("overrides", nargs="*", help="extra key=value for every run")
  args = parser.parse_args()

  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for name, overrides in PRECISIONS.items():
      times = _train(args.config, name, [*overrides, *args.overrides], args.steps, pathlib.Path(tmp))
      rows.append({"precision": name, "median_step_s": statistics.median(times[args.skip:]),
                   "steps_timed": len(times[args.skip:])})
      print(f"  {name}: {rows[-1]['median_step_s'] * 1e3:.1f} ms", flush=True)
  fp8 = next(r["median_step_s"] for r in rows if r["precision"] == "fp8")
  for r in rows:
    r["x_fp8"] = r["median_step_s"] / fp8

  print(f"\nmedian step time, {args.config} {' '.join(args.overrides)} ({args.steps} steps, first {args.skip} skipped)")
  print(f"{'precision':<22}{'ms/step':>10}{'x fp8':>8}")
  for r in rows:
    print(f"{r['precision']:<22}{r['median_step_s'] * 1e3:>10.1f}{r['x_fp8']:>8.2f}")
  args.json.parent.mkdir(parents=True, exist_ok=True)
  args.json.write_text(json.dumps({"config": args.config, "overrides": args.overrides, "steps": args.steps,
                                   "skip": args.skip, "host": platform.node(), "cpus": os.cpu_count(),
                                   "rows": rows}, indent=2))
  print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
