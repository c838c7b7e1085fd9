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


def test_stop_ends_on_the_first_finding_once():
  """Two audit steps with mismatches before the run may stop: it ends on the first step's finding, and only once."""
  stop = settings(audit_interval=2, audit_action=AuditAction.STOP)
  audit.act(stop, 2, {"nvfp4/audit/layer_00/mlp/wi_0/fprop_x/codes": 1.0})
  audit.act(stop, 4, _COUNTS)
  with pytest.raises(audit.AuditMismatch, match="NVFP4 audit at step 2: 1 mismatching codes in "
                     "nvfp4/audit/layer_00/mlp/wi_0/fprop_x "):
    audit.raise_pending()
  audit.raise_pending()  # the later finding does not raise again


@pytest.mark.parametrize(("overrides", "expected"), [
    (["quantization=te_nvfp4", "nvfp4_audit_interval=-2"], "nvfp4_audit_interval=-2 is negative"),
    (["quantization=fp8", "nvfp4_audit_interval=2"],
     "nvfp4_audit_interval=2 with quantization='fp8': it measures NVFP4 GEMMs (the audit)"),
    (["quantization=te_nvfp4", "nvfp4_mlp_precision=bf16", "nvfp4_audit_interval=2"],
     "nvfp4_audit_interval=2 with nvfp4_mlp_precision=bf16 and nvfp4_attention_precision=bf16: no GEMM is NVFP4"),
    (["quantization=te_nvfp4", "nvfp4_audit_action=halt"], "nvfp4_audit_action"),
])
def test_bad_audit_settings_fail_at_load(overrides, expected):
  with pytest.raises(Exception) as info:
    load_config(TINY_YML, "nvfp4_backend=emulated", *overrides)
  assert expected in str(info.value)


#: A subprocess's MaxText.train whose emulated backend's audit candidate rounds fprop x's codes toward zero (a known
#: quantizer bug, MaxText.selfcheck.candidates' code-round), every other operand its own: the audit must find it.
_FAULTY_TRAIN = """
import runpy, sys
from MaxText.nvfp4 import audit
from MaxText.selfcheck import candidates
own = audit.emulated
audit.emulated = lambda t, op, key=None: (
    audit.encode(t, op, codes=candidates._codes_toward_zero).codes, *own(t, op, key)[1:]) if op.name == "fprop_x" \\
    else own(t, op, key)
sys.argv = ["MaxText.train", *sys.argv[1:]]
runpy.run_module("MaxText.train", run_name="__main__")
"""


@pytest.mark.slow
def test_stop_ends_a_training_run_after_the_checkpoint_with_one_line(tmp_path, jax_cache_dir):
  """3 steps auditing every step, checkpoints every step: step 0's audit finds the fault; the run ends at the next
  iteration with exit 1 and one line; step 0's metrics (with the counts) and its checkpoint are kept."""
  import subprocess  # pylint: disable=import-outside-toplevel  # this test only
  import sys  # pylint: disable=import-outside-toplevel  # this test only

  from tests.helpers import REPO_ROOT, read_losses  # pylint: disable=import-outside-toplevel  # as above

  metrics = tmp_path / "m.jsonl"
  proc = subprocess.run([sys.executable, "-c", _FAULTY_TRAIN, str(TINY_YML), "run_name=stop",
                         f"base_output_directory={tmp_path}", f"metrics_file={metrics}", f"jax_cache_dir={jax_cache_dir}",
                         "quantization=te_nvfp4", "nvfp4_backend=emulated", "steps=3", "nvfp4_audit_interval=1",
                         "nvfp4_audit_action=stop", "enable_checkpointing=true", "checkpoint_period=1",
                         "async_checkpointing=false"],
                        cwd=REPO_ROOT, env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                        text=True, timeout=600, check=False)
  lines = [line for line in proc.stderr.splitlines() if line.startswith("MaxText.train: stopped")]
  assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-4000:]
  assert "NVFP4 audit at step 0:" in lines[0] and "mismatching codes in nvfp4/audit/layer_00/mlp/wi_0/fprop_x" in lines[0]
  assert len(read_losses(metrics)) >= 1  # step 0's record was written before the run ended
  assert (tmp_path / "stop" / "checkpoints" / "0").is_dir()
