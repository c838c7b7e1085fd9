# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The backend choice (MaxText.backends.table.resolve_backend): auto, te and emulated against the environments a
user may have (MaxText.backends.environment)."""

import pytest

from MaxText.backends import environment
from MaxText.backends.environment import Environment
from MaxText.backends.table import resolve_backend
from MaxText.precision.modes import Backend

_NO_TE = Environment(te_error="ModuleNotFoundError: No module named 'transformer_engine'", gpu_capabilities=())
_HOPPER = Environment(te_error=None, gpu_capabilities=(9.0,) * 8)
_BLACKWELL = Environment(te_error=None, gpu_capabilities=(10.0,) * 4)
_MIXED = Environment(te_error=None, gpu_capabilities=(10.0, 9.0))


@pytest.mark.parametrize("env,want", [(_NO_TE, Backend.EMULATED), (_HOPPER, Backend.EMULATED),
                                      (_MIXED, Backend.EMULATED), (_BLACKWELL, Backend.TE)])
def test_auto_backend(env, want):
  assert resolve_backend("auto", env) is want


@pytest.mark.parametrize("env,reason", [(_NO_TE, "does not import"), (_HOPPER, "found 9.0"),
                                        (Environment(None, ()), "no GPU")])
def test_te_backend_where_it_cannot_run_is_a_clear_error(env, reason):
  with pytest.raises(ValueError, match=f"nvfp4_backend=te cannot run here: .*{reason}.*Use nvfp4_backend=emulated"):
    resolve_backend("te", env)


def test_emulated_and_te_on_blackwell():
  assert resolve_backend("emulated", _NO_TE) is Backend.EMULATED
  assert resolve_backend("te", _BLACKWELL) is Backend.TE
  with pytest.raises(ValueError, match="'cuda' is not a valid Backend"):
    resolve_backend("cuda", _NO_TE)


def test_this_machine_resolves_auto_to_emulated():
  """CI has neither TE nor a GPU: auto must pick the emulation."""
  assert resolve_backend("auto", environment.current()) is Backend.EMULATED
