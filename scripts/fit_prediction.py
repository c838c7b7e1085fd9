# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Fits the calibrated step's few constants to a declared subset of NVIDIA's published maxtext figures, and reports
the held-out figures beside the fitted ones (MaxText.preflight.calibration says what each constant is).

  .venv/bin/python scripts/fit_prediction.py           # the fit, the hold-out and leave-one-out, printed
  .venv/bin/python scripts/fit_prediction.py --write   # also MaxText/preflight/calibration.json, and docs/prediction.md's
                                                       # table between its markers

Why a fit at all, and why so small: the cited factors (the GEMM library's and the attention kernel's share of the
peak, nccl-tests' bus bandwidth) come from microbenchmarks, and a training step is not a microbenchmark; three
constants say how far it falls short (`gemm_scale`, `memory_efficiency`, `launch_seconds`). The figures are eight:
model TFLOP/s per GPU of FP8 and of every-GEMM NVFP4 (upstream maxtext's te_nvfp4, the published program) for
Llama 3 8B and Llama 3.1 405B on GB200 and GB300 (scripts/predict_speedup.py's POINTS). The constants are fitted on
all eight (FIT_ON); each figure is held out once (leave-one-out: predicted by the constants fitted on the other
seven), which is the prediction error reported as held out. A second hold-out crosses GPUs: the constants fitted on
the GB200 figures alone (TRANSFER_FROM) predict the GB300 ones, where the FP4 peak, the network and the memory move.
The fit minimises the squared log error of TFLOP/s.

The programs are not compiled here: scripts/predict_speedup.py --records docs/figures/prediction/published compiled
them (about 12 compiles, 10 minutes on 2 cores) and kept each program's kernels as the calibrated model reads them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import optimize

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

# pylint: disable=wrong-import-position
from MaxText.preflight import calibration  # noqa: E402
from MaxText.preflight.targets import TARGETS  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "figures" / "prediction" / "published"
DOC = ROOT / "docs" / "prediction.md"
BEGIN = "<!-- begin: scripts/fit_prediction.py writes this table from docs/figures/prediction/published/ -->"
END = "<!-- end: scripts/fit_prediction.py -->"
#: The declared fit subset: the figures on these GPUs (every published one; each is also held out once).
FIT_ON = ("gb200", "gb300")
#: The cross-GPU hold-out: fitted on these GPUs' figures alone, the others predicted.
TRANSFER_FROM = ("gb200",)
#: The published programs, by the name predict_speedup keeps their records under, and the column they fill.
PROGRAMS = {"fp8": "fp8", "nvfp4_every_gemm": "nvfp4"}
#: The constants' names, starting values and bounds (launch gap in microseconds while fitting).
_START = {"gemm_scale": (0.85, 0.3, 1.3), "memory_efficiency": (0.8, 0.3, 1.0), "launch_seconds": (2.0, 0.0, 30.0)}


class Figure:
  """One published figure (a program at a point) and the kernels that predict it."""

  def __init__(self, point: Mapping[str, Any], program: str) -> None:
    self.point = str(point["point"])
    self.program = program
    self.target = str(point["target"])
    self.published = float(point["published_tflops_per_gpu"][PROGRAMS[program]])
    self.model_tflops = float(point["model_tflops_per_step"])
    self.kernels = calibration.from_records(point["records"][program])

  @property
  def label(self) -> str:
    return f"{self.point} {'FP8' if self.program == 'fp8' else 'NVFP4'}"

  @property
  def fitted(self) -> bool:
    return self.target in FIT_ON

  @property
  def transferred(self) -> bool:
    """Held out of the cross-GPU fit."""
    return self.target not in TRANSFER_FROM

  def predict(self, factors: calibration.Factors) -> tuple[float, float, float]:
    """(TFLOP/s per GPU, and its interval: none hidden, all hidden)."""
    step = calibration.step(self.kernels, TARGETS[self.target], factors)
    low, high = step.interval
    return self.model_tflops / step.step_seconds, self.model_tflops / high, self.model_tflops / low


def load(directory: pathlib.Path = RECORDS) -> list[Figure]:
  """Every published figure with kept records, in the points' order (8B before 405B, GB200 before GB300)."""
  figures = []
  for path in sorted(directory.glob("*.json"), key=lambda p: ("405b" in p.name, p.name)):
    point = json.loads(path.read_text(encoding="utf-8"))
    figures += [Figure(point, program) for program in PROGRAMS]
  return figures


def _factors(x: Sequence[float]) -> calibration.Factors:
  values = dict(zip(_START, x))
  values["launch_seconds"] *= 1e-6
  return calibration.Factors(**values)


def fit(figures: Sequence[Figure]) -> calibration.Factors:
  """The constants that minimise the squared log error of `figures`' TFLOP/s."""

  def residuals(x: np.ndarray) -> np.ndarray:
    factors = _factors(x)
    return np.array([math.log(f.predict(factors)[0] / f.published) for f in figures])

  start, low, high = (np.array(column, dtype=float) for column in zip(*_START.values()))
  solved = optimize.least_squares(residuals, start, bounds=(low, high), x_scale=[0.1, 0.1, 1.0], xtol=1e-12,
                                  ftol=1e-12, gtol=1e-12)
  return _factors([round(float(v), 6) for v in solved.x])


def report(figures: Sequence[Figure]) -> dict[str, Any]:
  """The fit on FIT_ON, every figure predicted with it, and each figure predicted by the fit on the other seven."""
  fitted = fit([f for f in figures if f.fitted])
  rows = []
  for figure in figures:
    value, low, high = figure.predict(fitted)
    rows.append({"figure": figure.label, "point": figure.point, "program": figure.program,
                 "role": "fitted" if figure.fitted else "held out", "published": figure.published,
                 "predicted": value, "interval": [low, high], "error": value / figure.published - 1})
  for i, row in enumerate(rows):
    others = fit([f for j, f in enumerate(figures) if j != i and f.fitted])
    value = figures[i].predict(others)[0]
    row["leave_one_out"] = value
    row["leave_one_out_error"] = value / figures[i].published - 1
  across = fit([f for f in figures if not f.transferred])
  for figure, row in zip(figures, rows):
    value = figure.predict(across)[0]
    row["across_gpus"] = {"role": "held out" if figure.transferred else "fitted", "predicted": value,
                          "error": value / figure.published - 1}
  ratios = []
  for fp8, nvfp4 in zip(rows[::2], rows[1::2]):
    ratios.append({"point": fp8["point"], "published": nvfp4["published"] / fp8["published"],
                   "predicted": nvfp4["predicted"] / fp8["predicted"],
                   "error": (nvfp4["predicted"] / fp8["predicted"]) / (nvfp4["published"] / fp8["published"]) - 1})
  return {"values": {name: getattr(fitted, name) for name in _START}, "fit_on": list(FIT_ON), "figures": rows,
          "ratios": ratios, "across_gpus": {"fit_on": list(TRANSFER_FROM),
                                            "values": {name: getattr(across, name) for name in _START}}}


def table(result: Mapping[str, Any]) -> str:
  """docs/prediction.md's table: each figure, published against predicted (with its interval), then held out (by
  the fit on the other seven, and by the fit on the other GPU's figures); then the ratios and the constants."""
  across = result["across_gpus"]
  source = ", ".join(t.upper() for t in across["fit_on"])
  lines = ["| figure | published TF/s/GPU | predicted | error | interval (none .. all hidden) | held out: fit on the "
           f"other seven | error | fit on {source} only | error |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in result["figures"]:
    low, high = r["interval"]
    other = r["across_gpus"]
    mark = "" if other["role"] == "held out" else " (fitted)"
    lines.append(f"| {r['figure']} | {r['published']:,.0f} | {r['predicted']:,.0f} | {r['error']:+.0%} | "
                 f"{low:,.0f} .. {high:,.0f} | {r['leave_one_out']:,.0f} | {r['leave_one_out_error']:+.0%} | "
                 f"{other['predicted']:,.0f}{mark} | {other['error']:+.0%} |")
  lines += ["", "| point | published NVFP4 / FP8 | predicted | error |", "|---|---:|---:|---:|"]
  for r in result["ratios"]:
    lines.append(f"| {r['point']} | {r['published']:.2f}x | {r['predicted']:.2f}x | {r['error']:+.0%} |")

  def constants(values: Mapping[str, float]) -> str:
    return (f"gemm_scale {values['gemm_scale']:.3f}, memory_efficiency {values['memory_efficiency']:.3f}, "
            f"launch_seconds {values['launch_seconds'] * 1e6:.2f} us")

  lines += ["", f"Fitted on all eight: {constants(result['values'])}. Fitted on {source} only: "
            f"{constants(across['values'])}."]
  return "\n".join(lines)


def write(result: Mapping[str, Any]) -> None:
  """calibration.json (the constants and what they were fitted on) and the doc's table."""
  payload = {"values": result["values"], "fit_on": result["fit_on"],
             "fitted_by": "scripts/fit_prediction.py --write", "records": str(RECORDS.relative_to(ROOT)),
             "date": datetime.date.today().isoformat(), "figures": result["figures"], "ratios": result["ratios"],
             "across_gpus": result["across_gpus"]}
  calibration.FITTED.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
  text = DOC.read_text(encoding="utf-8")
  start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
  DOC.write_text(text[:start] + "\n" + table(result) + "\n" + text[end:], encoding="utf-8")


def main(argv: Sequence[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--write", action="store_true", help="write calibration.json and the doc's table")
  args = parser.parse_args(argv)
  figures = load()
  if not figures:
    print(f"fit_prediction: no records in {RECORDS}; run scripts/predict_speedup.py --records {RECORDS}",
          file=sys.stderr)
    return 2
  result = report(figures)
  print(table(result))
  if args.write:
    write(result)
    print(f"wrote {calibration.FITTED.relative_to(ROOT)} and {DOC.relative_to(ROOT)}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
