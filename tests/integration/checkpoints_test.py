# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Loading another run's checkpoint, in the small: which variables are the plugin's, the load's filter, the
checkpoint path checked at config load, and the full-state load's precision line (end to end:
tests/checkpoint_load_test.py)."""

from __future__ import annotations

import json
import types

import jax.numpy as jnp
import pytest
from flax import nnx

from MaxText.integration import checkpoints, run_record
from MaxText.integration.checks import checkpoint_error
from tests.helpers import plugin_defaults


def _state() -> nnx.State:
  return nnx.State({
      "decoder": {"layers": {"mlp": {
          "wi_0": {"kernel": nnx.Param(jnp.ones((4, 2, 8))),
                   "Nvfp4DotGeneral_0": {"nvfp4_sr_count": nnx.Variable(jnp.zeros((2,), jnp.uint32)),
                                         "nvfp4_layer": nnx.Variable(jnp.arange(2, dtype=jnp.int32)),
                                         "nvfp4_stats": nnx.Variable(jnp.zeros((2, 3, 4)))}},
          "MoeBlock_0": {"wi_0": nnx.Param(jnp.ones((2, 4, 8))),
                         "nvfp4_experts": {"nvfp4_sr_count": nnx.Variable(jnp.zeros((2,), jnp.uint32)),
                                           "nvfp4_layer": nnx.Variable(jnp.zeros((2,), jnp.int32))}}}}},
      "token_embedder": {"embedding": nnx.Param(jnp.ones((8, 4)))}})


def test_the_load_asks_for_the_weights_only():
  weights, dropped = checkpoints.split_plugin_state(_state())
  paths = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(weights)}
  assert paths == {"decoder/layers/mlp/wi_0/kernel", "decoder/layers/mlp/MoeBlock_0/wi_0",
                   "token_embedder/embedding"}
  # nvfp4_layer: a dense GEMM's decoder layer index, there with per-layer BF16 switches (MaxText.backends.flags)
  assert dropped == {"nvfp4_sr_count": 1, "nvfp4_layer": 1, "nvfp4_stats": 1, "nvfp4_experts": 2}
  line = checkpoints.fresh_line("/ck/3", dropped)
  assert line.startswith("NVFP4: load_parameters_path=/ck/3:") and "nvfp4_experts (2)" in line


def test_a_model_without_plugin_state_is_passed_through():
  state = nnx.State({"w": nnx.Param(jnp.ones(2))})
  weights, dropped = checkpoints.split_plugin_state(state)
  assert weights is state and not dropped


def test_the_wrapper_binds_by_name_and_passes_the_filtered_state(caplog):
  seen = {}

  def load_params_from_path(load_parameters_from_path, abstract_unboxed_params, checkpoint_storage_concurrent_gb,
                            use_ocdbt=True):
    seen["state"], seen["gb"] = abstract_unboxed_params, checkpoint_storage_concurrent_gb
    return abstract_unboxed_params

  wrapped = checkpoints.wrap_load_params_from_path(load_params_from_path)
  wrapped("/ck/3/items", abstract_unboxed_params=_state(), checkpoint_storage_concurrent_gb=7)
  assert seen["gb"] == 7 and not any("nvfp4" in str(p) for p, _ in nnx.to_flat_state(seen["state"]))
  assert "the plugin's own state starts fresh" in caplog.text
  linen = {"params": {"w": 1}}
  assert wrapped("/ck", linen, 7) is linen  # a Linen params tree goes to maxtext unchanged


def test_the_checkpoint_path_is_checked_at_config_load(tmp_path):
  step = tmp_path / "run" / "checkpoints" / "3"
  (step / "items").mkdir(parents=True)
  (step / "_CHECKPOINT_METADATA").write_text("{}")
  (step / "items" / "_METADATA").write_text("{}")
  assert checkpoint_error("load_parameters_path", str(step / "items")) is None
  assert checkpoint_error("load_parameters_path", str(step)) is None
  assert checkpoint_error("load_parameters_path", "") is None
  assert checkpoint_error("load_parameters_path", "gs://bucket/run/checkpoints/3/items") is None  # orbax's to read
  missing = checkpoint_error("load_full_state_path", str(tmp_path / "nope" / "items"))
  assert missing.startswith(f"load_full_state_path={tmp_path / 'nope' / 'items'}: no such file or directory")
  (tmp_path / "notes").mkdir()
  (tmp_path / "notes" / "a.txt").write_text("x")
  wrong = checkpoint_error("load_parameters_path", str(tmp_path / "notes"))
  assert wrong.startswith(f"load_parameters_path={tmp_path / 'notes'}: not a maxtext checkpoint")
  assert "\n" not in wrong and "checkpoints/<step>/items" in wrong


def _config(tmp_path, **keys):
  values = {**plugin_defaults(), "quantization": "te_nvfp4", "nvfp4_backend": "emulated", **keys}
  return types.SimpleNamespace(base_output_directory=str(tmp_path), run_name="new", get_keys=lambda: values, **values)


@pytest.mark.parametrize("suffix", ["/items", "", "/items/"])
def test_the_source_run_of_a_checkpoint_path(suffix):
  assert str(run_record.source_run_dir(f"/out/run/checkpoints/7{suffix}")) == "/out/run"


def test_a_full_state_load_from_another_precision_is_said(tmp_path, caplog):
  source = tmp_path / "old"
  (source / "checkpoints" / "2" / "items").mkdir(parents=True)
  path = str(source / "checkpoints" / "2" / "items")
  change = run_record.note_full_state_load(_config(tmp_path, load_full_state_path=path))
  assert change["changed"]["quantization"] == {"old": None, "new": "te_nvfp4"}
  assert "not an NVFP4 run" in caplog.text and "nvfp4_sr_count" in caplog.text
  assert json.loads((tmp_path / "new" / run_record.CHANGES_FILE).read_text())["source"] == path
  assert sorted(p.name for p in source.iterdir()) == ["checkpoints"]  # nothing written into the source run
  record = {**plugin_defaults(), "quantization": "te_nvfp4", "nvfp4_backend": "emulated"}
  (source / run_record.RECORD_FILE).write_text(json.dumps(record))
  assert run_record.note_full_state_load(_config(tmp_path, load_full_state_path=path)) is None  # the same settings
  assert run_record.note_full_state_load(_config(tmp_path, quantization="fp8", load_full_state_path=path)) is None
