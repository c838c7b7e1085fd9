# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""MaxText.export of a run whose attention projections trained in NVFP4 (nvfp4_attention_precision=nvfp4): q, k, v
and o are written as the forward's own NVFP4 operands in both formats, through maxtext's conversion moving the query
and key rows (RoPE) and scaling the query (sqrt(head_dim) = sqrt(32), not a power of two), and read back by
compressed-tensors', ModelOpt's and transformers' own code (tests/export/checks.py)."""

from __future__ import annotations

import json

import pytest

from tests.export import checks
from tests.export.checks import check_load, check_weights, export, parameters

#: The runs this file trains (tests/export/conftest.py's `trained`).
RUNS = {name: checks.ALL_RUNS[name] for name in ("attention_scanned",)}
RUN = "attention_scanned"
PER_LAYER = 7  # gate, up, down; q, k, v, o


@pytest.mark.slow
def test_compressed_tensors_reads_the_attention_projections_own_nvfp4_operands(trained, tmp_path):
  summary = export(trained[RUN], tmp_path / "ct")
  assert summary.exact and "the MLP and attention forward ran in NVFP4" in summary.line, summary
  assert len(summary.nvfp4) == checks.LAYERS * PER_LAYER, summary.nvfp4
  assert check_weights(tmp_path / "ct", parameters(trained[RUN]), RUN, "compressed-tensors", tmp_path) == \
      checks.LAYERS * PER_LAYER
  ignore = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]["ignore"]
  assert "lm_head" in ignore and not any(".self_attn." in n for n in ignore), ignore
  check_load(tmp_path / "ct", tmp_path)


@pytest.mark.slow
def test_modelopt_reads_the_attention_projections_own_nvfp4_operands(trained, tmp_path):
  export(trained[RUN], tmp_path / "mo", "modelopt")
  assert check_weights(tmp_path / "mo", parameters(trained[RUN]), RUN, "modelopt", tmp_path) == \
      checks.LAYERS * PER_LAYER


@pytest.mark.slow
def test_fp8_attention_and_bf16_layers_keep_the_projections_bf16(trained, tmp_path):
  """The attention precision and the BF16 layers decide the projections as they decide the MLP's."""
  fp8 = export(trained[RUN], tmp_path / "fp8", "compressed-tensors", "nvfp4_attention_precision=fp8")
  assert not any(".self_attn." in n for n in fp8.nvfp4) and "model.layers.0.self_attn.q_proj.weight" in fp8.ignore
  first = export(trained[RUN], tmp_path / "first", "compressed-tensors", "nvfp4_bf16_first_layers=1")
  assert sorted(first.nvfp4) == sorted(n for n in fp8.nvfp4 + tuple(
      f"model.layers.1.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
      if n.startswith("model.layers.1.")), first.nvfp4
