# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Forward + backward time of one GEMM: emulated NVFP4 against plain BF16 and JAX's own NVFP4, in one run.

Each mode computes y = x W, dx and dW (one jax.vjp) for x: M x K, W: K x N and dY: M x N, all bfloat16 as
maxtext's DenseGeneral passes them (it casts the f32 kernel to the compute dtype before the GEMM). Modes:
  bf16              plain `x @ w` (the baseline every row is divided by)
  bf16_3d           the same GEMM as maxtext's unquantized DenseGeneral calls it: `lax.dot_general` on x viewed
                    as 3D (batch 4, seq, embed); XLA:CPU runs its backward on a much slower path than the 2D one
  te_nvfp4          nvfp4_dot_general, NVIDIA's recipe (2D weights, RHT and stochastic rounding in wgrad)
  te_nvfp4_no_rht   the same without RHT
  te_nvfp4_fused    the same quantized operands (bit for bit) multiplied by `jax.nn.scaled_matmul` on their codes
                    and scales: the fused backend's GEMM away from Blackwell (a dequantize + dot there too)
  jax_nvfp4         `jax.nn.scaled_dot_general` with JAX's nvfp4 config (it quantizes as it sees fit; no RHT,
                    no SR, no 2D weights: a reference point for what a library emulation costs here)
Calls are timed round-robin (one call of each mode per repeat), so load from other processes hits every mode
alike; each mode reports its median. Issue 11's target on CPU: te_nvfp4 <= 1.4x bf16 at 2048^3.

  .venv/bin/python scripts/bench_gemm.py [--size 2048] [--repeats 10] [--json results/bench_gemm.json]
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

from MaxText.nvfp4.gemm import MATMUL_DIMS, GemmRecipe, nvfp4_dot_general, scaled_matmul_gemm  # noqa: E402  pylint: disable=wrong-import-position


def _modes(key: jax.Array) -> dict[str, Callable[[jax.Array, jax.Array], jax.Array]]:
  jax_nvfp4 = [jax.nn.get_scaled_dot_general_config("nvfp4", jnp.array([1.0], jnp.float32))] * 3
  return {
      "bf16": lambda x, w: x @ w,
      "bf16_3d": lambda x, w: jax.lax.dot_general(x.reshape(4, -1, x.shape[-1]), w, (((2,), (0,)), ((), ())))
                 .reshape(x.shape[0], w.shape[1]),
      "te_nvfp4": lambda x, w: nvfp4_dot_general(x, w, MATMUL_DIMS, key=key, recipe=GemmRecipe()),
      "te_nvfp4_no_rht": lambda x, w: nvfp4_dot_general(x, w, MATMUL_DIMS, key=key, recipe=GemmRecipe(rht=False)),
      "te_nvfp4_fused": lambda x, w: nvfp4_dot_general(x, w, MATMUL_DIMS, key=key, recipe=GemmRecipe(),
                                                      block_gemm=scaled_matmul_gemm),
      "jax_nvfp4": lambda x, w: jax.nn.scaled_dot_general(x, w, MATMUL_DIMS, preferred_element_type=x.dtype,
                                                          configs=jax_nvfp4),
  }


def _fwd_bwd(f: Callable[[jax.Array, jax.Array], jax.Array]) -> Callable[..., tuple[jax.Array, ...]]:
  def step(x: jax.Array, w: jax.Array, dy: jax.Array) -> tuple[jax.Array, ...]:
    y, pullback = jax.vjp(f, x, w)
    return (y, *pullback(dy))

  return jax.jit(step)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=None, help="M = K = N (default: 2048 on CPU, 8192 on GPU)")
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--json", type=pathlib.Path, default=pathlib.Path("results/bench_gemm.json"))
  args = parser.parse_args()

  device = jax.devices()[0]
  size = args.size or (2048 if device.platform == "cpu" else 8192)
  kx, kw, kd = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (size, size), jnp.bfloat16)
  w = (jax.random.normal(kw, (size, size), jnp.float32) * size**-0.5).astype(jnp.bfloat16)
  dy = jax.random.normal(kd, (size, size), jnp.bfloat16)

  steps, skipped = {}, {}
  for name, f in _modes(jax.random.key(1)).items():
    try:
      steps[name] = _fwd_bwd(f)
      jax.block_until_ready(steps[name](x, w, dy))  # compile + warm-up
    except Exception as e:  # pylint: disable=broad-exception-caught  # a JAX build without this mode: say so
      skipped[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
      steps.pop(name)
  samples: dict[str, list[float]] = {name: [] for name in steps}
  for _ in range(args.repeats):
    for name, step in steps.items():
      start = time.perf_counter()
      jax.block_until_ready(step(x, w, dy))
      samples[name].append(time.perf_counter() - start)

  base = statistics.median(samples["bf16"])
  rows = [{"mode": name, "median_ms": statistics.median(s) * 1e3, "x_bf16": statistics.median(s) / base}
          for name, s in samples.items()]
  print(f"GEMM forward + backward, {size}^3 bf16 on {device.platform} ({getattr(device, 'device_kind', '')}), "
        f"median of {args.repeats}, round-robin")
  print(f"{'mode':<18}{'ms':>10}{'x bf16':>8}")
  for r in rows:
    print(f"{r['mode']:<18}{r['median_ms']:>10.1f}{r['x_bf16']:>8.2f}")
  for name, why in skipped.items():
    print(f"{name:<18}  not run: {why}")

  args.json.parent.mkdir(parents=True, exist_ok=True)
  args.json.write_text(json.dumps({
      "size": size, "dtype": "bfloat16", "repeats": args.repeats, "platform": device.platform,
      "device_kind": getattr(device, "device_kind", ""), "host": platform.node(), "jax": jax.__version__,
      "rows": rows, "skipped": skipped,
  }, indent=2))
  print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
