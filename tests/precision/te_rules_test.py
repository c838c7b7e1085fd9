# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""Config-load errors for what TransformerEngine would refuse on Blackwell (MaxText/precision/te_rules.py).

The backend probe is made to answer like a Blackwell node with TE (these rules apply only when the TE backend is
chosen); the same configs with the emulated backend, or where auto resolves to it, load. The rules' thresholds are
TE 2.20.2's own asserts; tests/te shows TE raising them when lowered (RHT, kernel RHT).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from MaxText.backends import environment
from MaxText.integration.settings import settings_of
from MaxText.integration.shapes import gemm_dims
from tests.helpers import BLACKWELL_SOURCE, REPO_ROOT, TINY_YML, blackwell_environment, load_config


@pytest.fixture()
def load(blackwell):
  """pyconfig.initialize through the plugin, with the probe answering `env` (one Blackwell GPU by default)."""

  def _load(*overrides: str, env=None):
    blackwell(env or blackwell_environment(1))
    return load_config(TINY_YML, *overrides)

  return _load


def _message(excinfo) -> str:
  return str(excinfo.value)


def test_rht_dims_refused_with_keys_and_fix(load):
  with pytest.raises(ValueError) as excinfo:  # tiny: emb 64, the columns of x for wi_0/wi_1
    load("quantization=te_nvfp4", "nvfp4_backend=te")
  message = _message(excinfo)
  assert "Random Hadamard Transform" in message and "K (the columns of x) = 64 per device" in message, message
  assert "emb_dim=64 (base_emb_dim=64)" in message and "quantization=te_nvfp4_no_rht" in message, message
  assert "e.g. 128" in message, message
  load("quantization=te_nvfp4_no_rht", "nvfp4_backend=te")  # no RHT, no rule
  load("quantization=te_nvfp4", "nvfp4_backend=emulated")  # the emulation has no such limit
  load("quantization=te_nvfp4", "base_emb_dim=128", "nvfp4_backend=te")  # dims TE accepts


def test_auto_checks_only_when_it_resolves_to_te(load):
  with pytest.raises(ValueError, match="Random Hadamard Transform"):
    load("quantization=te_nvfp4", "nvfp4_backend=auto")
  no_te = environment.Environment(te_error="ModuleNotFoundError: No module named 'transformer_engine'",
                                  gpu_capabilities=())
  load("quantization=te_nvfp4", "nvfp4_backend=auto", env=no_te)


def test_rht_rows_and_tensor_parallel_columns_per_device(load):
  with pytest.raises(ValueError) as excinfo:  # 32 tokens per device: RHT wants rows % 64
    load("quantization=te_nvfp4", "base_emb_dim=128", "per_device_batch_size=1", "max_target_length=32",
         "nvfp4_backend=te")
  assert "M (tokens, the rows of x and dY) = 32 per device" in _message(excinfo), _message(excinfo)
  assert "per_device_batch_size=1 max_target_length=32" in _message(excinfo)
  with pytest.raises(ValueError) as excinfo:  # mlp 256 over tensor=4: 64 columns of dY per device
    load("quantization=te_nvfp4", "base_emb_dim=512", "ici_tensor_parallelism=4", "ici_fsdp_parallelism=1",
         "nvfp4_backend=te")
  assert "N (the columns of dY) = 64 per device" in _message(excinfo), _message(excinfo)
  assert "tensor=4" in _message(excinfo), _message(excinfo)
  # maxtext shards the activations' embed dim over tensor too: x of wi (and dY of wo) reach TE's RHT with emb / 2
  # columns. Found by compiling for 4 B200s (tests/te/compile_test.py), which a lowering does not show.
  with pytest.raises(ValueError) as excinfo:
    load("quantization=te_nvfp4", "base_emb_dim=128", "base_mlp_dim=512", "ici_tensor_parallelism=2",
         "ici_fsdp_parallelism=1", "nvfp4_backend=te")
  assert "K (the columns of x) = 64 per device from emb_dim=128 (base_emb_dim=128) split by tensor=2" in \
      _message(excinfo), _message(excinfo)


def test_rht_rows_are_checked_per_device_under_fsdp(load):
  """fsdp 4 splits the tokens: 2 x 64 = 128 rows globally (a multiple of 64) are 32 per device, which TE refuses."""
  wide = ("quantization=te_nvfp4", "base_emb_dim=128", "ici_fsdp_parallelism=4", "nvfp4_backend=te")
  with pytest.raises(ValueError) as excinfo:
    load(*wide, "per_device_batch_size=2", "max_target_length=64")
  message = _message(excinfo)
  assert "M (tokens, the rows of x and dY) = 32 per device" in message, message
  assert "split by fsdp=4" in message, message
  load(*wide, "per_device_batch_size=4", "max_target_length=64")  # 256 rows, 64 per device: fits


def test_cublas_fp4_alignment(load):
  with pytest.raises(ValueError) as excinfo:  # 48 is a multiple of NVFP4's block (16) but not of cuBLAS's 32
    load("quantization=te_nvfp4_no_rht", "base_emb_dim=48", "nvfp4_backend=te")
  message = _message(excinfo)
  assert "cuBLAS" in message and "K = 48 per device" in message and "multiple of 32" in message, message
  load("quantization=te_nvfp4_no_rht", "base_emb_dim=48", "nvfp4_backend=emulated")


def test_comm_gemm_overlap_refused(load):
  """maxtext itself refuses te_comm_gemm_overlap outside a multi-process GPU run, so the rule is checked on a
  loaded config with the key set as such a run would have it."""
  from MaxText.precision.te_rules import te_errors  # pylint: disable=import-outside-toplevel

  config = load("quantization=te_nvfp4", "base_emb_dim=128", "nvfp4_backend=te")
  settings = settings_of(config)
  dims = gemm_dims(config, settings)
  assert te_errors(dims, settings, "disabled") == []
  errors = te_errors(dims, settings, "mlp")
  assert len(errors) == 1 and "te_comm_gemm_overlap=mlp" in errors[0] and "disabled" in errors[0], errors


@pytest.mark.slow
def test_cli_exits_2_with_one_line():
  """`python -m MaxText.train` (probe answering Blackwell): exit 2, one line naming keys, values and the fix."""
  code = (f"import sys; {BLACKWELL_SOURCE}; "
          "import runpy; sys.argv = ['MaxText.train', *sys.argv[1:]]; runpy.run_module('MaxText.train', "
          "run_name='__main__')")
  proc = subprocess.run([sys.executable, "-c", code, str(TINY_YML), "run_name=t", "quantization=te_nvfp4",
                         "nvfp4_backend=te", "base_output_directory=/tmp/te_rules"],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
  lines = [line for line in proc.stderr.splitlines() if line.startswith("MaxText.train: config error:")]
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert len(lines) == 1 and "emb_dim=64" in lines[0] and "te_nvfp4_no_rht" in lines[0], proc.stderr[-2000:]
