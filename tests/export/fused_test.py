# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""MaxText.export of a `fused_mlp=true` run: maxtext's one `wi` GEMM for gate and up, split into gate_proj and
up_proj that carry the one tensor scale the training forward used (what vLLM's fused gate/up layer assumes).

Check 1 (tests/export/checks.py) holds each half against the emulator's 2D quantization of the whole fused weight,
read back with compressed-tensors' (and ModelOpt's) own code; check 2 holds transformers' logits against maxtext's
forward of the fused model on the same weights."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests import helpers
from tests.export import checks
from tests.export.checks import check_logits, check_weights, config_of, export, parameters

#: The runs this file trains (tests/export/conftest.py's `trained`).
RUNS = {name: checks.ALL_RUNS[name] for name in ("fused_scanned", "fused_unscanned")}


def _global_scales(export_dir, layer: int, suffix: str) -> tuple[float, float]:
  return tuple(float(np.asarray(checks.tensor(export_dir, f"model.layers.{layer}.mlp.{p}.{suffix}")).reshape(-1)[0])
               for p in ("gate_proj", "up_proj"))


@pytest.mark.slow
@pytest.mark.parametrize("run", list(RUNS))
def test_gate_and_up_are_the_halves_of_the_fused_operand(trained, tmp_path, run):
  params = parameters(trained[run])
  halves = [(np.abs(w[:, rows].astype("bfloat16")).max()) for m, w, _, rows, _ in checks._maxtext_weights(params, run)
            if not m.endswith("down_proj")]  # pylint: disable=protected-access
  if run == "fused_scanned":  # separate scales would differ here (unscanned, every half's bf16 amax is 0.361328)
    assert any(g != u for g, u in zip(halves[0::2], halves[1::2])), halves
  summary = export(trained[run], tmp_path / run)
  assert summary.exact and len(summary.nvfp4) == checks.LAYERS * 3, summary
  assert check_weights(tmp_path / run, params, run, "compressed-tensors", tmp_path) == checks.LAYERS * 3
  for layer in range(checks.LAYERS):
    gate, up = _global_scales(tmp_path / run, layer, "weight_global_scale")
    assert gate == up, (layer, gate, up)


@pytest.mark.slow
def test_modelopt_and_bf16_exports_of_the_fused_run(trained, tmp_path):
  run = "fused_scanned"
  params = parameters(trained[run])
  export(trained[run], tmp_path / "mo", "modelopt")
  assert check_weights(tmp_path / "mo", params, run, "modelopt", tmp_path) == checks.LAYERS * 3
  assert all(len(set(_global_scales(tmp_path / "mo", layer, "weight_scale_2"))) == 1 for layer in range(checks.LAYERS))
  export(trained[run], tmp_path / "bf16", "bf16")
  check_logits(tmp_path / "bf16", trained[run], params, run, tmp_path, quantized=False)


@pytest.mark.slow
def test_transformers_logits_equal_maxtexts_fused_forward(trained, tmp_path):
  run = "fused_scanned"
  export(trained[run], tmp_path / "nvfp4")
  check_logits(tmp_path / "nvfp4", trained[run], parameters(trained[run]), run, tmp_path)


@pytest.mark.slow
def test_calibrated_gate_and_up_share_the_fused_gemms_input_scale(trained, tmp_path):
  """The fused GEMM is one GEMM: its calibration metric is `mlp/wi`, and gate and up both get its input scale."""
  from MaxText.export import calibrate, run  # pylint: disable=import-outside-toplevel
  from MaxText.export.layouts import Format  # pylint: disable=import-outside-toplevel
  from MaxText.nvfp4.quantize import tensor_scales  # pylint: disable=import-outside-toplevel

  name = "fused_scanned"
  config = config_of(trained[name])
  run.export(config, tmp_path / "ct", Format.COMPRESSED_TENSORS, progress=False,
             calibrate=lambda c: calibrate.calibrate(config, str(helpers.TINY_YML), trained[name], c.path, 2,
                                                     tmp_path / "work"))
  amax = json.loads((tmp_path / "ct" / run.METADATA_FILE).read_text())["activations"]["input_amax"]
  assert set(amax) == {f"layer_{layer:02d}/mlp/{g}" for layer in range(checks.LAYERS) for g in ("wi", "wo")}, amax
  for layer in range(checks.LAYERS):
    s_enc = float(tensor_scales(np.float32(amax[f"layer_{layer:02d}/mlp/wi"]))[0])
    assert _global_scales(tmp_path / "ct", layer, "input_global_scale") == (s_enc, s_enc)
