# Copyright 2026 The NVFP4-for-MaxText Authors. Licensed under the Apache License, Version 2.0.
"""MoE under te_nvfp4: never silently unquantized experts (config refusal, einsum signature, plan check)."""

import pytest

from MaxText.adapter import Nvfp4Quantization
from MaxText.backend import Backend
from MaxText.plan import PlanEntry, PlanError, check
from MaxText.policy import Precision, PrecisionPolicy

#: A tiny Mixtral-style model on top of configs/tiny.yml (expert hidden dim = base_mlp_dim, as maxtext requires).
MIXTRAL = ["decoder_block=mixtral", "num_experts=4", "num_experts_per_tok=2", "base_moe_mlp_dim=256"]


@pytest.mark.parametrize("mode,path", [
    ("te_nvfp4", ["sparse_matmul=true", "megablox=true"]),
    ("te_nvfp4_no_rht", ["sparse_matmul=true", "megablox=false"]),
    ("te_nvfp4", ["sparse_matmul=false"]),
])
def test_routed_experts_refused_at_config_load(run_train, tmp_path, mode, path):
  run = run_train([f"quantization={mode}", "nvfp4_backend=emulated", *MIXTRAL, *path, "steps=1",
                   f"base_output_directory={tmp_path}"])
  assert run.returncode == 2, run.stderr[-3000:]
  lines = [l for l in run.stderr.splitlines() if l.startswith("MaxText.train: config error:")]
  assert len(lines) == 1, run.stderr[-3000:]
  assert f"quantization={mode}" in lines[0] and "num_experts=4" in lines[0] and "quantization=fp8" in lines[0]
  assert "Traceback" not in run.stderr
  assert not (tmp_path / "tiny").exists()  # refused before any model (and plan) was built


def test_einsum_takes_maxtexts_call_signature():
  """RoutedMoE.get_einsum calls quant.einsum(mesh_axes=...): the answer names the GEMM, not a TypeError."""
  quant = Nvfp4Quantization(policy=PrecisionPolicy(), backend=Backend.EMULATED)
  with pytest.raises(NotImplementedError, match="exp"):
    quant.einsum(mesh_axes=("exp", "embed_moe", "mlp_moe"))


def _entry(module, precision, kind="dense"):
  return PlanEntry(module=module, kernel_axes=(), precision=precision, backend="-", implementation="", kind=kind)


def test_plan_refuses_unquantized_experts_and_all_bf16():
  quant = Nvfp4Quantization(policy=PrecisionPolicy(), backend=Backend.EMULATED)
  gate = _entry("moe/gate", "bf16", "router")
  with pytest.raises(PlanError, match="moe/wi_0"):
    check(quant, [_entry("mlp/wi_0", "nvfp4"), gate, _entry("moe/wi_0", "bf16", "experts")])
  with pytest.raises(PlanError, match="no GEMM runs in NVFP4"):
    check(quant, [_entry("attention/query", "bf16"), gate])
  check(quant, [_entry("mlp/wi_0", "nvfp4"), gate])  # the recipe: fine
  baseline = Nvfp4Quantization(policy=PrecisionPolicy(mlp=Precision.BF16), backend=Backend.EMULATED)
  check(baseline, [_entry("attention/query", "bf16"), _entry("moe/wi_0", "bf16", "experts")])  # asked for
