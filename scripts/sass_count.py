# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The fused backend's quantizer passes in the machine code a described GPU runs: SASS instructions per element.

  .venv-gpu/bin/python scripts/sass_count.py [--target gb300] [--shape 8192 4096] [--json OUT.json]

Compiles each GEMM operand the recipe quantizes (`quantize_codes` of one M x N bf16 input for each row of
MaxText.nvfp4.operands: x and W for fprop, dY for dgrad, x^T and dY^T for wgrad) for one described GPU with XLA's GPU
compiler on this CPU, then reads its kernels' machine code (MaxText.preflight.sass: the cubins ptxas made,
disassembled by nvdisasm). For each kernel that moves operand-sized data it prints the SASS instructions a thread
runs, the threads XLA launches (from XLA's dump of the compile), their product per element of the operand, the
int-float conversions among them, and the pre-flight's own count (classify._lane_ops: one per fused HLO op per
element), which prices the prediction's "instr ms". Why: a GPU runs these passes bound by their instructions
(docs/prediction.md), and this is the count the GPU issues, where the pre-flight's is a model. Not a timing:
instructions differ in throughput (conversions run at a fraction of the rate), and nothing here runs on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the compile-only GPUs come from the CUDA plugin's topology API
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--target", default="gb300")
  parser.add_argument("--shape", type=int, nargs=2, default=(8192, 4096), metavar=("M", "N"))
  parser.add_argument("--json", type=pathlib.Path)
  args = parser.parse_args(argv)
  from MaxText.preflight import sass  # pylint: disable=import-outside-toplevel  # no jax: before jax starts
  dump = sass.dump_compiles()  # each compile's launch dimensions

  # pylint: disable=import-outside-toplevel  # jax: after the arguments hold and XLA_FLAGS is set (seconds)
  import jax
  import jax.numpy as jnp
  from jax.sharding import SingleDeviceSharding

  from MaxText.nvfp4.block_scaled import quantize_codes
  from MaxText.nvfp4.gemm import GemmRecipe
  from MaxText.nvfp4.operands import gemm_operands
  from MaxText.preflight import kernels
  from MaxText.preflight.compile import target_devices
  from MaxText.preflight.targets import TARGETS
  # pylint: enable=import-outside-toplevel

  m, n = args.shape
  elements = m * n
  (device,) = target_devices(args.target, 1)
  on = SingleDeviceSharding(device)
  key = jax.random.key(0)
  inputs = (jax.ShapeDtypeStruct((m, n), jnp.bfloat16, sharding=on), jax.ShapeDtypeStruct(key.shape, key.dtype,
                                                                                          sharding=on))
  print(f"the quantizer's GEMM operands, {m} x {n} bf16, compiled for one {TARGETS[args.target].name}: "
        "SASS per thread x threads / elements")
  print(f"{'operand':<18} {'kernel':<30} {'SASS':>6} {'threads':>9} {'SASS/el':>8} {'conv/el':>8} {'HLO ops/el':>10}")
  rows = []
  for operand in gemm_operands(GemmRecipe()):  # the recipe's five: 16x16 weights, RHT and stochastic rounding on

    def codes(x, k, operand=operand):
      quantized = quantize_codes(x, operand.scaling, rht=operand.rht, stochastic_rounding=operand.stochastic,
                                 key=k if operand.stochastic else None, axis=operand.axis)
      return quantized.codes, quantized.scales, quantized.amax

    codes.__name__ = operand.name
    compiled = jax.jit(codes).lower(*inputs).compile()
    ran = sass.by_instruction(compiled, dump, codes.__name__)
    for k in kernels.kernels(compiled.as_text()):
      if k.bytes < elements or k.name not in ran:
        continue  # not a pass over the operand, or not a kernel of XLA's own (a library GEMM)
      launch, code = ran[k.name]
      name = launch.kernel
      row = {"operand": operand.name, "stochastic": operand.stochastic, "kernel": name, "sass_per_thread": code.count,
             "threads": launch.threads,
             "sass_per_element": code.count * launch.threads / elements,
             "conversions_per_element": code.conversions * launch.threads / elements,
             "hlo_ops_per_element": k.work.lane_ops / elements, "loops": code.loops}
      rows.append(row)
      print(f"{operand.name:<18} {name:<30} {code.count:6d} {launch.threads:9d} {row['sass_per_element']:8.1f} "
            f"{row['conversions_per_element']:8.1f} {row['hlo_ops_per_element']:10.1f}"
            + ("  (loops: a static count)" if code.loops else ""))
  if args.json:
    args.json.write_text(json.dumps({"target": args.target, "shape": [m, n], "kernels": rows}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main(sys.argv[1:])
