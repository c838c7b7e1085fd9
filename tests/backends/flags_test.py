# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""BF16 first/last layers and the late switch to BF16 (nvfp4_bf16_*): the GEMM module, the model, the trainer."""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.backends import flags
from MaxText.backends.emulated import Nvfp4DotGeneral
from MaxText.nvfp4.gemm import MATMUL_DIMS
from MaxText.precision import switches as sw
from tests.backends.helpers import gemm_program
from tests.helpers import TINY_SCHEDULE, read_losses, resumed_losses, settings, train_cli


def _operands() -> tuple[jax.Array, jax.Array, jax.Array]:
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(k1, (32, 64), jnp.bfloat16)
  w = jax.random.normal(k2, (64, 48), jnp.float32) * 0.1
  dy = jax.random.normal(k3, (32, 48), jnp.bfloat16)
  return x, w, dy


@functools.cache
def _gemm(switches: sw.Switches, with_step: bool) -> tuple[dict, Callable]:
  """One Nvfp4DotGeneral under `switches` as one program (tests/backends/helpers.py): the layer index (a variable)
  and the step are traced, as in training (a scanned layer's index, maxtext's step), so every layer and step of one
  `switches` runs the same program."""
  x, w, _ = _operands()
  return gemm_program(Nvfp4DotGeneral(settings=settings(switches=switches)), x, w, MATMUL_DIMS, with_step=with_step)


def _run(switches: sw.Switches, layer: int | None = None, step: int | None = None):
  """Forward output and (dx, dW) of one Nvfp4DotGeneral for a cotangent, at a given layer index and step."""
  variables, run = _gemm(switches, step is not None)
  if layer is not None:
    variables = {**variables, "aqt": {**variables["aqt"], flags.LAYER_NAME: jnp.int32(layer)}}
  return run(variables, jnp.int32(0 if step is None else step), *_operands())


def _value_and_vjp(f, x, w, dy):
  y, vjp = jax.vjp(f, x, w)
  return y, vjp(dy)


@jax.jit
def _bf16(x, w, dy):
  """The GEMM maxtext runs unquantized, and its gradients."""
  return _value_and_vjp(lambda a, b: jax.lax.dot_general(a, b, MATMUL_DIMS).astype(a.dtype), x, w, dy)


def _equal(a, b) -> bool:
  return all(np.array_equal(np.asarray(p), np.asarray(q)) for p, q in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _expect(switches: sw.Switches, cases: list[tuple[dict[str, int], tuple]]) -> None:
  """For each (layer/step, (y, grads)) case: the GEMM under `switches` gives exactly those outputs."""
  for where, (y_want, grads_want) in cases:
    y, grads = _run(switches, **where)
    assert _equal(y, y_want) and _equal(grads, grads_want), where


def test_bf16_layers_run_the_unquantized_gemm_forward_and_backward() -> None:
  """first=1, last=1 of 4 layers: layers 0 and 3 equal the BF16 GEMM (y, dx, dW); layers 1 and 2 are NVFP4."""
  x, w, dy = _operands()
  y_bf16, g_bf16 = _bf16(x, w, dy)
  y_fp4, g_fp4 = _run(sw.Switches())  # no switch at all: the recipe's NVFP4 GEMM
  assert not _equal(y_fp4, y_bf16)
  _expect(sw.Switches(first_layers=1, last_layers=1, num_layers=4),
          [({"layer": layer}, (y_bf16, g_bf16) if layer in (0, 3) else (y_fp4, g_fp4)) for layer in range(4)])


def test_named_bf16_layers_combine_with_edge_layers() -> None:
  """nvfp4_bf16_layers=[2] with last=1 of 5 layers: layers 2 and 4 are BF16, the rest NVFP4; -1 (not a decoder
  layer GEMM) stays NVFP4."""
  x, w, dy = _operands()
  bf16, fp4 = _bf16(x, w, dy), _run(sw.Switches())
  switches = sw.Switches(last_layers=1, layers=(2,), num_layers=5)
  _expect(switches, [({"layer": layer}, bf16 if layer in (2, 4) else fp4) for layer in (-1, 0, 1, 2, 3, 4)])
  assert sw.layer_precisions(switches, "nvfp4") == ["nvfp4", "nvfp4", "bf16", "nvfp4", "bf16"]
  assert sw.layer_precisions(sw.Switches(layers=(1,), num_layers=3), "nvfp4") == ["nvfp4", "bf16", "nvfp4"]
  assert sw.summary(switches, "nvfp4") == "MLP GEMMs per decoder layer: 0-1: nvfp4, 2: bf16, 3: nvfp4, 4: bf16"

def test_late_switch_from_step_changes_all_gemms_at_the_step() -> None:
  x, w, dy = _operands()
  y_bf16, g_bf16 = _bf16(x, w, dy)
  y_fp4, g_fp4 = _run(sw.Switches())
  _expect(sw.Switches(from_step=3), [({"step": step}, (y_bf16, g_bf16) if step >= 3 else (y_fp4, g_fp4))
                                     for step in (0, 2, 3, 7)])


def test_forward_only_switch_keeps_nvfp4_gradients() -> None:
  """nvfp4_bf16_forward_from_step: forward output is the BF16 GEMM's, dx and dW stay bit-identical NVFP4."""
  x, w, dy = _operands()
  y_bf16, g_bf16 = _bf16(x, w, dy)
  y_fp4, g_fp4 = _run(sw.Switches())
  forward = sw.Switches(forward_from_step=3)
  y, grads = _run(forward, step=2)
  assert _equal(y, y_fp4) and _equal(grads, g_fp4)
  y, grads = _run(forward, step=3)
  assert _equal(y, y_bf16) and _equal(grads, g_fp4) and not _equal(grads, g_bf16)


def test_layer_summary_for_the_plan() -> None:
  switches = sw.Switches(first_layers=2, last_layers=8, num_layers=62, from_step=8200)
  assert sw.layer_precisions(switches, "nvfp4")[:3] == ["bf16", "bf16", "nvfp4"]
  assert sw.summary(switches, "nvfp4") == ("MLP GEMMs per decoder layer: 0-1: bf16, 2-53: nvfp4, 54-61: bf16; all "
                                           "NVFP4 GEMMs in BF16 from step 8200")


def test_layer_indices_are_assigned_in_scanned_and_unscanned_models(tmp_path) -> None:
  """The model hook writes each NVFP4 GEMM's decoder layer index: stacked [0..3] under scan, one per layer without.

  Building models outside a training run writes no precision plan.
  """
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from maxtext.utils import model_creation_utils  # pylint: disable=import-outside-toplevel

  from tests.helpers import TINY_YML, load_config  # pylint: disable=import-outside-toplevel

  for scan in ("true", "false"):
    config = load_config(TINY_YML, "quantization=te_nvfp4", "nvfp4_backend=emulated", "base_num_decoder_layers=4",
                         "nvfp4_bf16_first_layers=1", "nvfp4_bf16_last_layers=1", f"scan_layers={scan}",
                         f"base_output_directory={tmp_path}")
    _, model = model_creation_utils.create_nnx_abstract_model(config)
    del model
    concrete = model_creation_utils.from_config(config, rngs=nnx.Rngs(params=0, dropout=1, aqt=2))
    found = {"/".join(map(str, p[:-1])): np.asarray(n.get_value()).tolist()
             for p, n in nnx.iter_graph(concrete) if isinstance(n, nnx.Variable) and p[-1] == flags.LAYER_NAME}
    assert len(found) == (3 if scan == "true" else 12), found
    if scan == "true":
      assert all(v == [0, 1, 2, 3] for v in found.values()), found
    else:
      assert all(v == int(k.split("/")[1].split("_")[1]) for k, v in found.items()), found
  assert not list(tmp_path.rglob("precision_plan.json"))


# --- Through maxtext's trainer (subprocesses) -----------------------------------------------------------------

STEPS = 6
SWITCH = 3
_COMMON = ["quantization=te_nvfp4", "nvfp4_backend=emulated", f"steps={STEPS}", TINY_SCHEDULE]


def _train(root: pathlib.Path, name: str, jax_cache_dir, *overrides: str) -> tuple[list[float], str]:
  run = train_cli([f"run_name={name}", f"base_output_directory={root}", f"metrics_file={root / name}.jsonl",
                   *_COMMON, *overrides], jax_cache_dir)
  assert run.returncode == 0, f"{name}: {run.stderr[-4000:]}"
  return read_losses(root / f"{name}.jsonl"), run.stdout + run.stderr


@pytest.mark.slow
def test_late_switch_through_the_trainer_and_across_a_resume(tmp_path, jax_cache_dir) -> None:
  """Before the switch step the losses equal a pure te_nvfp4 run's bit for bit; from it on they differ; the switch
  is logged once; a run resumed from a checkpoint before the switch step repeats the straight run exactly."""
  pure, _ = _train(tmp_path, "pure", jax_cache_dir)
  ck = ["enable_checkpointing=true", "checkpoint_period=2", "async_checkpointing=false"]
  late, log = _train(tmp_path, "late", jax_cache_dir, f"nvfp4_bf16_from_step={SWITCH}", *ck)
  assert late[:SWITCH] == pure[:SWITCH]
  assert all(a != b for a, b in zip(late[SWITCH:], pure[SWITCH:])), (late, pure)
  assert log.count(f"NVFP4: from step {SWITCH} on (nvfp4_bf16_from_step={SWITCH})") == 1, log[-3000:]

  forward, _ = _train(tmp_path, "forward", jax_cache_dir, f"nvfp4_bf16_forward_from_step={SWITCH}")
  assert forward[:SWITCH] == pure[:SWITCH] and forward[SWITCH] != pure[SWITCH]
  assert forward[SWITCH] == late[SWITCH]  # the forward pass alone makes the loss of the switch step

  resumed = resumed_losses(tmp_path, "late", 2, [*_COMMON, f"nvfp4_bf16_from_step={SWITCH}", *ck], jax_cache_dir)
  assert [resumed[s] for s in range(3, STEPS)] == late[3:], (resumed, late)


@pytest.mark.slow
def test_bf16_edge_layers_scanned_and_unscanned(tmp_path, jax_cache_dir) -> None:
  """first=1, last=1 of 4 layers (scanned), and first=1 with nvfp4_bf16_layers=[3] (unscanned): the same layers in
  BF16 both ways; the plan says so per layer; scanned and unscanned train alike.

  Tolerance: maxtext draws the initial weights differently for a scanned stack (one rng fork per layer inside a
  scan) and for separate layers, so the two runs start from different weights. Measured here: step-0 losses
  6.081 vs 6.117 (0.036 nats apart), every later step within 0.05 (0.04 on a 6-step schedule). Bounds: 0.05 at
  step 0, 0.1 after.
  """
  common = ["base_num_decoder_layers=4", "nvfp4_bf16_first_layers=1"]
  scanned, log = _train(tmp_path, "scanned", jax_cache_dir, *common, "nvfp4_bf16_last_layers=1", "scan_layers=true")
  unscanned, log2 = _train(tmp_path, "unscanned", jax_cache_dir, *common, "nvfp4_bf16_layers=[3]", "scan_layers=false")
  assert abs(scanned[0] - unscanned[0]) < 0.05, (scanned, unscanned)
  assert max(abs(a - b) for a, b in zip(scanned, unscanned)) < 0.1, (scanned, unscanned)
  for name in ("scanned", "unscanned"):
    plan = json.loads((tmp_path / name / "precision_plan.json").read_text())
    assert plan["decoder_layers_mlp"] == ["bf16", "nvfp4", "nvfp4", "bf16"], plan
    assert plan["switches"]["bf16_first_layers"] == 1
  assert json.loads((tmp_path / "unscanned" / "precision_plan.json").read_text())["switches"]["bf16_layers"] == [3]
  assert json.loads((tmp_path / "unscanned" / "nvfp4_run.json").read_text())["nvfp4_bf16_layers"] == [3]
  for text in (log, log2):
    assert "MLP GEMMs per decoder layer: 0: bf16, 1-2: nvfp4, 3: bf16" in text


def test_paper_recipe_variants_differ_from_nvidias_recipe_only_in_the_switches() -> None:
  import yaml  # pylint: disable=import-outside-toplevel

  from tests.helpers import CONFIGS_DIR  # pylint: disable=import-outside-toplevel

  for name, layers, expected in (("llama3_8b", 32, {"nvfp4_bf16_last_layers": 4}),
                                 ("llama3.1_405b", 126, {"nvfp4_bf16_first_layers": 2, "nvfp4_bf16_last_layers": 16})):
    variant = yaml.safe_load((CONFIGS_DIR / "recipes" / "paper" / f"{name}_te_nvfp4_paper.yml").read_text())
    base = yaml.safe_load((CONFIGS_DIR / "recipes" / f"{name}_te_nvfp4.yml").read_text())
    assert variant.pop("base_config") == f"../{name}_te_nvfp4.yml"
    assert variant.pop("run_name") == f"{base['run_name']}_paper"
    assert variant == {**expected, "nvfp4_bf16_from_step": int(0.82 * base["steps"])}
    bf16 = sum(expected.values())
    assert 0.1 < bf16 / layers < 0.2  # the paper keeps about 15% of the blocks in BF16
