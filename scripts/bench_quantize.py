# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Throughput of NVFP4 quantize per mode against a one-pass cast baseline; prints a table, writes JSON.

The baseline is the least any quantizer must do: read the bf16 tensor once, convert, write FP4
(`x.astype(jnp.float4_e2m1fn)`). Each mode's time is reported as a multiple of it (issue 11's target: every
mode <= 1.3x), and as GB/s (bytes read + written / time); on GPU also as the fraction of HBM bandwidth reached
(peak from --hbm-gbps). A copy (`x + 0`, read and write bf16) is the memory floor of this machine. The
`block_scaled` rows are what the emulated GEMM quantizes (bf16 e2m1 * e4m3 operands, no float4 data), with the
wgrad operands' in-place layout (`axis=0`: blocks along M, RHT, SR). Calls are timed round-robin (one call of
each mode per repeat), so load from other processes hits every mode alike; each mode reports its median.

  .venv/bin/python scripts/bench_quantize.py [--size 4096] [--repeats 20] [--json results/bench_quantize.json]
"""

import argparse
import json
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

_REPO = pathlib.Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:
  sys.path.insert(0, str(_REPO))  # run as a file from the repo root: import this checkout's MaxText

# pylint: disable=wrong-import-position
from MaxText.nvfp4 import quantize  # noqa: E402
from MaxText.nvfp4.block_scaled import quantize_block_scaled  # noqa: E402

#: Peak HBM bandwidth in GB/s of GPUs we may be handed (vendor figures), for the bandwidth fraction.
_HBM_GBPS = {"H100": 3350.0, "H200": 4800.0, "B200": 8000.0, "GB200": 8000.0}


#: The cast baseline's name; every mode is divided by its time.
_BASELINE = "cast astype(e2m1)"


def _modes(key: jax.Array) -> dict[str, tuple[Callable[[jax.Array], object], str]]:
  """name -> (function of x, what it writes: 'fp4' data + scales, 'bf16' values, or 'copy')."""
  return {
      _BASELINE: (lambda x: x.astype(jnp.float4_e2m1fn), "cast"),
      "copy x + 0": (lambda x: x + 0, "copy"),
      "1d": (lambda x: quantize(x, "1d"), "fp4"),
      "2d": (lambda x: quantize(x, "2d"), "fp4"),
      "1d+rht": (lambda x: quantize(x, "1d", rht=True), "fp4"),
      "1d+sr": (lambda x: quantize(x, "1d", stochastic_rounding=True, key=key), "fp4"),
      "block_scaled 1d": (lambda x: quantize_block_scaled(x, "1d"), "bf16"),
      "block_scaled axis0+rht+sr": (
          lambda x: quantize_block_scaled(x, "1d", rht=True, stochastic_rounding=True, key=key, axis=0), "bf16"),
  }


def _bytes_moved(n: int, x_bytes: int, writes: str) -> int:
  """Read x once, then write: a copy of x, 4-bit data (plus one e4m3 scale per 16 for quantize), or bf16."""
  return n * x_bytes + {"copy": n * x_bytes, "cast": n // 2, "fp4": n // 2 + n // 16, "bf16": 2 * n}[writes]


def _time_round_robin(fns: dict[str, Callable[[jax.Array], object]], x: jax.Array, repeats: int) -> dict[str, float]:
  jitted = {name: jax.jit(fn) for name, fn in fns.items()}
  for f in jitted.values():
    jax.block_until_ready(f(x))  # compile + warm-up
  samples: dict[str, list[float]] = {name: [] for name in fns}
  for _ in range(repeats):
    for name, f in jitted.items():
      start = time.perf_counter()
      jax.block_until_ready(f(x))
      samples[name].append(time.perf_counter() - start)
  return {name: statistics.median(s) for name, s in samples.items()}


def _peak_gbps(device: jax.Device, override: float | None) -> float | None:
  if override:
    return override
  kind = getattr(device, "device_kind", "")
  return next((v for k, v in _HBM_GBPS.items() if k in kind), None)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=None, help="square size (default: 4096 on CPU, 8192 on GPU)")
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--hbm-gbps", type=float, default=None, help="peak HBM GB/s (default: known GPUs)")
  parser.add_argument("--json", type=pathlib.Path, default=pathlib.Path("results/bench_quantize.json"))
  args = parser.parse_args()

  device = jax.devices()[0]
  size = args.size or (4096 if device.platform == "cpu" else 8192)
  x = jax.random.normal(jax.random.key(0), (size, size), jnp.bfloat16)
  peak = _peak_gbps(device, args.hbm_gbps) if device.platform == "gpu" else None

  modes = _modes(jax.random.key(1))
  seconds = _time_round_robin({name: fn for name, (fn, _) in modes.items()}, x, args.repeats)
  rows = []
  for name, (_, writes) in modes.items():
    gbps = _bytes_moved(x.size, x.dtype.itemsize, writes) / seconds[name] / 1e9
    rows.append({
        "mode": name,
        "median_ms": seconds[name] * 1e3,
        "x_baseline": seconds[name] / seconds[_BASELINE],
        "gb_per_s": gbps,
        "hbm_fraction": gbps / peak if peak else None,
    })

  print(f"quantize {size}x{size} bf16 on {device.platform} ({getattr(device, 'device_kind', '')}), "
        f"median of {args.repeats}, round-robin")
  print(f"{'mode':<28}{'ms':>10}{'x cast':>8}{'GB/s':>8}{'HBM frac':>10}")
  for r in rows:
    frac = f"{r['hbm_fraction']:.2f}" if r["hbm_fraction"] is not None else "-"
    print(f"{r['mode']:<28}{r['median_ms']:>10.2f}{r['x_baseline']:>8.2f}{r['gb_per_s']:>8.2f}{frac:>10}")

  args.json.parent.mkdir(parents=True, exist_ok=True)
  args.json.write_text(json.dumps({
      "size": size, "dtype": "bfloat16", "repeats": args.repeats, "platform": device.platform,
      "device_kind": getattr(device, "device_kind", ""), "host": platform.node(), "jax": jax.__version__,
      "rows": rows,
  }, indent=2))
  print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
