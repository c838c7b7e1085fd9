# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Median training step time of one config under several precisions, in one run; prints a table, writes JSON.

Each precision trains in its own subprocess through `python -m MaxText.train` (maxtext's own trainer), and
the step time is maxtext's own `perf/step_time_seconds` from the metrics file, median over the steps after
the first `--skip` (compilation). The BF16 baseline keeps a quant object (te_nvfp4 with
nvfp4_mlp_precision=bf16) so every row has the same initial weights and the same module structure; every row
is reported as a multiple of it (issue 11's target: te_nvfp4 and te_nvfp4_no_rht <= 1.10x) and of fp8.
With --rounds R the precisions run R times in turn and each keeps its lowest median: other processes on a
shared machine slow whichever run they overlap, and the fastest round is the least disturbed. The JSON keeps each
row's losses too; `--precisions ... te_nvfp4_fused` adds the fused backend (nvfp4_backend=fused), and the table then
gives its largest loss difference from te_nvfp4 (the same quantized operands, another GEMM). The runs use jax's CPU
backend unless JAX_PLATFORMS says otherwise: on a GPU, `JAX_PLATFORMS=cuda ... hardware=gpu`.

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
    "te_nvfp4_fused": ["quantization=te_nvfp4", "nvfp4_backend=fused"],
}
#: what runs unless --precisions says otherwise (the fused backend is asked for by name)
DEFAULT_PRECISIONS = ["bf16", "fp8", "te_nvfp4", "te_nvfp4_no_rht"]
_BASELINE = "bf16"


def train_metrics(config: str, name: str, overrides: list[str], steps: int, out: pathlib.Path) -> list[dict]:
  """Trains `config` with `overrides` in a subprocess; returns maxtext's metrics, one dict per step."""
  metrics = out / f"{name}.jsonl"
  metrics.unlink(missing_ok=True)
  cmd = [sys.executable, "-m", "MaxText.train", config, f"run_name={name}", f"base_output_directory={out}",
         f"steps={steps}", f"metrics_file={metrics}", "enable_checkpointing=false", *overrides]
  proc = subprocess.run(cmd, cwd=_REPO, capture_output=True, text=True, check=False,
                        env=dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu")))
  if proc.returncode:
    raise SystemExit(f"{pathlib.Path(sys.argv[0]).stem}: {name} failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
  return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def step_times(metrics: list[dict]) -> list[float]:
  """maxtext's per-step times in seconds, from `train_metrics`."""
  return [float(m["perf/step_time_seconds"]) for m in metrics]


def train_step_times(config: str, name: str, overrides: list[str], steps: int, out: pathlib.Path) -> list[float]:
  """maxtext's per-step times of `train_metrics` (also used by bench_moe and bench_stats)."""
  return step_times(train_metrics(config, name, overrides, steps, out))


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
  parser.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=DEFAULT_PRECISIONS)
  parser.add_argument("--json", type=pathlib.Path, default=pathlib.Path("results/bench_step.json"))
  parser.add_argument("overrides", nargs="*", help="extra key=value for every run")
  args = parser.parse_args()
  config = str(pathlib.Path(args.config).resolve())
  names = [_BASELINE] + [p for p in args.precisions if p != _BASELINE]

  medians: dict[str, list[float]] = {name: [] for name in names}
  losses: dict[str, list[float]] = {}
  with tempfile.TemporaryDirectory() as tmp:
    for round_ in range(args.rounds):
      for name in names:
        metrics = train_metrics(config, name, [*PRECISIONS[name], *args.overrides], args.steps, pathlib.Path(tmp))
        times = step_times(metrics)
        losses[name] = [float(m["learning/loss"]) for m in metrics]  # the same every round: fixed seeds
        medians[name].append(statistics.median(times[args.skip:]))
        print(f"  round {round_ + 1}: {name}: {medians[name][-1] * 1e3:.1f} ms", flush=True)
  rows = [{"precision": name, "median_step_s": min(m), "round_medians_s": m, "steps_timed": args.steps - args.skip,
           "losses": losses[name]} for name, m in medians.items()]
  base = rows[0]["median_step_s"]
  fp8 = next((r["median_step_s"] for r in rows if r["precision"] == "fp8"), None)
  for r in rows:
    r["x_bf16"] = r["median_step_s"] / base
    r["x_fp8"] = r["median_step_s"] / fp8 if fp8 else None

  print(f"\nmedian step time, {args.config} {' '.join(args.overrides)} ({args.steps} steps, first {args.skip} "
        f"skipped, best of {args.rounds} round(s)); bf16 = te_nvfp4 with nvfp4_mlp_precision=bf16")
  print(f"{'precision':<18}{'ms/step':>10}{'x bf16':>8}{'x fp8':>8}{'last loss':>11}")
  for r in rows:
    x_fp8 = f"{r['x_fp8']:.2f}" if r["x_fp8"] else "-"
    print(f"{r['precision']:<18}{r['median_step_s'] * 1e3:>10.1f}{r['x_bf16']:>8.2f}{x_fp8:>8}{r['losses'][-1]:>11.4f}")
  if "te_nvfp4" in losses and "te_nvfp4_fused" in losses:  # the same quantized operands; only the GEMM differs
    gap = max(abs(a - b) for a, b in zip(losses["te_nvfp4"], losses["te_nvfp4_fused"], strict=True))
    print(f"te_nvfp4_fused against te_nvfp4: largest loss difference over {args.steps} steps {gap:.3g} nats")
  write_json(args.json, {"config": args.config, "overrides": args.overrides, "steps": args.steps, "skip": args.skip,
                         "rounds": args.rounds, "rows": rows})


if __name__ == "__main__":
  main()
