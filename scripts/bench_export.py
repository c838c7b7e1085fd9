# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Seconds and peak host memory of `python -m MaxText.export` per decoder layer, at the Llama 3 8B recipe's shapes.

For each layer count it trains one step of Llama 3.1 8B's shapes (emb 4096, MLP 14336, 32/8 heads of 128; vocab cut
to --vocab so that training fits a CPU host) with te_nvfp4 through maxtext's trainer, keeping the checkpoint of step 0,
then exports it in each format in its own process under /usr/bin/time. Per layer is the slope between two layer
counts, so the fixed parts (imports, embeddings, head) cancel. Prints a table and writes JSON. Not a test: the numbers
depend on the machine and its load.

  .venv/bin/python scripts/bench_export.py [--layers 1 3] [--vocab 32768] [--json results/bench_export.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

_REPO = pathlib.Path(__file__).resolve().parents[1]
SHAPES = ["model_name=llama3.1-8b", "override_model_config=true", "max_target_length=128",
          "per_device_batch_size=1", "quantization=te_nvfp4", "nvfp4_backend=emulated"]
FORMATS = ("compressed-tensors", "bf16")


def _run(args: list[str]) -> tuple[float, float, str]:
  """(wall seconds, peak resident MiB, stderr tail) of one command under /usr/bin/time."""
  start = time.monotonic()
  proc = subprocess.run(["/usr/bin/time", "-f", "MAXRSS_KIB=%M", *args], cwd=_REPO, capture_output=True, text=True,
                        check=False)
  seconds = time.monotonic() - start
  if proc.returncode:
    raise SystemExit(f"failed ({proc.returncode}): {' '.join(args)}\n{proc.stderr[-3000:]}")
  kib = next(int(line.split("=")[1]) for line in reversed(proc.stderr.splitlines()) if line.startswith("MAXRSS_KIB="))
  return seconds, kib / 1024, proc.stderr


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layers", type=int, nargs=2, default=(1, 3), metavar=("FEW", "MORE"))
  parser.add_argument("--vocab", type=int, default=32768)
  parser.add_argument("--json", type=pathlib.Path, default=pathlib.Path("results/bench_export.json"))
  args = parser.parse_args()

  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for layers in args.layers:
      overrides = [*SHAPES, f"base_num_decoder_layers={layers}", f"vocab_size={args.vocab}", f"run_name=l{layers}",
                   f"base_output_directory={tmp}"]
      train_s, train_mib, _ = _run([sys.executable, "-m", "MaxText.train", "configs/tiny.yml", *overrides, "steps=1",
                                    "enable_checkpointing=true", "async_checkpointing=false"])
      print(f"  {layers} layers: trained and saved in {train_s:.0f} s", flush=True)
      for fmt in FORMATS:
        out = pathlib.Path(tmp) / f"export-l{layers}-{fmt}"
        seconds, mib, _ = _run([sys.executable, "-m", "MaxText.export", "configs/tiny.yml", *overrides, "--out",
                                str(out), "--format", fmt])
        size = sum(p.stat().st_size for p in out.iterdir()) / 2**20
        rows.append({"layers": layers, "format": fmt, "seconds": seconds, "peak_rss_mib": mib, "export_mib": size})
        print(f"  {layers} layers, {fmt}: {seconds:.1f} s, peak {mib:.0f} MiB, wrote {size:.0f} MiB", flush=True)
  few, more = args.layers
  per_layer = {}
  print("\n| format | s per layer | peak MiB per layer | export MiB per layer |\n|---|---:|---:|---:|")
  for fmt in FORMATS:
    a, b = (next(r for r in rows if r["layers"] == n and r["format"] == fmt) for n in (few, more))
    per_layer[fmt] = {k: (b[k] - a[k]) / (more - few) for k in ("seconds", "peak_rss_mib", "export_mib")}
    p = per_layer[fmt]
    print(f"| {fmt} | {p['seconds']:.2f} | {p['peak_rss_mib']:.0f} | {p['export_mib']:.0f} |")
  # One decoder layer's checkpoint weights (float32): what the reader holds per layer.
  layer_mib = (3 * 4096 * 14336 + 2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 4096) * 4 / 2**20
  print(f"\none decoder layer's float32 weights: {layer_mib:.0f} MiB")
  args.json.parent.mkdir(parents=True, exist_ok=True)
  args.json.write_text(json.dumps({"rows": rows, "per_layer": per_layer, "layer_weights_mib": layer_mib,
                                   "vocab": args.vocab, "machine": platform.platform()}, indent=2) + "\n")
  print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
