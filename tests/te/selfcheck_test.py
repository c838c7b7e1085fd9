# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The self-check and the in-training audit with TransformerEngine as the candidate, compiled and lowered on CPU.

`python -m MaxText.selfcheck ... --compile-only --target b200|gb300` compiles TE's quantize programs for the five
operands, TE's fprop/dgrad/wgrad and the run's train step for the GPU (nothing runs: no GPU); a te_nvfp4 train step
with nvfp4_audit_interval lowers with the audit's TE quantize calls inside a conditional, beside the step's own."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.te import harness

TINY_TE = ["base_emb_dim=128", "head_dim=32", "base_mlp_dim=256", "per_device_batch_size=1", "max_target_length=128",
           "quantization=te_nvfp4", "nvfp4_backend=te"]
QUANTIZE = "te_dbias_quantize_ffi"


def test_selfcheck_compiles_tes_programs_and_the_step_for_blackwell(te):
  """For a GB300 (the fused backend's self-check below compiles for a B200: the self-check takes either target by
  the pre-flight's one code path, MaxText.preflight.compile.target_devices)."""
  del te
  target = "gb300"
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}  # as a user runs it
  proc = subprocess.run([sys.executable, "-m", "MaxText.selfcheck", str(harness.REPO_ROOT / "configs" / "tiny.yml"),
                         *TINY_TE, "--compile-only", "--target", target], cwd=harness.REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  rows = [line for line in proc.stdout.splitlines() if line.startswith(("compile ", "step "))]
  assert len(rows) == 3 and all(" ok " in row for row in rows), rows  # two GEMM shapes and the step
  assert "3 FP4 GEMMs" in rows[0] and "te_dbias_quantize_ffi" in rows[0] and f"for 1 x {target}" in rows[2]


def test_selfcheck_compiles_the_fused_backends_programs_for_blackwell(te):
  """nvfp4_backend=fused: our quantizer's programs (XLA fusions, no TE kernel) and fprop/dgrad/wgrad as TE's NVFP4
  GEMMs on our codes, compiled for a B200."""
  del te
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  proc = subprocess.run([sys.executable, "-m", "MaxText.selfcheck", str(harness.REPO_ROOT / "configs" / "tiny.yml"),
                         *TINY_TE[:-1], "nvfp4_backend=fused", "--compile-only", "--target", "b200"],
                        cwd=harness.REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  rows = [line for line in proc.stdout.splitlines() if line.startswith(("compile ", "step "))]
  assert len(rows) == 3 and all(" ok " in row for row in rows), rows
  assert "3 FP4 GEMMs" in rows[0] and "no TE kernel" in rows[0] and QUANTIZE not in rows[0]


def test_the_audit_quantizes_with_te_inside_a_conditional_beside_the_steps_own(te, blackwell):
  """The same tiny te_nvfp4 step with and without nvfp4_audit_interval: the step's own quantize calls are the same
  three per GEMM; the audit adds TE quantize calls, every one of them inside a conditional (a branch of the audit
  step's `lax.cond`), so steps that do not audit run none of them."""
  del te, blackwell
  common = ["run_name=audit", "enable_checkpointing=false", "base_output_directory=/tmp/te_audit", *TINY_TE,
            "max_target_length=64", "internal_compile=true", "internal_compile_num_devices=1"]
  plain = harness.te_calls(harness.lower_train_step(harness.load_config(harness.REPO_ROOT / "configs" / "tiny.yml",
                                                                        common)))
  audited = harness.te_calls(harness.lower_train_step(harness.load_config(
      harness.REPO_ROOT / "configs" / "tiny.yml", [*common, "nvfp4_audit_interval=10"])))
  own = [c for c in plain if c.target == QUANTIZE]
  added = [c for c in audited if c.target == QUANTIZE and "cond" in c.name]
  assert len([c for c in audited if c.target == QUANTIZE and "cond" not in c.name]) == len(own)
  assert len(added) >= 5 * 3, [c.name for c in added]  # 5 operands x 3 MLP GEMMs (x quantized for 2 of them)
