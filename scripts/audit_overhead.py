# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What the plugin adds around TransformerEngine's NVFP4 kernels, compiled for Blackwell on this CPU (no GPU).

  .venv-gpu/bin/python scripts/audit_overhead.py [--config configs/recipes/llama3_8b_te_nvfp4.yml] [key=value ...]
      [--target b200] [--devices 8] [--json PATH]

Two views, both from programs XLA's GPU compiler compiled for the target (MaxText.preflight):
  1. Per MLP GEMM (wi_0, wi_1, wo at the recipe's per-device shapes: M = per_device_batch_size x
     max_target_length tokens), forward and both gradients, alone in a program: the plugin's TE module against a
     bare `transformer_engine.jax.dense.dense` with the same recipe's quantizer set. Alone, x is a program input and
     dx a program output, so nothing the plugin adds can fuse into a producer or a consumer: the worst case.
  2. The whole train step of the config for N GPUs, against the same step with the plugin's additions switched off
     (nvfp4_nonfinite_check=false, nvfp4_stats_interval=0): what a run pays, fusion included (the headline
     `added_bytes_fraction`). Also whether the backward quantizes x or W a second time (the remat policy not
     keeping TE's quantized operands): TE's quantize calls in the forward recomputed by remat, which must be none.
`added_bytes_fraction` = bytes the plugin's kernels add / bytes TE's own kernels move (kernel bytes: each
kernel's result plus operands, MaxText.preflight.kernels). Prints a table and, with --json, writes it.
Exit 2 with one line: a config that is not NVFP4 on TE, an unknown target, a device count the config cannot use.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import pathlib
import sys
import time
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

# pylint: disable=wrong-import-position
from MaxText.backends import environment
from MaxText.integration import cli, seam
from MaxText.precision.taps import STATISTICS
from MaxText.preflight import PROG, library, programs, report
from MaxText.preflight import kernels as kernels_lib
from MaxText.preflight.targets import TARGETS

DEFAULT_CONFIG = "configs/recipes/llama3_8b_te_nvfp4.yml"
MLP_GEMMS = ("wi_0", "wi_1", "wo")
QUANTIZE = "te_dbias_quantize_ffi"


def _gemm_programs(k: int, n: int, m: int, settings: Any, device: Any) -> tuple[Any, Any]:
  """(ours, bare): d/dx, d/dW of sum(y^2) for y = x W (x: m x k, W: k x n, bf16) through the plugin's TE module and
  through TE's dense alone, compiled for `device`."""
  # pylint: disable=import-outside-toplevel
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  from jax.sharding import SingleDeviceSharding
  from transformer_engine.jax import dense as te_dense
  from transformer_engine.jax.flax.module import TransformerEngineBase

  from MaxText.backends import te as te_backend
  from MaxText.nvfp4.gemm import MATMUL_DIMS, QUANTIZATION_NAME
  from MaxText.precision.policy import Precision

  dims = MATMUL_DIMS

  class Bare(TransformerEngineBase):
    """transformer_engine.jax.dense.dense with the recipe's quantizer set, nothing around it."""

    @nn.compact
    def __call__(self, x, w, dimension_numbers):
      quantizer_set = self.generate_quantizer_set(
          fp8_recipe=te_backend.recipe_of(Precision.NVFP4, settings.recipe),
          quantization_checkpoint_name=QUANTIZATION_NAME)
      return te_dense.dense(x, w, contracting_dims=dimension_numbers[0], quantizer_set=quantizer_set)

  on = SingleDeviceSharding(device)
  x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16, sharding=on)
  w = jax.ShapeDtypeStruct((k, n), jnp.bfloat16, sharding=on)
  rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1), "sr_rng": jax.random.key(2)}

  def compiled(module):
    variables = jax.eval_shape(lambda a, b: module.init(rngs, a, b, dims), x, w)
    variables = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=on), variables)

    def loss(a, b, v):
      y, _ = module.apply(v, a, b, dims, rngs={"dropout": jax.random.key(3), "sr_rng": jax.random.key(4)},
                          mutable=["aqt", "_overwrite_with_gradient"])
      return jnp.sum(jnp.square(y.astype(jnp.float32)))

    return jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w, variables).compile()

  ours = te_backend.dot_general_cls(Precision.NVFP4, dataclasses.replace(settings, nonfinite_check=True))()
  return compiled(ours), compiled(Bare())


def per_gemm(config: Any, target: str) -> list[dict[str, Any]]:
  """View 1: each MLP GEMM alone, the plugin's module against TE's bare dense."""
  # pylint: disable=import-outside-toplevel
  from MaxText.integration.settings import settings_of
  from MaxText.integration.shapes import gemm_dims
  from MaxText.preflight.compile import target_devices

  (device,) = target_devices(target, 1)
  settings = settings_of(config).with_interval(STATISTICS.key, 0)
  rows = []
  for dims in (d for d in gemm_dims(config, settings) if d.phase == "train"):
    name, m, k, n = dims.module.rsplit("/", 1)[-1], dims.m, dims.k_global, dims.n_global
    start = time.perf_counter()
    ours, bare = _gemm_programs(k, n, m, settings, device)
    overhead = report.Overhead.between(kernels_lib.kernels(ours.as_text()), kernels_lib.kernels(bare.as_text()))
    rows.append({"gemm": name, "m": m, "k": k, "n": n, **overhead.as_dict()})
    print(f"  {name}: M {m} K {k} N {n} compiled twice in {time.perf_counter() - start:.1f} s", flush=True)
  return rows


def quantize_calls(found: list[kernels_lib.Kernel]) -> dict[str, int]:
  """TE's quantize kernels of the step by where they run: the forward, the backward, and the forward recomputed
  in the backward (remat: a name stack with "rematted_computation"), which must be none."""
  calls = [k for k in found if k.target == QUANTIZE]
  by_phase = collections.Counter(kernels_lib.phase(k) for k in calls)
  backward, remat = by_phase["backward"], by_phase["recomputed forward"]
  return {"forward": len(calls) - backward - remat, "backward": backward, "recomputed": remat}


def whole_step(config_path: str, overrides: list[str], target: str, devices: int) -> dict[str, Any]:
  """View 2: the train step with the plugin's additions against the same step without them."""
  config = library.load_config(config_path, overrides, devices)
  ours = library.compile_step(config, target, devices)
  bare_overrides = programs.replaced(overrides, library.BARE_OVERRIDES)
  bare = library.compile_step(library.load_config(config_path, bare_overrides, devices), target, devices)
  found = kernels_lib.kernels(ours.as_text())
  overhead = report.Overhead.between(found, kernels_lib.kernels(bare.as_text()))
  quantizes = quantize_calls(found)
  return {**overhead.as_dict(), "te_quantize_calls": quantizes, "backward_requantizes": quantizes["recomputed"] > 0,
          "memory": report.Memory.of(ours, TARGETS[target]).as_dict()}


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("overrides", nargs="*", help="key=value overrides of the config")
  parser.add_argument("--config", default=DEFAULT_CONFIG)
  parser.add_argument("--target", default="b200")
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--json", type=pathlib.Path)
  args = parser.parse_intermixed_args(argv)
  if args.target not in TARGETS or not TARGETS[args.target].nvfp4:
    library.fail(f"--target {args.target!r}: the audit needs a GPU where TE runs NVFP4: "
                 f"{', '.join(t for t in sorted(TARGETS) if TARGETS[t].nvfp4)}")
  seam.register()
  seam.install_cli_error_handler(cli.one_line_config_errors([PROG, args.config], "audit_overhead"))
  with environment.answering(library.target_environment(args.target, args.devices)):
    return _audit(args)


def _audit(args: argparse.Namespace) -> int:
  """The audit of `args`, with the target's environment answered."""
  config = library.load_config(args.config, args.overrides, args.devices)
  if not library.te_nvfp4(config):
    library.fail(f"{args.config}: the audit needs an NVFP4 config on TE (quantization=te_nvfp4 or "
                 "te_nvfp4_no_rht, nvfp4_mlp_precision=nvfp4, nvfp4_backend=te or auto)")
  print(f"per MLP GEMM, alone, for 1 x {TARGETS[args.target].name}:", flush=True)
  gemms = per_gemm(config, args.target)
  print(f"the whole train step for {args.devices} x {TARGETS[args.target].name}:", flush=True)
  step = whole_step(args.config, args.overrides, args.target, args.devices)

  print(f"\n{'program':<22} {'added kernels':>13} {'added MB':>10} {'TE MB':>10} {'added_bytes_fraction':>21}")
  for row in gemms:
    print(f"{row['gemm'] + ' alone':<22} {len(row['added_kernels']):>13} {row['added_bytes'] / 1e6:>10.1f} "
          f"{row['te_bytes'] / 1e6:>10.1f} {row['added_bytes_fraction']:>21.4f}")
  print(f"{'whole step (a layer)':<22} {len(step['added_kernels']):>13} {step['added_bytes'] / 1e6:>10.1f} "
        f"{step['te_bytes'] / 1e6:>10.1f} {step['added_bytes_fraction']:>21.4f}")
  print(f"TE quantize calls in the step (a layer): {step['te_quantize_calls']} -> "
        + ("the backward quantizes x or W again (remat recomputes them)" if step["backward_requantizes"] else
           "none recomputed in the backward: the remat policy keeps TE's quantized x and W"))
  for row in [*gemms, {"gemm": "whole step", **step}]:
    for kernel in sorted(row["added_kernels"], key=lambda k: -k["bytes"])[:6]:
      print(f"  {row['gemm']:<10} + {kernel['opcode']:<18} {kernel['bytes'] / 1e6:>9.1f} MB  "
            f"{kernel['op_name'][-80:]}")
  if args.json:
    payload = {"config": args.config, "overrides": args.overrides, "target": args.target, "devices": args.devices,
               "per_gemm": gemms, "whole_step": step,
               "added_bytes_fraction": step["added_bytes_fraction"]}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
