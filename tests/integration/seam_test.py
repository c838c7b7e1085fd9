# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The seam to maxtext: every wrapped symbol declared once, checked against the installed maxtext at register(),
bound by name; jax itself never patched beyond one NVFP4 MoE call; the docs' table (docs/backends.md) is the declared
one."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import MaxText
from MaxText.backends import experts
from MaxText.integration import seam
from tests.helpers import REPO_ROOT, TINY_YML, load_config

MaxText.register()

# pylint: disable=wrong-import-position,wrong-import-order
from maxtext.kernels import megablox  # noqa: E402  after MaxText.register(), which patches maxtext
from maxtext.trainers.pre_train import train as maxtext_train  # noqa: E402  after MaxText.register(), which patches maxtext


def test_every_register_hook_is_installed_and_wraps_maxtexts_function():
  for hook in seam.HOOKS:
    for target in hook.targets:
      _, _, value = seam.resolve(target)
      installed = getattr(value, "_nvfp4_plugin_wrapper", False)
      assert installed == (hook.when == "register"), target  # the cli and moe-call entries are not installed here
      if installed:
        assert value.__wrapped__.__module__.split(".")[0] == "maxtext", target


def test_a_renamed_parameter_fails_at_register_naming_the_symbol(monkeypatch):
  """maxtext renaming train_step's `state` would otherwise fail inside the traced step (or silently)."""

  def train_step(model, config, state_mesh_shardings, params_shardings, train_state, data, dropout_rng=None):
    del model, config, state_mesh_shardings, params_shardings, train_state, data, dropout_rng

  monkeypatch.setattr(maxtext_train, "train_step", train_step)
  monkeypatch.setattr(seam, "_registered", False)
  before = {target: seam.resolve(target)[2] for hook in seam.HOOKS for target in hook.targets}
  with pytest.raises(seam.IncompatibleMaxText) as info:
    seam.register()
  message = str(info.value)
  assert "maxtext.trainers.pre_train.train:train_step" in message and "'state'" in message, message
  assert "train_state" in message and "Supported maxtext versions: 0.2.4, 0.2.5" in message, message
  assert "\n" not in message and message.count("train_step") == 1, message
  assert not seam.is_registered()
  # Nothing was installed: the incompatible train_step this test put in is not wrapped, and every symbol of the seam
  # table is the object it was before the refused register().
  assert maxtext_train.train_step is train_step
  assert {target: seam.resolve(target)[2] for hook in seam.HOOKS for target in hook.targets} == before


def test_a_missing_symbol_is_named(monkeypatch):
  monkeypatch.delattr(megablox, "gmm")
  with pytest.raises(seam.IncompatibleMaxText, match=r"maxtext\.kernels\.megablox:gmm is missing"):
    seam.check()


def test_arguments_are_bound_by_name():
  """The wrappers read maxtext's arguments by name: a keyword call and a positional call give the same step."""
  from MaxText.backends import flags  # pylint: disable=import-outside-toplevel  # beside the wrapper under test
  from MaxText.integration import steps  # pylint: disable=import-outside-toplevel  # as above

  seen = []

  def eval_step(model, config, state, data, dropout_rng=None):
    del model, config, state, data, dropout_rng
    seen.append(int(flags.current_step()))

  wrapped = steps.wrap_step(eval_step)
  state = {"optimizer": {"step": jnp.int32(7)}}
  wrapped(None, None, state, None)
  wrapped(None, None, data=None, state={"optimizer": {"step": jnp.int32(9)}})
  assert seen == [7, 9] and flags.current_step() is None


def test_ragged_dot_is_jaxs_own_around_an_nvfp4_moe_forward(monkeypatch):
  """Routed to the NVFP4 grouped GEMM only while an NVFP4 RoutedMoE call is traced (maxtext's megablox=false path)."""
  from flax import nnx  # pylint: disable=import-outside-toplevel  # maxtext's model build, this test only
  from maxtext.utils import model_creation_utils  # pylint: disable=import-outside-toplevel  # as above

  assert jax.lax.ragged_dot is experts.JAX_RAGGED_DOT
  config = load_config(TINY_YML, "quantization=te_nvfp4", "nvfp4_backend=emulated", "decoder_block=mixtral",
                       "num_experts=4", "num_experts_per_tok=2", "base_moe_mlp_dim=256", "sparse_matmul=true",
                       "megablox=false")
  model = model_creation_utils.from_config(config, rngs=nnx.Rngs(params=0, dropout=1, aqt=2))
  calls = []
  grouped_gemm = experts.grouped_gemm

  def spy(*args, **kwargs):
    calls.append(jax.lax.ragged_dot is not experts.JAX_RAGGED_DOT)  # routed while the call runs
    return grouped_gemm(*args, **kwargs)

  monkeypatch.setattr(experts, "grouped_gemm", spy)
  tokens = jnp.zeros((1, 64), jnp.int32)
  model(tokens, jnp.arange(64)[None], decoder_segment_ids=jnp.ones_like(tokens), enable_dropout=False)
  assert calls == [True, True, True]  # wi_0, wi_1, wo of the (scanned) MoE layer, all through the NVFP4 GEMM
  assert jax.lax.ragged_dot is experts.JAX_RAGGED_DOT


def test_docs_seam_table_is_the_declared_one():
  """docs/backends.md's "How it hooks into maxtext" lists exactly the symbols of seam.HOOKS, in order, each with when
  it is installed."""
  page = (REPO_ROOT / "docs" / "backends.md").read_text(encoding="utf-8")
  section = page.split("\n## How it hooks into maxtext\n", 1)[1].split("\n## ", 1)[0]
  rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", section, flags=re.MULTILINE)
  assert rows and [(t, w.strip()) for t, w in rows] == [(t, h.when) for h in seam.HOOKS for t in h.targets], rows


def test_config_errors_raise_inside_config_errors_raised_and_the_handler_is_back_after(monkeypatch):
  """What --tune tries layouts under (MaxText.preflight.tune): maxtext's own exception instead of the handler's exit
  (our command line's handler exits 2, as this stand-in for it does), inside the block only; the handler in place
  before is the one after it."""
  from maxtext.configs import pyconfig  # pylint: disable=import-outside-toplevel  # after register(), as maxtext's

  seam.register()

  def exits(e):
    raise SystemExit(2) from e

  monkeypatch.setattr(pyconfig, "_handle_config_exception", exits)
  bad = ("quantization=te_nvfp4", "nvfp4_bf16_layers=[7]")  # 2 layers
  with seam.config_errors_raised():
    with pytest.raises(Exception) as raised:
      load_config(TINY_YML, *bad)
  assert not isinstance(raised.value, SystemExit) and "nvfp4_bf16_layers" in str(raised.value)
  assert pyconfig._handle_config_exception is exits  # pylint: disable=protected-access
  with pytest.raises(SystemExit):
    load_config(TINY_YML, *bad)
