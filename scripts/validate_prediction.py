# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Measured against predicted on one Hopper GPU: maxtext's real train step in BF16 and FP8, timed, beside the
pre-flight's calibrated prediction of the same programs (scripts/validate_prediction.sh runs it).

  python scripts/validate_prediction.py --target h100 [--steps 25] [--warmup 5] [--json PATH] [--out DIR]

For each precision (BF16: `quantization=`; FP8: maxtext's `quantization=fp8`) it trains configs/validate.yml for
`--steps` steps on this machine's GPU (python -m MaxText.train, synthetic data, 4 layers of Llama 3 8B: MODEL) and
reads maxtext's own per-step lines
("completed step: N, seconds: S, TFLOP/s/device: T"), the median over the steps after `--warmup`; then it runs the
pre-flight for the target (python -m MaxText.preflight configs/validate.yml --target T --devices 1
--predict-against fp8 --json, compiled on the CPU with the CUDA plugin's description of the GPU) and prints measured
beside predicted: step time, the interval, the roofline, TFLOP/s per GPU, and the error. Why: the calibration's
factors are cited or fitted on NVIDIA's Blackwell figures; a Hopper step measured here is the one figure we can take
ourselves, and it tests the model on a GPU it was not fitted on.

Exit 2 with one line when a training run fails or prints no step lines.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = "configs/validate.yml"
#: The model's keys over CONFIG (maxtext takes a model's keys from the command line only).
MODEL = ("base_num_decoder_layers=4",)
#: The precisions timed: the pre-flight row that predicts each, and the override that selects it.
PRECISIONS = {"bf16": ("this run", "quantization="), "fp8": ("fp8", "quantization=fp8")}
#: maxtext's per-step line (maxtext/common/metric_logger.py).
_STEP = re.compile(r"completed step: (\d+), seconds: ([0-9.]+), TFLOP/s/device: ([0-9.]+)")


def step_lines(text: str) -> list[tuple[int, float, float]]:
  """(step, seconds, TFLOP/s per device) of each of maxtext's per-step lines in `text`."""
  return [(int(s), float(sec), float(tf)) for s, sec, tf in _STEP.findall(text)]


def measured(text: str, warmup: int) -> dict[str, float]:
  """The median step seconds and TFLOP/s per device over the steps after the first `warmup` (compile and warm-up).

  Raises:
    ValueError: no step after the warm-up was logged.
  """
  rows = [row for row in step_lines(text) if row[0] >= warmup]
  if not rows:
    raise ValueError(f"no 'completed step' line after step {warmup}")
  return {"step_seconds": statistics.median(r[1] for r in rows),
          "tflops_per_gpu": statistics.median(r[2] for r in rows), "steps": len(rows)}


def predicted(payload: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
  """Each precision's prediction from the pre-flight's JSON (`--predict-against fp8`)."""
  prediction = payload["prediction"]
  rows = {"this run": prediction["run"], **prediction["against"]}
  return {name: rows[row] for name, (row, _) in PRECISIONS.items()}


def table(measures: Mapping[str, Mapping[str, float]], predictions: Mapping[str, Mapping[str, Any]],
          target: str) -> list[str]:
  """Measured beside predicted, one row per precision, and the FP8 / BF16 ratio both ways."""
  lines = [f"measured on this GPU against predicted for --target {target} (the calibrated step; interval: all "
           "communication hidden .. none; roofline: the bound):",
           f"  {'precision':<9} {'measured ms':>12} {'predicted ms':>13} {'interval ms':>17} {'roofline ms':>12} "
           f"{'error':>7} {'measured TF/s':>14} {'predicted TF/s':>15}"]
  for name in PRECISIONS:
    m, p = measures[name], predictions[name]
    low, high = p["step_interval_seconds"]
    error = p["step_seconds"] / m["step_seconds"] - 1
    lines.append(f"  {name:<9} {m['step_seconds'] * 1e3:>12.1f} {p['step_seconds'] * 1e3:>13.1f} "
                 f"{low * 1e3:>8.1f}-{high * 1e3:<8.1f} {p['roofline_step_seconds'] * 1e3:>12.1f} {error:>+7.0%} "
                 f"{m['tflops_per_gpu']:>14,.0f} {p['model_tflops_per_gpu']:>15,.0f}")
  ratio_measured = measures["bf16"]["step_seconds"] / measures["fp8"]["step_seconds"]
  ratio_predicted = predictions["bf16"]["step_seconds"] / predictions["fp8"]["step_seconds"]
  lines.append(f"  fp8 over bf16: measured {ratio_measured:.2f}x, predicted {ratio_predicted:.2f}x")
  return lines


def _run(command: list[str], log: pathlib.Path, env: Mapping[str, str]) -> str:
  """Runs `command`, its output kept in `log`; a failure is one line, exit 2."""
  with log.open("w", encoding="utf-8") as out:
    done = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=dict(env), check=False)
  text = log.read_text(encoding="utf-8", errors="replace")
  if done.returncode:
    sys.exit(f"validate_prediction: {' '.join(command[:4])} ... exited {done.returncode}; its output: {log}")
  return text


def main(argv: Sequence[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--target", default="h100", help="the GPU this machine has, as the pre-flight names it")
  parser.add_argument("--steps", type=int, default=25)
  parser.add_argument("--warmup", type=int, default=5, help="steps left out of the median (compile, warm-up)")
  parser.add_argument("--out", type=pathlib.Path, default=ROOT / "results" / "validate_prediction")
  parser.add_argument("--json", type=pathlib.Path)
  args = parser.parse_args(argv)
  if args.steps <= args.warmup:
    sys.exit(f"validate_prediction: --steps {args.steps} must exceed --warmup {args.warmup}")
  args.out.mkdir(parents=True, exist_ok=True)
  start = time.perf_counter()
  measures = {}
  for name, (_, override) in PRECISIONS.items():
    text = _run([sys.executable, "-m", "MaxText.train", CONFIG, *MODEL, override, f"steps={args.steps}",
                 f"base_output_directory={args.out / name}", f"run_name=validate_{name}"],
                args.out / f"train_{name}.log", os.environ)
    try:
      measures[name] = measured(text, args.warmup)
    except ValueError as e:
      sys.exit(f"validate_prediction: the {name} run: {e} ({args.out / f'train_{name}.log'})")
  trained = time.perf_counter() - start
  report = args.out / "preflight.json"
  _run([sys.executable, "-m", "MaxText.preflight", CONFIG, *MODEL, "quantization=", "--target", args.target,
        "--devices", "1", "--predict-against", "fp8", "--json", str(report)], args.out / "preflight.log",
       {**os.environ, "JAX_PLATFORMS": "cpu"})
  predictions = predicted(json.loads(report.read_text(encoding="utf-8")))
  lines = table(measures, predictions, args.target)
  print("\n".join(lines))
  print(f"trained {trained:.0f} s, predicted {time.perf_counter() - start - trained:.0f} s")
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"target": args.target, "measured": measures, "predicted": predictions,
                                     "table": lines}, indent=2) + "\n", encoding="utf-8")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
