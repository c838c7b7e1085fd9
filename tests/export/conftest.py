# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""The export test group: exports of tiny trained checkpoints read back by the formats' own code.

The suite's process (.venv: maxtext, jax) trains and exports; the formats' libraries (torch, compressed-tensors,
transformers, ModelOpt) live in .venv-export (`./setup.sh --export`: Python 3.11, so that pip takes the CPU build of
torch this machine keeps on disk) and read each export in a subprocess (hf_side.py). `make test-export` builds it and
sets MAXTEXT_EXPORT_TESTS=required, under which a missing .venv-export fails the run; anywhere else these tests are
skipped with that reason.
"""

from __future__ import annotations

import os
import pathlib

import pytest

from tests import helpers

#: The interpreter with the formats' libraries (setup.sh --export).
EXPORT_PYTHON = pathlib.Path(os.environ.get("MAXTEXT_EXPORT_PYTHON", helpers.REPO_ROOT / ".venv-export/bin/python"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  del config
  helpers.gate_group(items, pathlib.Path(__file__).parent, EXPORT_PYTHON.exists, "MAXTEXT_EXPORT_TESTS",
                     f"tests/export needs {EXPORT_PYTHON} (torch, compressed-tensors, transformers): run `make test-export`")


@pytest.fixture(scope="module")
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            jax_cache_dir: pathlib.Path) -> dict[str, list[str]]:
  """The test module's RUNS (name -> overrides of configs/tiny.yml), each trained 3 steps with te_nvfp4 through
  maxtext's CLI, keeping the checkpoint of step 2: name -> the overrides that find it. One file per xdist worker."""
  root = tmp_path_factory.mktemp("runs")
  out = {}
  for name, shape in request.module.RUNS.items():
    overrides = [*shape, "quantization=te_nvfp4", "nvfp4_backend=emulated", f"run_name={name}",
                 f"base_output_directory={root}"]
    run = helpers.train_cli([*overrides, "steps=3", "enable_checkpointing=true", "checkpoint_period=2",
                             "async_checkpointing=false"], jax_cache_dir)
    assert run.returncode == 0, run.stderr[-3000:]
    out[name] = overrides
  return out
