# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The quantizer's machine code for a described GB300 (scripts/sass_count.py, MaxText.preflight.sass): the cubins
ptxas made when XLA compiled each GEMM operand's passes on this CPU, disassembled by nvdisasm. Nothing runs on a GPU.

In a subprocess of its own: the suite starts XLA with --xla_backend_optimization_level=0 (tests/conftest.py), and XLA
reads its flags once a process, so in the suite's process the GPU kernels would be LLVM's unoptimized code (each fused
op a function call), not what a user's compile gives.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_codes_passes_issue_few_instructions_an_element_and_no_conversions(te, tmp_path):
  """Every operand the recipe quantizes (MaxText.nvfp4.operands: x, W, dY, x^T, dY^T of 8192 x 4096) has its codes
  pass (the kernel that writes the packed E2M1 codes) read from the machine code: straight-line, no int-float
  conversion or rounding to an integral float, and at most 23 SASS instructions an element to nearest, 48 with
  stochastic rounding (measured 20.8 to 22.8 and 46.0 to 46.7 with ptxas 12.9 for sm_103a; 25.9 to 27.4 and 48.9 to
  49.7, with two or three conversions an element, when the rounding went through jnp.round, jnp.floor and astype:
  red then)."""
  del te
  out = tmp_path / "sass.json"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  run = subprocess.run([sys.executable, str(ROOT / "scripts" / "sass_count.py"), "--json", str(out)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  rows = json.loads(out.read_text())["kernels"]
  codes = {r["operand"]: r for r in rows if r["kernel"].startswith("loop_or_fusion")}
  assert set(codes) == {"fprop_x", "fprop_w", "dgrad_dy", "wgrad_x", "wgrad_dy"}, run.stdout
  assert {name for name, row in codes.items() if row["stochastic"]} == {"dgrad_dy", "wgrad_dy"}
  for row in codes.values():
    assert not row["loops"] and row["conversions_per_element"] == 0, row
    assert row["sass_per_element"] <= (48 if row["stochastic"] else 23), row



def test_a_train_steps_kernels_are_all_read(te, tmp_path):
  """scripts/top_kernels.py --sass on the tiny model's fused-backend train step for one GB300: an executable of many
  riegeli blocks, nested, with chunks that span blocks. Every fusion of XLA's in the compiled HLO runs a kernel whose
  machine code was read, under its own name or the one XLA reused for an identical fusion (the dumped thunks say
  which); only copies and the asynchronous copy fusions run none. The same compile files the elementwise time NVFP4
  adds under our quantizer's origin (MaxText.preflight.origins.Origin.NVFP4_OURS, as the pre-flight's --predict
  does), forward and backward, and none under TE's quantize kernels: the fused backend runs TE's GEMMs only."""
  del te
  out = tmp_path / "kernels.json"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  run = subprocess.run([sys.executable, str(ROOT / "scripts" / "top_kernels.py"), "configs/tiny.yml",
                        "quantization=te_nvfp4", "nvfp4_backend=fused", "base_emb_dim=128", "head_dim=32",
                        "base_mlp_dim=256", "per_device_batch_size=1", "max_target_length=128", "--target", "gb300",
                        "--devices", "1", "--sass", "--top", "1", "--json", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  rows = json.loads(out.read_text())["kernels"]
  fusions = [r for r in rows if r["opcode"].startswith("fusion:") and not r["name"].startswith("fusion-start")]
  assert len(fusions) > 100 and not [r["name"] for r in fusions if r["sass"] == "no kernel"]
  assert sum(r["sass"] == "counted" for r in fusions) > 0.8 * len(fusions)
  by_origin = json.loads(out.read_text())["by_origin_ms"]
  assert by_origin.get("our NVFP4 quantizer", [0])[0] > 0 and "TE NVFP4 quantize, RHT amax" not in by_origin, by_origin
  ours = [r["op_name"] for r in rows if r["origin"] == "our NVFP4 quantizer"]
  assert any("transpose(jvp" in name for name in ours) and any("transpose(jvp" not in name for name in ours), ours
