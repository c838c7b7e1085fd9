# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""A resume that changes the precision says so (log line + precision_changes.jsonl); the record itself."""

from __future__ import annotations

import json
import types

import pytest

from MaxText.integration import run_record
from tests.helpers import TINY_SCHEDULE, plugin_defaults, train_cli


def _config(tmp_path, **keys):
  values = {**plugin_defaults(), "quantization": "te_nvfp4", "nvfp4_backend": "emulated", **keys}
  return types.SimpleNamespace(base_output_directory=str(tmp_path), run_name="r", get_keys=lambda: values, **values)


def test_record_and_change_detection(tmp_path, caplog) -> None:
  first = _config(tmp_path)
  assert run_record.note_resume(first) is None  # a first run: no record yet
  record = json.loads((tmp_path / "r" / run_record.RECORD_FILE).read_text())
  assert record == {**plugin_defaults(), "quantization": "te_nvfp4", "nvfp4_backend": "emulated"}
  assert run_record.note_resume(_config(tmp_path, quantization="fp8")) is None  # no checkpoint: not a resume
  (tmp_path / "r" / "checkpoints" / "4").mkdir(parents=True)
  assert run_record.note_resume(_config(tmp_path, quantization="fp8")) is None  # same as the last record: fp8
  change = run_record.note_resume(_config(tmp_path, nvfp4_bf16_from_step=8))
  assert change["changed"] == {"quantization": {"old": "fp8", "new": "te_nvfp4"},
                               "nvfp4_bf16_from_step": {"old": None, "new": 8}}
  assert "stochastic-rounding counters" in change["reinitialized"]
  assert "quantization: 'fp8' -> 'te_nvfp4'" in caplog.text
  lines = (tmp_path / "r" / run_record.CHANGES_FILE).read_text().splitlines()
  assert len(lines) == 1 and json.loads(lines[0])["changed"] == change["changed"]
  # Statistics turned on across a resume (a checkpoint without their variables: maxtext starts them fresh), and a
  # list key recorded as JSON holds it: an unchanged nvfp4_bf16_layers is no change.
  change = run_record.note_resume(_config(tmp_path, nvfp4_bf16_from_step=8, nvfp4_stats_interval=5,
                                          nvfp4_bf16_layers=[1]))
  assert set(change["changed"]) == {"nvfp4_stats_interval", "nvfp4_bf16_layers"}
  assert ("tap variables (nvfp4_stats, nvfp4_stats_wgrad) start at zero until the next step of the statistics"
          in change["reinitialized"])
  assert run_record.note_resume(_config(tmp_path, nvfp4_bf16_from_step=8, nvfp4_stats_interval=5,
                                        nvfp4_bf16_layers=[1])) is None


@pytest.mark.slow
def test_resume_under_another_mode_is_logged_and_recorded(tmp_path, jax_cache_dir) -> None:
  common = [f"base_output_directory={tmp_path}", "run_name=ck", "enable_checkpointing=true", "checkpoint_period=2",
            "async_checkpointing=false", TINY_SCHEDULE]
  first = train_cli([*common, "quantization=te_nvfp4", "steps=2"], jax_cache_dir)
  assert first.returncode == 0, first.stderr[-4000:]
  assert (tmp_path / "ck" / "precision_plan.json").exists()  # a training run writes the plan
  resumed = train_cli([*common, "quantization=fp8", "steps=4"], jax_cache_dir)
  assert resumed.returncode == 0, resumed.stderr[-4000:]
  log = resumed.stdout + resumed.stderr
  assert log.count("NVFP4: resuming") == 1 and "quantization: 'te_nvfp4' -> 'fp8'" in log, log[-3000:]
  changes = [json.loads(x) for x in (tmp_path / "ck" / run_record.CHANGES_FILE).read_text().splitlines()]
  assert changes[0]["changed"]["quantization"] == {"old": "te_nvfp4", "new": "fp8"}


def test_a_run_that_is_not_nvfp4_writes_nothing_of_ours(tmp_path) -> None:
  """maxtext's other modes keep their promises: a read-only or shared output directory gets no file of ours."""
  assert run_record.note_resume(_config(tmp_path, quantization="fp8")) is None
  assert run_record.note_resume(_config(tmp_path, quantization="")) is None
  assert not (tmp_path / "r").exists()
