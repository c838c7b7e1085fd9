# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What an audit mismatch does (nvfp4_audit_action): warn in one line, or stop once the step's checkpoint is written;
and where the audit key is refused at load."""

from __future__ import annotations

import logging

import pytest

from MaxText.integration import audit
from MaxText.precision.modes import AuditAction
from tests.helpers import TINY_YML, load_config, settings

_COUNTS = {"nvfp4/audit/layer_01/mlp/wo/fprop_w/scales": 3.0, "nvfp4/audit/layer_00/mlp/wi_0/fprop_x/codes": 0.0,
           "nvfp4/audit/layer_02/mlp/wo/dgrad_dy/codes": 7.0}


class _Checkpoints:
  """What maxtext's checkpoint manager offers the stop: waiting for a checkpoint still being written."""

  def __init__(self):
    self.waited = False

  def wait_until_finished(self):
    self.waited = True


def test_warn_names_the_first_mismatch_in_one_line(caplog):
  with caplog.at_level(logging.WARNING):
    audit.act(settings(audit_interval=2), 4, _COUNTS)
  (line,) = [r.getMessage() for r in caplog.records]
  assert line.startswith("NVFP4 audit at step 4: 3 mismatching scales in nvfp4/audit/layer_01/mlp/wo/fprop_w (and "
                         "1 more cells)") and "training goes on" in line
  audit.raise_pending()  # nothing pending: warn never stops the run
  assert audit.describe(4, {"nvfp4/audit/layer_00/mlp/wo/fprop_x/codes": 0.0}) is None


def test_stop_ends_the_run_after_the_checkpoint_is_written():
  audit.act(settings(audit_interval=2, audit_action=AuditAction.STOP), 6, _COUNTS)
  checkpoints = _Checkpoints()
  with pytest.raises(audit.AuditMismatch, match="NVFP4 audit at step 6: 3 mismatching scales"):
    audit.raise_pending(checkpoints)
  assert checkpoints.waited
  audit.raise_pending()  # raised once


@pytest.mark.parametrize(("overrides", "expected"), [
    (["quantization=te_nvfp4", "nvfp4_audit_interval=-2"], "nvfp4_audit_interval=-2 is negative"),
    (["quantization=fp8", "nvfp4_audit_interval=2"], "nvfp4_audit_interval=2 with quantization='fp8': the audit"),
    (["quantization=te_nvfp4", "nvfp4_mlp_precision=bf16", "nvfp4_audit_interval=2"],
     "nvfp4_audit_interval=2 with nvfp4_mlp_precision=bf16: no GEMM is NVFP4"),
    (["quantization=te_nvfp4", "nvfp4_audit_action=halt"], "nvfp4_audit_action"),
])
def test_bad_audit_settings_fail_at_load(overrides, expected):
  with pytest.raises(Exception) as info:
    load_config(TINY_YML, "nvfp4_backend=emulated", *overrides)
  assert expected in str(info.value)
