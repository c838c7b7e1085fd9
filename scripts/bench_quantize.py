# Copyright 2026 The NVFP4-for-MaxText Authors. Licensed under the Apache License, Version 2.0.
"""Throughput of NVFP4 quantize per mode against a one-pass cast baseline; prints a table, writes JSON.

The baseline is the least any quantizer must do: read the bf16 tensor once, convert, write FP4
(`x.astype(jnp.float4_e2m1fn)`). Each mode's time is reported as a multiple of it; on GPU also as the
fraction of HBM bandwidth reached (bytes read + written / time; peak from --hbm-gbps).

  .venv/bin/python scripts/bench_quantize.py [--size 4096] [--repeats 20] [--json results/bench_quantize.json]
"""

import argparse
import json
import pathlib
import platform
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from MaxText.nvfp4 import quantize

#: Peak HBM bandwidth in GB/s of GPUs we may be handed (vendor figures), for the bandwidth fraction.
_HBM_GBPS = {"H100": 3350.0, "H200": 4800.0, "B200": 8000.0, "GB200": 8000.0}


def _modes(key: jax.Array) -> dict[str, Callable[[jax.Array], object]]:
  return {
      "baseline astype(e2m1)": lambda x: x.astype(jnp.float4_e2m1fn),
      "1d": lambda x: quantize(x, "1d"),
      "2d": lambda x: quantize(x, "2d"),
      "1d+rht": lambda x: quantize(x, "1d", rht=True),
      "1d+sr": lambda x: quantize(x, "1d", stochastic_rounding=True, key=key),
  }


def _bytes_moved(n: int, x_bytes: int) -> int:
  """Read x once, write 4-bit data plus one e4m3 scale per 16 elements."""
  return n * x_bytes + n // 2 + n // 16


def _time(fn: Callable[[jax.Array], object], x: jax.Array, repeats: int) -> float:
  jitted = jax.jit(fn)
  jax.block_until_ready(jitted(x))  # compile + warm-up
  jax.block_until_ready(jitted(x))
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(jitted(x))
    samples.append(time.perf_counter() - start)
  return statistics.median(samples)


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

  rows = []
  base_s = None
  for name, fn in _modes(jax.random.key(1)).items():
    seconds = _time(fn, x, args.repeats)
    base_s = base_s or seconds
    gbps = _bytes_moved(x.size, x.dtype.itemsize) / seconds / 1e9
    rows.append({
        "mode": name,
        "median_ms": seconds * 1e3,
        "x_baseline": seconds / base_s,
        "gb_per_s": gbps,
        "hbm_fraction": gbps / peak if peak else None,
    })

  print(f"quantize {size}x{size} bf16 on {device.platform} ({getattr(device, 'device_kind', '')}), "
        f"median of {args.repeats}")
  print(f"{'mode':<24}{'ms':>10}{'x baseline':>12}{'GB/s':>10}{'HBM frac':>10}")
  for r in rows:
    frac = f"{r['hbm_fraction']:.2f}" if r["hbm_fraction"] is not None else "-"
    print(f"{r['mode']:<24}{r['median_ms']:>10.2f}{r['x_baseline']:>12.2f}{r['gb_per_s']:>10.2f}{frac:>10}")

  args.json.parent.mkdir(parents=True, exist_ok=True)
  args.json.write_text(json.dumps({
      "size": size, "dtype": "bfloat16", "repeats": args.repeats, "platform": device.platform,
      "device_kind": getattr(device, "device_kind", ""), "host": platform.node(), "jax": jax.__version__,
      "rows": rows,
  }, indent=2))
  print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
