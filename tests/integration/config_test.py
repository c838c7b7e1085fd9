# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""Config keys, config files and the plugin's two hooks, checked in-process (no training, no subprocess)."""

from __future__ import annotations

import enum
import pathlib
import re
import subprocess
import sys

import pydantic
import pytest
import yaml

import MaxText
from MaxText.integration import config as plugin_config
from MaxText.integration import seam
from MaxText.precision.modes import NVFP4_MODES, AttentionPrecision, Backend
from tests.helpers import CONFIGS_DIR, REPO_ROOT, TINY_YML, load_config, plugin_defaults

MaxText.register()

# pylint: disable=wrong-import-position,wrong-import-order
from maxtext.configs import pyconfig, types  # noqa: E402  after MaxText.register(), which patches maxtext
from maxtext.layers import quantizations  # noqa: E402  after MaxText.register(), which patches maxtext

_OUR_KEYS = plugin_defaults()


_load = load_config


def _error(*overrides: str) -> str:
  """The one-line form (as `MaxText.train` prints it) of the error maxtext raises loading tiny.yml + `overrides`.

  The library raises maxtext's own exception types: a pydantic ValidationError for a bad value, ValueError for
  maxtext's and our cross-field checks (pydantic wraps those in a ValidationError too).
  """
  with pytest.raises(ValueError) as info:
    _load(TINY_YML, *overrides)
  message = plugin_config.format_config_error(info.value)
  assert "\n" not in message, message
  return message


# --- Our keys -------------------------------------------------------------------------------------------------


def test_our_keys_are_declared_once_with_descriptions() -> None:
  """Every nvfp4_* key lives on NVFP4Config only (not in maxtext), documented, with the agreed default."""
  ours = {k: f for k, f in plugin_config.NVFP4Config.model_fields.items() if k.startswith("nvfp4_")}
  assert {k: (f.default.value if isinstance(f.default, enum.Enum) else f.default) for k, f in ours.items()} == _OUR_KEYS
  assert not [k for k in types.MaxTextConfig.model_fields if k.startswith("nvfp4_")]
  assert all(f.description for f in ours.values())
  assert NVFP4_MODES == ("te_nvfp4", "te_nvfp4_no_rht")
  # maxtext already accepts both modes, so no maxtext edit is needed for them to validate.
  assert set(NVFP4_MODES) <= {q.value for q in types.QuantizationType}


def test_base_yml_repeats_the_declared_defaults() -> None:
  """configs/base.yml states our defaults; it must not drift from NVFP4Config."""
  raw = yaml.safe_load((CONFIGS_DIR / "base.yml").read_text(encoding="utf-8"))
  assert {k: v for k, v in raw.items() if k.startswith("nvfp4_")} == _OUR_KEYS


def test_keys_load_with_defaults() -> None:
  config = _load()
  assert {k: getattr(config, k) for k in _OUR_KEYS} == _OUR_KEYS
  assert isinstance(config.nvfp4_backend, Backend)


def test_keys_from_cli() -> None:
  config = _load(
      TINY_YML,
      "nvfp4_backend=emulated",
      "nvfp4_attention_precision=fp8",
      "nvfp4_stochastic_rounding=false",
      "nvfp4_2d_weight_scaling=False",
  )
  assert config.nvfp4_backend == Backend.EMULATED
  assert config.nvfp4_attention_precision == AttentionPrecision.FP8
  assert config.nvfp4_stochastic_rounding is False
  assert config.nvfp4_2d_weight_scaling is False


def test_keys_from_yaml(tmp_path: pathlib.Path) -> None:
  yml = tmp_path / "mine.yml"
  yml.write_text(
      f'base_config: "{TINY_YML}"\nnvfp4_backend: "emulated"\nnvfp4_stochastic_rounding: false\nquantization: "te_nvfp4"\n',
      encoding="utf-8",
  )
  config = _load(yml)
  assert config.nvfp4_backend == "emulated"
  assert config.nvfp4_stochastic_rounding is False
  assert config.quantization == "te_nvfp4"
  assert config.base_emb_dim == 64  # Inherited from tiny.yml through the chain.


# --- Errors: one line, naming the key, the value and the valid choices ---------------------------------------


def test_misspelt_key() -> None:
  assert _error("nvfp4_bakend=te").startswith("unknown config key 'nvfp4_bakend' (did you mean 'nvfp4_backend'")


def test_wrong_type() -> None:
  message = _error("nvfp4_stochastic_rounding=maybe")
  assert message.startswith("nvfp4_stochastic_rounding='maybe' is invalid: Input should be a valid boolean"), message


def test_bad_enum_value_lists_choices() -> None:
  expected = "nvfp4_backend='bogus' is not a valid choice; valid choices: 'auto', 'te', 'emulated', 'fused'"
  assert _error("nvfp4_backend=bogus") == expected
  assert "valid choices: 'bf16', 'fp8', 'nvfp4'" in _error("nvfp4_attention_precision=fp4")


def test_bad_quantization_lists_choices() -> None:
  message = _error("quantization=bogus")
  assert message.startswith("quantization='bogus' is not a valid choice; valid choices: '', ")
  assert "'fp8'" in message and "'te_nvfp4'" in message and "'te_nvfp4_no_rht'" in message


def test_cross_field_error_is_one_line() -> None:
  """maxtext's own after-validators also come out as one line, with maxtext's wording."""
  message = _error("quantize_logits_proj=true", "quantization=fp8")
  assert message == "`quantize_logits_proj` can only be enabled when `quantization='fp8_full'`.", message


def test_missing_config_file_names_the_given_path() -> None:
  """pyconfig looks for a missing file under "src/"; the one-line form names the path the user typed."""
  missing = CONFIGS_DIR / "tny.yml"
  with pytest.raises(FileNotFoundError):
    _load(missing)
  assert plugin_config.missing_config_file(str(missing)) == f"config file not found: {missing}"


def test_missing_base_config_names_the_base_and_its_includer(tmp_path: pathlib.Path) -> None:
  child = tmp_path / "child.yml"
  child.write_text('base_config: "nothere.yml"\nsteps: 3\n', encoding="utf-8")
  with pytest.raises(FileNotFoundError):
    _load(child)
  message = plugin_config.missing_config_file(str(child))
  assert message.startswith(f"config file not found: base_config 'nothere.yml' of {child} (looked in {tmp_path} and ")


def test_yaml_syntax_error_names_file_and_line(tmp_path: pathlib.Path) -> None:
  bad = tmp_path / "bad.yml"
  bad.write_text('base_config: "base.yml"\nsteps: [1,\n', encoding="utf-8")
  with pytest.raises(yaml.YAMLError) as info:
    _load(bad)
  assert re.match(r"^YAML syntax error in .*bad\.yml, line \d+, column \d+: ", plugin_config.format_config_error(info.value))


def test_maxtexts_error_contract_holds(monkeypatch: pytest.MonkeyPatch) -> None:
  """With the plugin registered, a bad value is still a pydantic ValidationError and maxtext's handler still runs
  (its "MAXTEXT CONFIG ERROR" line; outside tests it writes /dev/termination-log and exits 2)."""
  logged = []
  monkeypatch.setattr(pyconfig.max_logging, "error", logged.append)
  with pytest.raises(pydantic.ValidationError):
    _load(TINY_YML, "steps=-5", "nvfp4_backend=bogus")
  assert any(str(m).startswith("MAXTEXT CONFIG ERROR: ") for m in logged), logged
  handler = pyconfig._handle_config_exception  # pylint: disable=protected-access
  assert handler.__module__ == "maxtext.configs.pyconfig"  # the library never swaps maxtext's handler


def test_unexpected_errors_keep_their_type_and_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
  """A bug inside config loading (TypeError here) is not turned into a config message."""

  def boom(*args, **kwargs):
    raise TypeError("a bug")

  monkeypatch.setattr(pyconfig, "_load_config", boom)
  with pytest.raises(TypeError, match="a bug") as info:
    _load()
  assert not plugin_config.is_config_error(info.value)
  assert any(entry.name == "boom" for entry in info.traceback)


def test_non_config_errors_keep_their_type(monkeypatch: pytest.MonkeyPatch) -> None:
  """A failure that is not about the config (e.g. jax distributed init) is not relabelled as a config error."""

  def boom(*args, **kwargs):
    raise RuntimeError("coordinator unreachable")

  monkeypatch.setattr(pyconfig, "_initialize_pydantic", boom)
  with pytest.raises(RuntimeError, match="coordinator unreachable"):
    _load()


# --- Config files ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "yml", sorted(CONFIGS_DIR.rglob("*.yml")), ids=lambda p: str(p.relative_to(CONFIGS_DIR))
)
def test_every_config_file_parses(yml: pathlib.Path, blackwell) -> None:
  # The Blackwell recipes ask for nvfp4_backend=te, which is checked at load: answer as a GB200 node would.
  config = _load(yml)
  assert config.nvfp4_backend in set(Backend)


def test_base_yml_chains_to_maxtexts_base() -> None:
  """configs/base.yml reaches maxtext's base.yml and not itself (see the comment on its base_config)."""
  raw = yaml.safe_load((CONFIGS_DIR / "base.yml").read_text(encoding="utf-8"))
  first_dir = raw["base_config"].split("/")[0]
  assert not (CONFIGS_DIR / first_dir).exists(), f"configs/{first_dir}/ would capture base.yml's base_config"
  config = _load(CONFIGS_DIR / "base.yml")
  assert config.base_emb_dim == 2048 and config.hardware == "tpu"  # maxtext's own defaults.


# --- The hooks ------------------------------------------------------------------------------------------------


def test_register_is_idempotent() -> None:
  wrapped = (pyconfig.initialize, pyconfig.initialize_pydantic, quantizations.configure_quantization)
  MaxText.register()
  seam.register()
  assert (pyconfig.initialize, pyconfig.initialize_pydantic, quantizations.configure_quantization) == wrapped
  assert seam.is_registered()
  assert getattr(quantizations.configure_quantization, "__wrapped__").__module__ == "maxtext.layers.quantizations"


def test_package_import_is_light() -> None:
  """`import MaxText` must not import maxtext or jax (register() does, when asked)."""
  code = "import sys, MaxText; print(sorted(m for m in ('jax', 'maxtext', 'flax') if m in sys.modules))"
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_nvfp4_backend_te_without_te_fails_at_config_load() -> None:
  """Before any model is built: one line naming the reason and the emulated alternative."""
  message = _error("quantization=te_nvfp4", "nvfp4_backend=te")
  assert "nvfp4_backend=te cannot run here" in message and "nvfp4_backend=emulated" in message
  assert "\n" not in message


def test_nvfp4_with_qwix_quantization_is_refused() -> None:
  assert "use_qwix_quantization=false" in _error("quantization=te_nvfp4_no_rht", "use_qwix_quantization=true")


def test_nvfp4_backend_te_is_only_checked_for_nvfp4_modes() -> None:
  assert _load(TINY_YML, "quantization=fp8", "nvfp4_backend=te").nvfp4_backend == "te"


# --- NVFP4 GEMM shapes, checked when the config loads ---------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["base_mlp_dim=200"], "the train GEMM mlp/wi_0 has N = 200 from mlp_dim=200 (base_mlp_dim=200), not a "
         "multiple of 16 (NVFP4 quantizes in blocks of 16 along every GEMM axis); make it a multiple of 16 (e.g. 208)"),
        (["base_emb_dim=72"], "the train GEMM mlp/wi_0 has K = 72 from emb_dim=72 (base_emb_dim=72)"),
        (["max_target_length=40", "per_device_batch_size=1"],
         "the train GEMM mlp/wi_0 has M (tokens) = 40 from per_device_batch_size=1 max_target_length=40"),
        (["eval_interval=2", "eval_per_device_batch_size=0.5", "max_target_length=16", "per_device_batch_size=1"], None),
        (["eval_interval=2", "eval_per_device_batch_size=1", "max_target_length=24", "per_device_batch_size=2"],
         "the eval GEMM mlp/wi_0 has M (tokens) = 24 from eval_per_device_batch_size=1 max_target_length=24"),
    ],
)
def test_gemm_dims_nvfp4_cannot_block_fail_at_load(overrides: list[str], expected: str | None) -> None:
  args = ["quantization=te_nvfp4", "nvfp4_backend=emulated", *overrides]
  if expected is None:  # 1 device x 0.5 -> maxtext rounds the eval batch up to 1 sequence of 16 tokens: fine
    _load(TINY_YML, *args)
    return
  message = _error(*args)
  assert message.startswith(f"quantization=te_nvfp4: {expected}"), message
  assert _load(TINY_YML, "quantization=fp8", *overrides).quantization == "fp8"  # only NVFP4 modes are checked
  assert _load(TINY_YML, "quantization=te_nvfp4", "nvfp4_mlp_precision=bf16", *overrides)  # nothing in NVFP4


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["nvfp4_bf16_first_layers=-1"], "nvfp4_bf16_first_layers=-1 is negative"),
        (["nvfp4_bf16_last_layers=3"], "nvfp4_bf16_first_layers=0 + nvfp4_bf16_last_layers=3 exceeds the 2 decoder"),
        # Each within the 2 layers, their sum not: the bound is on first + last.
        (["nvfp4_bf16_first_layers=2", "nvfp4_bf16_last_layers=1"],
         "nvfp4_bf16_first_layers=2 + nvfp4_bf16_last_layers=1 exceeds the 2 decoder layers"),
        (["nvfp4_bf16_first_layers=1", "nvfp4_bf16_last_layers=1"], "= all 2 decoder layers puts no GEMM in NVFP4"),
        (["nvfp4_bf16_layers=[2]"], "nvfp4_bf16_layers=[2]: layer 2 is outside [0, 2) (num_decoder_layers=2)"),
        (["nvfp4_bf16_layers=[-1]"], "nvfp4_bf16_layers=[-1]: layer -1 is outside [0, 2)"),
        (["nvfp4_bf16_layers=[1, 1]"], "nvfp4_bf16_layers=[1, 1] names layer 1 more than once"),
        # Named layers count together with first/last: [1] with first=1 leaves no NVFP4 layer of 2.
        (["nvfp4_bf16_layers=[1]", "nvfp4_bf16_first_layers=1"],
         "and nvfp4_bf16_layers=[1] = all 2 decoder layers puts no GEMM in NVFP4"),
        (["nvfp4_bf16_from_step=0"], "nvfp4_bf16_from_step=0 runs every GEMM in BF16 from the first step"),
        (["nvfp4_bf16_forward_from_step=-2"], "nvfp4_bf16_forward_from_step=-2 is negative"),
        (["shard_mode=explicit"], "quantization=te_nvfp4 with shard_mode=explicit"),
    ],
)
def test_bad_recipe_keys_fail_at_load(overrides: list[str], expected: str) -> None:
  assert expected in _error("quantization=te_nvfp4", "nvfp4_backend=emulated", *overrides)


def test_recipe_keys_load() -> None:
  config = _load(TINY_YML, "quantization=te_nvfp4", "nvfp4_bf16_last_layers=1", "nvfp4_bf16_from_step=10",
                 "nvfp4_bf16_forward_from_step=5", "base_num_decoder_layers=3", "nvfp4_bf16_layers=[0]")
  assert config.nvfp4_bf16_layers == [0]
  assert (config.nvfp4_bf16_last_layers, config.nvfp4_bf16_from_step, config.nvfp4_bf16_forward_from_step) == (1, 10, 5)
