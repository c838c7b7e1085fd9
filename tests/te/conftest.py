# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""The TE test group: the TransformerEngine backend traced and lowered to CUDA StableHLO on CPU.

Runs with an interpreter that has TransformerEngine: `make test-te` builds .venv-gpu with `./setup.sh --gpu` and
sets MAXTEXT_TE_TESTS=required, under which a missing or broken TE fails the run. Anywhere else (the CPU suite in
.venv) these tests are skipped with that reason. 4 simulated CPU devices, for the sharded lowerings.
"""

from __future__ import annotations

import os
import pathlib

import pytest

# Before jax creates its CPU backend: 4 devices for the fsdp x tensor lowerings, and no GPU backend attempted.
os.environ["JAX_PLATFORMS"] = "cpu"
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

from MaxText.preflight import deviceless  # pylint: disable=wrong-import-position
from tests import helpers  # pylint: disable=wrong-import-position


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  del config
  helpers.gate_group(items, pathlib.Path(__file__).parent, deviceless.te_installed, "MAXTEXT_TE_TESTS",
                     "tests/te needs TransformerEngine (transformer_engine_jax): run `make test-te`, which builds .venv-gpu")


@pytest.fixture(scope="session")
def te() -> object:
  """transformer_engine.jax, imported without a driver (MaxText.preflight.deviceless)."""
  return deviceless.import_transformer_engine()
