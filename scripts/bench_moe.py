# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Median training step time of a tiny MoE model: NVFP4 experts (emulated te_nvfp4) vs BF16 experts, per MoE path.

Each row trains in its own subprocess through `python -m MaxText.train` on configs/tiny.yml turned into a
Mixtral-style MoE (4 experts, top-2); the step time is maxtext's `perf/step_time_seconds`, median over the steps
after the first `--skip` (compilation). Baseline: te_nvfp4 with nvfp4_mlp_precision=bf16 (experts BF16, same
quant object and initial weights). Not a test: numbers depend on the machine and its load.

  .venv/bin/python scripts/bench_moe.py [--steps 30] [--json results/bench_moe.json] [key=value ...]
"""

import argparse
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_step import train_step_times, write_json  # noqa: E402  # pylint: disable=wrong-import-position

MOE = ["decoder_block=mixtral", "num_experts=4", "num_experts_per_tok=2", "base_moe_mlp_dim=256",
       "quantization=te_nvfp4", "nvfp4_backend=emulated"]
#: (path, overrides) rows; each path gets a BF16-expert baseline and an NVFP4-expert run.
PATHS = {
    "sparse_matmul=true (ragged_dot)": ["sparse_matmul=true", "megablox=false"],
    "sparse_matmul=false (einsum)": ["sparse_matmul=false"],
}
EXPERTS = {"bf16 experts": ["nvfp4_mlp_precision=bf16"], "nvfp4 experts": []}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--skip", type=int, default=5, help="leading steps left out of the median (compilation)")
  parser.add_argument("--json", type=pathlib.Path, default=pathlib.Path("results/bench_moe.json"))
  parser.add_argument("overrides", nargs="*", help="extra key=value for every run")
  args = parser.parse_args()

  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for path, path_overrides in PATHS.items():
      for experts, expert_overrides in EXPERTS.items():
        name = f"p{len(rows)}"
        times = train_step_times("configs/tiny.yml", name, [*MOE, *path_overrides, *expert_overrides, *args.overrides],
                                 args.steps, pathlib.Path(tmp))
        rows.append({"path": path, "experts": experts, "median_step_s": statistics.median(times[args.skip:]),
                     "steps_timed": len(times[args.skip:])})
        print(f"  {path}, {experts}: {rows[-1]['median_step_s'] * 1e3:.1f} ms", flush=True)
  for r in rows:
    base = next(b["median_step_s"] for b in rows if b["path"] == r["path"] and b["experts"] == "bf16 experts")
    r["x_bf16_experts"] = r["median_step_s"] / base

  print(f"\nmedian step time, tiny Mixtral-style MoE ({args.steps} steps, first {args.skip} skipped)")
  print(f"{'MoE path':<34}{'experts':<15}{'ms/step':>9}{'x bf16':>8}")
  for r in rows:
    print(f"{r['path']:<34}{r['experts']:<15}{r['median_step_s'] * 1e3:>9.1f}{r['x_bf16_experts']:>8.2f}")
  write_json(args.json, {"moe": MOE, "overrides": args.overrides, "steps": args.steps, "skip": args.skip,
                         "rows": rows})


if __name__ == "__main__":
  main()
