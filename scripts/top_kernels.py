# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Where a compiled step's predicted time goes, kernel by kernel: the pre-flight's prediction (MaxText.preflight)
broken down to its kernels, each attributed to the jax op that writes its largest output (kernels._output_scope).

  .venv-gpu/bin/python scripts/top_kernels.py CONFIG.yml key=value ... --target gb300 --devices 4 [--top 25]
      [--group elementwise] [--json OUT.json] [--hlo OUT.hlo] [--sass]

Prints the `--top` kernels of one group of the prediction ("elementwise" by default: fusions, copies, reductions,
quantization) by predicted milliseconds per step, with their bytes per run, runs per step and op_name (the jax name
stack, cut to its last parts), then the same time summed by the op_name's last jax primitive. Why: the fused
backend's quantizer is plain jnp compiled by XLA, and this is how to see which of its operations XLA did not fuse
or fused into a kernel that moves float32 intermediates (issue: the fused backend's elementwise cost). The numbers
are the pre-flight's roofline at the datasheet peaks: what it does not see is in docs/prediction.md. Beside each
kernel's predicted time, "instr ms" is the time its instructions take at one per lane per clock (a count of its fused
ops times their elements, MaxText.preflight.classify; 0 for kernels other than elementwise fusions), and the last
table sums both by origin: a kernel whose instructions take longer than its bytes is bound by arithmetic, which the
prediction does not price. With --sass, "SASS ms" is the same from the machine code ptxas made for the target
(MaxText.preflight.sass: instructions a thread runs x threads XLA launches; "-" for a kernel that loops, whose
static count is not what runs, or for what runs no kernel of XLA's, a copy or a library call), and the origin table
adds a column with it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the compile-only GPUs come from the CUDA plugin's topology API
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))


def _tail(op_name: str, parts: int = 4) -> str:
  return "/".join(op_name.split("/")[-parts:])


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("config")
  parser.add_argument("overrides", nargs="*")
  parser.add_argument("--target", default="gb300")
  parser.add_argument("--devices", type=int, default=4)
  parser.add_argument("--top", type=int, default=25)
  parser.add_argument("--group", default="elementwise")
  parser.add_argument("--json", type=pathlib.Path)
  parser.add_argument("--hlo", type=pathlib.Path, help="also write the compiled program's HLO text here (to read a "
                      "kernel's fused computation by the name this table prints)")
  parser.add_argument("--sass", action="store_true", help="also count each kernel's machine code (MaxText.preflight."
                      "sass: SASS instructions x threads launched; about 2 more minutes)")
  args = parser.parse_args(argv)
  from MaxText.preflight import sass  # pylint: disable=import-outside-toplevel  # no jax: before jax starts
  dump = sass.dump_compiles() if args.sass else None  # the kernels' launch dimensions

  # pylint: disable=import-outside-toplevel  # jax, maxtext and TE: after the arguments hold (seconds)
  from MaxText.backends import environment
  from MaxText.integration import seam, shapes
  from MaxText.preflight import kernels, library, origins, predict
  from MaxText.preflight.targets import TARGETS
  # pylint: enable=import-outside-toplevel

  seam.register()
  with environment.answering(library.target_environment(args.target, args.devices)):
    config = library.load_config(args.config, args.overrides, args.devices)
    compiled = library.compile_step(config, args.target, args.devices, "this run")
  text = compiled.as_text()
  if args.hlo:
    args.hlo.write_text(text)
  found = kernels.kernels(text)
  target = TARGETS[args.target]
  peaks, widths = target.peaks, shapes.mlp_widths(config)
  ran = {} if dump is None else sass.by_instruction(compiled, dump, "train_step")
  rows = []
  for k in found:
    if predict.group_of(k, widths).value != args.group:
      continue
    ms = 1e3 * predict.kernel_seconds(k, peaks) * k.runs
    instr_ms = 1e3 * k.work.lane_ops / target.lane_ops_per_second * k.runs
    launch, code = ran.get(k.name, (None, None))
    sass_ms = (1e3 * code.count * launch.threads / target.lane_ops_per_second * k.runs
               if code is not None and not code.loops else None)
    status = "not read" if dump is None else "no kernel" if code is None else "loops" if code.loops else "counted"
    rows.append({"ms_per_step": ms, "instructions_ms_per_step": instr_ms, "sass_ms_per_step": sass_ms, "sass": status,
                 "bytes": k.bytes, "runs": k.runs, "opcode": k.opcode, "name": k.name, "op_name": k.attributed,
                 "origin": str(origins.origin(k)), "results": list(k.results)})
  rows.sort(key=lambda r: -r["ms_per_step"])
  total = sum(r["ms_per_step"] for r in rows)
  print(f"{args.group}: {total:.1f} ms per step in {len(rows)} kernels ({args.devices} x {target.name})")
  print(f"{'ms/step':>8} {'instr ms':>8}{' SASS ms' if dump else ''} {'MB/run':>8} {'runs':>5}  op_name (last parts)")
  for r in rows[:args.top]:
    counted = (f" {r['sass_ms_per_step']:8.2f}" if r["sass_ms_per_step"] is not None else f" {'-':>8}") if dump else ""
    print(f"{r['ms_per_step']:8.2f} {r['instructions_ms_per_step']:8.2f}{counted} {r['bytes'] / 1e6:8.1f} "
          f"{r['runs']:5d}  {r['name']}  {_tail(r['op_name'])}")
  by_origin: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
  for r in rows:
    by_origin[r["origin"]][0] += r["ms_per_step"]
    by_origin[r["origin"]][1] += max(r["ms_per_step"], r["instructions_ms_per_step"])
    machine_ms = r["sass_ms_per_step"] if r["sass_ms_per_step"] is not None else r["instructions_ms_per_step"]
    by_origin[r["origin"]][2] += max(r["ms_per_step"], machine_ms)
  print(f"\nby origin, ms per step: the prediction's (bytes), and each kernel at its bytes or its instructions, "
        f"whichever takes longer ({target.lane_ops_per_second / 1e12:.1f} T instructions/s: "
        f"{target.sm_count} SMs x 128 lanes x {target.clock_ghz} GHz; classify._lane_ops)"
        + (", then with its SASS count where it has straight-line machine code" if dump else ""))
  for name, (by_bytes, either, by_machine) in sorted(by_origin.items(), key=lambda kv: -kv[1][1]):
    print(f"{by_bytes:8.2f} {either:8.2f}" + (f" {by_machine:8.2f}" if dump else "") + f"  {name}")
  by_op: dict[str, float] = collections.defaultdict(float)
  for r in rows:
    by_op[r["op_name"].split("/")[-1] or r["opcode"]] += r["ms_per_step"]
  print("\nby the jax primitive that writes each kernel's largest output, ms per step:")
  for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1])[:args.top]:
    print(f"{ms:8.2f}  {op}")
  if args.json:
    args.json.write_text(json.dumps({"group": args.group, "total_ms": total, "kernels": rows,
                                     "by_primitive_ms": by_op, "by_origin_ms": by_origin}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main(sys.argv[1:])
