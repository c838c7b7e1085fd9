# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The precision plan read off a model maxtext built: every GEMM with what it runs, written once through the shared
model of precision_plan.json (MaxText.integration.artifacts) that the comparison tool reads back."""

from __future__ import annotations

import pathlib

import pytest
from flax import nnx

import MaxText
from MaxText.compare import runinfo
from MaxText.integration import artifacts, flops, plan
from MaxText.integration.plan import PlanEntry, PlanError, check
from MaxText.integration.quant import Nvfp4Quantization
from MaxText.precision.modes import Backend
from MaxText.precision.policy import Precision
from tests.helpers import TINY_YML, load_config, settings

MaxText.register()

# pylint: disable=wrong-import-position,wrong-import-order
from maxtext.utils import model_creation_utils  # noqa: E402  after MaxText.register(), which patches maxtext


def test_the_plan_is_written_once_and_read_back_by_compare(tmp_path: pathlib.Path, capsys):
  config = load_config(TINY_YML, "quantization=te_nvfp4", "nvfp4_backend=emulated", "nvfp4_attention_precision=fp8",
                       "nvfp4_bf16_last_layers=1")
  model = model_creation_utils.from_config(config, rngs=nnx.Rngs(params=0, dropout=1, aqt=2))
  entries = plan.report(model, str(tmp_path), flops.training_flops(config))
  by_module = {e.module.rsplit("/", 2)[-2] + "/" + e.module.rsplit("/", 1)[-1]: e for e in entries}
  assert by_module["mlp/wi_0"].precision == "nvfp4" and by_module["self_attention/query"].precision == "fp8"
  written = artifacts.Plan.model_validate_json((tmp_path / artifacts.PLAN_FILE).read_text())
  assert written.gemms == entries and written.decoder_layers_mlp == ["nvfp4", "bf16"]
  assert written.switches.bf16_last_layers == 1 and written.recipe.rht and written.backend == "emulated"
  assert runinfo.read_plan(tmp_path) == ("emulated", 3, written.flops.mlp_flop_share)
  assert "NVFP4 precision plan (emulated backend; 3 nvfp4, 4 fp8" in capsys.readouterr().out
  (tmp_path / artifacts.PLAN_FILE).unlink()
  plan.report(model, str(tmp_path), flops.training_flops(config))  # the same plan again: said once per process
  assert not (tmp_path / artifacts.PLAN_FILE).exists()


def test_a_plan_from_another_version_is_not_read_as_this_one(tmp_path: pathlib.Path):
  """A precision_plan.json whose fields differ (renamed, missing) gives compare nothing rather than a wrong number."""
  (tmp_path / artifacts.PLAN_FILE).write_text('{"backend": "te", "gemms": [{"precision": "nvfp4"}]}')
  assert runinfo.read_plan(tmp_path) == (None, None, None)


def _entry(module: str, axes: tuple[str, ...], precision: str) -> PlanEntry:
  return PlanEntry(module=module, kernel_axes=axes, precision=precision, backend="-", implementation="", kind="dense")


def test_attention_in_nvfp4_that_quantizes_no_projection_is_refused():
  """nvfp4_attention_precision=nvfp4 where no attention projection came out NVFP4 (a model whose attention takes no
  quant object) is one line naming what stays BF16; with attention NVFP4 alone (an MLP baseline beside it) the plan
  holds. The MLP's own rules still apply."""
  mlp, query = _entry("mlp/wi_0", ("embed", "mlp"), "nvfp4"), ("embed_attn", "q_heads", "kv")
  quant = Nvfp4Quantization(settings=settings(attention=Precision.NVFP4), backend=Backend.EMULATED)
  check(quant, [mlp, _entry("self_attention/query", query, "nvfp4")])
  with pytest.raises(PlanError, match=r"^nvfp4_attention_precision=nvfp4 built no attention projection in NVFP4: "
                                      r"self_attention/query stay BF16"):
    check(quant, [mlp, _entry("self_attention/query", query, "bf16")])
  with pytest.raises(PlanError, match="has no DenseGeneral with attention axes"):
    check(quant, [mlp])
  attention_only = Nvfp4Quantization(settings=settings(mlp=Precision.BF16, attention=Precision.NVFP4),
                                     backend=Backend.EMULATED)
  check(attention_only, [_entry("mlp/wi_0", ("embed", "mlp"), "bf16"), _entry("self_attention/query", query, "nvfp4")])
