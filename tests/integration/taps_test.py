# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The tap registry (MaxText.precision.taps): every periodic measurement is one entry, and one declared outside the
package, in a distribution of its own, reaches maxtext's metrics file, the run record, the config checks and the
pre-flight with no change to any module of ours."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import pathlib
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.backends import stages
from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.nvfp4.operands import GEMM_OPERANDS
from MaxText.precision import taps
from MaxText.precision.keys import PluginKeys
from tests.helpers import REPO_ROOT, subprocess_env, train_cli

#: A toy tap: each NVFP4 GEMM's operands' mean |.| (x, W and dY, before any quantization), every N steps.
_TOY_MODULE = '''
import jax.numpy as jnp

from MaxText.precision.measures import operand_rows
from MaxText.precision.taps import ExpertReduction, Tap


def _mean_abs(t):
  return jnp.mean(jnp.abs(t).astype(jnp.float32))


def _measure(recipe, candidate):
  del recipe, candidate  # the raw operands: no quantizer involved
  return operand_rows(("mean_abs",), lambda x, w: jnp.stack([_mean_abs(x), _mean_abs(w), _mean_abs(x)])[:, None],
                      lambda dy: jnp.stack([_mean_abs(dy), _mean_abs(dy)])[:, None])


MEAN_ABS = Tap(name="mean_abs", what="the mean magnitude", description="Every N steps, each GEMM's operand mean |.|.",
               prefix="nvfp4/mean_abs/", columns=("mean_abs",), experts=ExpertReduction.MEAN, measure=_measure)
'''


def _toy_distribution(root: pathlib.Path, value: str = "toy_tap:MEAN_ABS") -> pathlib.Path:
  """A directory that, on PYTHONPATH, is an installed distribution declaring one tap under the registry's group."""
  root.mkdir(parents=True, exist_ok=True)
  (root / "toy_tap.py").write_text(_TOY_MODULE)
  info = root / "toy_tap-0.1.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-tap\nVersion: 0.1\n")
  (info / "entry_points.txt").write_text(f"[{taps.ENTRY_POINT_GROUP}]\nmean_abs = {value}\n")
  return root


def _python(code: str, toy: pathlib.Path) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO_ROOT, capture_output=True, text=True,
                        env=subprocess_env({"PYTHONPATH": str(toy)}), timeout=120, check=False)


def test_the_built_in_taps_are_entries_with_their_keys_variables_and_prefixes():
  assert [(t.key, t.variable, t.prefix) for t in taps.TAPS] == [
      ("nvfp4_stats_interval", "nvfp4_stats", "nvfp4/"), ("nvfp4_audit_interval", "nvfp4_audit", "nvfp4/audit/"),
      ("nvfp4_calibration_interval", "nvfp4_calibration", "nvfp4/calibration/")]
  assert all(PluginKeys.model_fields[t.key].default == 0 for t in taps.TAPS)
  assert taps.STATISTICS.metric(3, "mlp/wo", "wgrad_dy", "rel_error") == "nvfp4/layer_03/mlp/wo/wgrad_dy/rel_error"
  # The statistics' prefix is the start of the audit's: a metric belongs to the tap whose prefix precedes a layer.
  name = taps.AUDIT.metric(0, "mlp/wo", "fprop_x", "codes")
  assert taps.AUDIT.owns(name) and not taps.STATISTICS.owns(name)


def test_two_taps_with_one_name_or_prefix_are_refused():
  with pytest.raises(ValueError, match="two taps declare name='stats'"):
    taps._checked((taps.STATISTICS, taps.STATISTICS))  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="two taps declare prefix='nvfp4/audit/'"):
    taps._checked((taps.AUDIT, dataclasses.replace(taps.AUDIT, name="other")))  # pylint: disable=protected-access


def _registry_built_with(monkeypatch: pytest.MonkeyPatch, declare: Callable[[types.ModuleType], taps.Tap]) -> tuple:
  """TAPS as the module builds it when it is imported, with one installed tap, `declare(module)`: the module's code
  run afresh under another name (the imported module, which the rest of the package holds, stays as it is), with
  importlib.metadata.entry_points answering one entry point of the registry's group."""
  spec = importlib.util.spec_from_file_location("_taps_rebuilt", taps.__file__)
  module = importlib.util.module_from_spec(spec)

  class Point:  # what importlib.metadata.entry_points yields, as much as the registry reads of it
    name, value = "toy", "toy_tap:TOY"

    def load(self) -> taps.Tap:
      return declare(module)  # a Tap of the rebuilt module's own class, as its isinstance check needs

  real = importlib.metadata.entry_points
  monkeypatch.setattr(importlib.metadata, "entry_points",
                      lambda **kw: [Point()] if kw.get("group") == taps.ENTRY_POINT_GROUP else real(**kw))
  monkeypatch.setitem(sys.modules, "_taps_rebuilt", module)
  spec.loader.exec_module(module)
  return module.TAPS


def test_the_registry_the_module_builds_refuses_an_installed_tap_reusing_a_name_or_a_prefix(monkeypatch):
  """The check runs on the registry the import actually builds, built-in and installed taps together: an installed
  tap named `stats`, or writing under the audit's prefix, would share a config key or metrics with a built-in one."""
  def toy(module: types.ModuleType) -> taps.Tap:
    return dataclasses.replace(module.STATISTICS, name="toy", prefix="nvfp4/toy/")

  assert [t.name for t in _registry_built_with(monkeypatch, toy)] == ["stats", "audit", "calibration", "toy"]
  with pytest.raises(ValueError, match="two taps declare name='stats'"):
    _registry_built_with(monkeypatch, lambda m: dataclasses.replace(m.STATISTICS, prefix="nvfp4/toy/"))
  with pytest.raises(ValueError, match="two taps declare prefix='nvfp4/audit/'"):
    _registry_built_with(monkeypatch, lambda m: dataclasses.replace(m.AUDIT, name="toy"))


def test_the_calibration_measures_each_operand_s_own_amax():
  """Every row of the calibration (the tap as the GEMM pipeline runs it, MaxText.backends.stages.tap): the amax of
  the tensor the operand is made from, x for fprop_x and wgrad_x, W for fprop_w, dY for dgrad_dy and wgrad_dy. Three
  distinct amax values, so a row holding another operand's is seen."""
  amax = {"x": 3.0, "w": 5.0, "dy": 7.0}
  x = jnp.full((16, 32), 0.5).at[2, 3].set(-amax["x"])
  w = jnp.full((32, 16), 0.25).at[4, 1].set(amax["w"])
  dy = jnp.full((16, 16), 0.125).at[7, 9].set(-amax["dy"])
  measure = taps.CALIBRATION.measure_of(GemmRecipe(), None)

  @jax.jit
  def measured(x, w, dy):
    def loss(x, w, sink):
      tapped = stages.tap(lambda a, b, extra: a @ b, measure, lambda a, b: (a, b), sink, jnp.bool_(True))
      return jnp.sum(tapped(x, w, None) * dy)

    return jax.grad(loss, argnums=2)(x, w, measure.empty())  # the sink's cotangent: the measurement

  rows = np.asarray(measured(x, w, dy))
  assert rows.shape == (len(GEMM_OPERANDS), 1)
  assert dict(zip(GEMM_OPERANDS, rows[:, 0].tolist(), strict=True)) == {
      "fprop_x": 3.0, "fprop_w": 5.0, "dgrad_dy": 7.0, "wgrad_x": 3.0, "wgrad_dy": 7.0}


@pytest.mark.slow  # a subprocess importing jax
def test_an_entry_point_that_is_not_a_tap_is_refused_by_name(tmp_path):
  toy = _toy_distribution(tmp_path, value="toy_tap:_mean_abs")
  run = _python("import MaxText.precision.keys", toy)
  assert run.returncode != 0
  assert "entry point mean_abs = toy_tap:_mean_abs in group maxtext_nvfp4.taps is a function, not a" in run.stderr


@pytest.mark.slow
def test_a_tap_declared_outside_the_package_reaches_metrics_record_checks_and_preflight(tmp_path, jax_cache_dir):
  toy = _toy_distribution(tmp_path / "site")
  root, metrics = tmp_path / "out", tmp_path / "metrics.jsonl"
  run = train_cli(["run_name=toy", f"base_output_directory={root}", f"metrics_file={metrics}",
                   "quantization=te_nvfp4", "nvfp4_backend=emulated", "nvfp4_mean_abs_interval=2"], jax_cache_dir,
                  env={"PYTHONPATH": str(toy)})
  assert run.returncode == 0, run.stderr[-4000:]

  # maxtext's metrics file: the toy tap's metrics on its steps (0, 2, 4 of 5) only; no statistics (they are off).
  rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
  toy_steps = [int(r["step"]) for r in rows if any(k.startswith("nvfp4/mean_abs/") for k in r)]
  assert toy_steps == [0, 2, 4]
  first = {k: v for k, v in rows[0].items() if k.startswith("nvfp4/")}
  assert set(first) == {f"nvfp4/mean_abs/layer_{layer:02d}/mlp/{gemm}/{operand}/mean_abs" for layer in (0, 1)
                        for gemm in ("wi_0", "wi_1", "wo")
                        for operand in ("fprop_x", "fprop_w", "dgrad_dy", "wgrad_x", "wgrad_dy")}
  assert all(v > 0 for v in first.values())
  x = "nvfp4/mean_abs/layer_00/mlp/wo/{}/mean_abs"  # x enters fprop and wgrad: one value, in both rows
  assert first[x.format("fprop_x")] == first[x.format("wgrad_x")]

  # The run record holds its interval beside the built-in taps'.
  record = json.loads((root / "toy" / "nvfp4_run.json").read_text())
  assert (record["nvfp4_mean_abs_interval"], record["nvfp4_stats_interval"]) == (2, 0)

  # The config checks refuse it where it cannot measure, naming its key; the pre-flight prices it and compiles
  # comparison programs without it.
  check = _python("""
      from MaxText.integration.settings import settings_of
      from MaxText.preflight import programs
      from tests.helpers import TINY_YML, load_config
      try:
        load_config(TINY_YML, "quantization=fp8", "nvfp4_mean_abs_interval=2")
      except ValueError as e:
        print("refused:", e)
      settings = settings_of(load_config(TINY_YML, "quantization=te_nvfp4", "nvfp4_mean_abs_interval=5"))
      print("priced:", [(t.key, t.interval, t.off) for t in programs.taps(settings)])
      print("off:", "nvfp4_mean_abs_interval=0" in programs.TAPS_OFF)
      """, toy)
  assert check.returncode == 0, check.stderr[-4000:]
  assert ("nvfp4_mean_abs_interval=2 with quantization='fp8': it measures NVFP4 GEMMs (the mean magnitude)"
          in check.stdout.split("refused:", 1)[1])
  assert "priced: [('nvfp4_mean_abs_interval', 5, 'nvfp4_mean_abs_interval=0')]" in check.stdout
  assert "off: True" in check.stdout


def test_the_declared_columns_are_the_numerics_own():
  """The registry declares its built-in taps without importing the numerics (jax); their columns are the numerics'."""
  from MaxText.nvfp4 import audit  # pylint: disable=import-outside-toplevel
  from MaxText.nvfp4.stats import STAT_NAMES, WGRAD_STAT_NAMES  # pylint: disable=import-outside-toplevel

  assert (taps.STATISTICS.columns, taps.AUDIT.columns) == (STAT_NAMES, audit.COLUMNS)
  assert taps.STATISTICS.gradient == WGRAD_STAT_NAMES and not taps.AUDIT.gradient
  assert taps.STATISTICS.variables == ("nvfp4_stats", "nvfp4_stats_wgrad")
