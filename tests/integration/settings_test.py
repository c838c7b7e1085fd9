# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The backend a config runs on, resolved once per config object and environment (settings.backend_of) and read
there by every site that needs it: the config checks, the quant object, the pre-flight and the self-check."""

from __future__ import annotations

import ast

import pytest

from MaxText.backends import environment, table
from MaxText.backends.environment import Environment
from MaxText.integration import checks
from MaxText.integration.quant import quantization_from_config
from MaxText.integration.settings import backend_of, settings_of
from MaxText.precision.modes import Backend
from MaxText.preflight import library
from tests.helpers import REPO_ROOT, plugin_defaults

_BLACKWELL = Environment(te_error=None, gpu_capabilities=(10.0,))
_NO_TE = Environment(te_error="ImportError: no transformer_engine", gpu_capabilities=())


class _Config:
  """A hashable config (as maxtext's HyperParameters is): the plugin's keys and the few maxtext keys read here."""

  def __init__(self, **overrides):
    values = {**plugin_defaults(), "quantization": "te_nvfp4", "num_decoder_layers": 2, "num_experts": 1}
    self.__dict__.update({**values, **overrides})


@pytest.fixture
def resolutions(monkeypatch) -> list[tuple[str, Environment]]:
  """Every call of table.resolve_backend, as (requested backend, environment), the calls going through."""
  calls, resolve = [], table.resolve_backend

  def counted(requested, env):
    calls.append((getattr(requested, "value", requested), env))
    return resolve(requested, env)

  monkeypatch.setattr(table, "resolve_backend", counted)
  return calls


def test_another_environment_is_resolved_for_once_and_this_machine_s_is_kept(resolutions):
  """The pre-flight answers for target GPUs (environment.answering): the same config resolves once for them, and
  this machine's resolution stays what it was."""
  config = _Config(nvfp4_backend="auto")
  assert quantization_from_config(config).backend is Backend.EMULATED and not library.te_nvfp4(config)
  with environment.answering(_BLACKWELL):
    assert backend_of(config) is Backend.TE and library.te_nvfp4(config) and quantization_from_config(config).backend \
        is Backend.TE
  assert backend_of(config) is Backend.EMULATED
  assert resolutions == [("auto", environment.probe_environment()), ("auto", _BLACKWELL)]


def test_the_config_checks_read_the_same_resolution(resolutions):
  """At config load: the expert rule and TE's shape rules read one resolution (a hashable config: cached)."""
  config = _Config(nvfp4_backend="emulated", num_experts=4, emb_dim=64, moe_mlp_dim=256, ici_expert_parallelism=1,
                   dcn_expert_parallelism=1, num_moe_emb_chunks=0, use_ring_of_experts=False, te_moe_block=False)
  assert checks.experts_error(config, settings_of(config), environment.current()) is None
  assert backend_of(config) is Backend.EMULATED and quantization_from_config(config).backend is Backend.EMULATED
  assert resolutions == [("emulated", environment.current())]


def test_one_config_resolves_once_whatever_reads_it(resolutions):
  config = _Config(nvfp4_backend="emulated")
  for _ in range(2):
    quantization_from_config(config)
    library.te_nvfp4(config)
    backend_of(config)
  assert resolutions == [("emulated", environment.current())]


def test_a_backend_that_cannot_run_is_refused_at_every_read(resolutions):
  """nvfp4_backend=te where TE cannot run: the one-line error at each read, nothing cached in its place."""
  config = _Config(nvfp4_backend="te")
  for _ in range(2):
    with pytest.raises(ValueError, match="nvfp4_backend=te cannot run here"):
      backend_of(config, _NO_TE)
  assert resolutions == [("te", _NO_TE)] * 2
  assert backend_of(config, _BLACKWELL) is Backend.TE


def test_the_backend_is_resolved_in_one_place():
  """table.resolve_backend is called only by MaxText/integration/settings.py (backend_of): no site resolves again."""
  package = REPO_ROOT / "MaxText"
  found = []
  for path in sorted(package.rglob("*.py")):
    if path.relative_to(package).as_posix() in ("integration/settings.py", "backends/table.py"):
      continue
    found += [(path.relative_to(package).as_posix(), node.lineno) for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              == "resolve_backend"]
  assert not found, found
