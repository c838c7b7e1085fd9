# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""One TE GEMM module of MaxText/te_backend.py, forward and gradients, lowered to CUDA: its custom calls and recipe.

NVIDIA's recipe per NVFP4 GEMM (and what TE must be asked for): fprop, dgrad and wgrad are three FP4 GEMMs
(te_gemm_v2_ffi); x, W and dY are each quantized once (te_dbias_quantize_ffi), W with 16x16 (2D) scales, x and dY
with 1x16; the Random Hadamard Transform only on the wgrad operands x and dY (their RHT amax, te_rht_amax_ffi,
and use_rht on their quantize), never on W; stochastic rounding only on dY.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest

from tests.helpers import settings
from tests.te import harness

GEMM, QUANTIZE, RHT_AMAX = "te_gemm_v2_ffi", "te_dbias_quantize_ffi", "te_rht_amax_ffi"


def _lower_gemm(te, recipe, precision="nvfp4", nonfinite_check=True, stats_interval=0, switches=None) -> str:
  """d/dx, d/dW of sum(y^2) for y = x W through one TE module, lowered for CUDA (y^2 keeps the fprop GEMM live).

  With stats_interval, inside a traced training step, and d/d(the statistics variable) too (what maxtext's train
  step takes from the `_overwrite_with_gradient` collection)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from MaxText.backends import flags  # pylint: disable=import-outside-toplevel
  from MaxText.backends import te as te_backend  # pylint: disable=import-outside-toplevel
  from MaxText.backends.pipeline import OVERWRITE_COLLECTION as STATS_COLLECTION  # pylint: disable=import-outside-toplevel
  from MaxText.precision.policy import Precision  # pylint: disable=import-outside-toplevel
  from MaxText.precision.switches import Switches  # pylint: disable=import-outside-toplevel

  del te  # imported without a driver by the fixture
  module = te_backend.dot_general_cls(Precision(precision), settings(
      recipe=recipe, nonfinite_check=nonfinite_check, switches=switches or Switches(), stats_interval=stats_interval))()
  x = jax.ShapeDtypeStruct((2, 64, 128), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((128, 256), jnp.bfloat16)
  dims = (((2,), (0,)), ((), ()))
  rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
  variables = jax.eval_shape(lambda a, b: module.init(rngs, a, b, dims), x, w)

  stats = variables.get(STATS_COLLECTION)

  def loss(a, b, v, step, stats):
    with flags.step_scope(step):
      y, _ = module.apply({**v, **({STATS_COLLECTION: stats} if stats else {})}, a, b, dims,
                          rngs={"dropout": jax.random.key(2)}, mutable=["aqt"])
    return jnp.sum(jnp.square(y.astype(jnp.float32)))

  argnums = (0, 1, 4) if stats_interval else (0, 1)
  return harness.lower_cuda(jax.grad(loss, argnums=argnums), x, w, variables, jax.ShapeDtypeStruct((), jnp.int32),
                            stats)


def _scaling_modes():
  from transformer_engine.jax.quantize import ScalingMode  # pylint: disable=import-outside-toplevel

  return {"1d": str(int(ScalingMode.NVFP4_1D_SCALING.value)), "2d": str(int(ScalingMode.NVFP4_2D_SCALING.value)),
          "fp8": str(int(ScalingMode.CURRENT_TENSOR_SCALING.value))}


def _summary(calls):
  """Each quantize call as (scaling mode, use_rht, stochastic_rounding, in backward?), sorted."""
  return sorted((c.attr("scaling_mode"), c.attr("use_rht"), c.attr("stochastic_rounding"), "transpose(" in c.name)
                for c in calls if c.target == QUANTIZE)


def test_nvfp4_gemm_forward_and_gradients_follow_the_recipe(te):
  from MaxText.nvfp4.gemm import GemmRecipe  # pylint: disable=import-outside-toplevel

  calls = harness.te_calls(_lower_gemm(te, GemmRecipe(rht=True, stochastic_rounding=True, weight_2d=True)))
  assert Counter(c.target for c in calls) == {GEMM: 3, QUANTIZE: 3, RHT_AMAX: 2}, calls
  modes = _scaling_modes()
  assert {c.attr("scaling_mode") for c in calls if c.target == GEMM} == {modes["1d"]}  # FP4 operands, 1x16 view
  assert _summary(calls) == sorted([
      (modes["1d"], "true", "false", False),  # x: RHT (for its wgrad copy), nearest
      (modes["2d"], "false", "false", False),  # W: 16x16 scales, no RHT, nearest
      (modes["1d"], "true", "true", True),  # dY (backward): RHT, stochastic rounding
  ])
  assert all("TeDotGeneral_nvfp4" in c.name for c in calls)


def test_no_rht_and_no_sr_recipe_flags_reach_te(te):
  from MaxText.nvfp4.gemm import GemmRecipe  # pylint: disable=import-outside-toplevel

  calls = harness.te_calls(_lower_gemm(te, GemmRecipe(rht=False, stochastic_rounding=False, weight_2d=True)))
  assert Counter(c.target for c in calls) == {GEMM: 3, QUANTIZE: 3}, calls
  assert {(c.attr("use_rht"), c.attr("stochastic_rounding")) for c in calls if c.target == QUANTIZE} == {
      ("false", "false")}


def test_1d_weights_with_rht_lower_with_a_plain_kernel_quantizer(te):
  """nvfp4_2d_weight_scaling=false with RHT: TE's own quantizer set would Hadamard-transform the 1D-scaled kernel
  (which its GEMM then refuses); te_backend turns that off, so the kernel is quantized 1D without RHT."""
  import jax  # pylint: disable=import-outside-toplevel
  from transformer_engine.common import recipe as te_recipe  # pylint: disable=import-outside-toplevel
  from transformer_engine.jax.flax.module import TransformerEngineBase  # pylint: disable=import-outside-toplevel

  from MaxText.backends.te import nvfp4_recipe_kwargs  # pylint: disable=import-outside-toplevel
  from MaxText.nvfp4.gemm import GemmRecipe  # pylint: disable=import-outside-toplevel

  recipe = GemmRecipe(rht=True, stochastic_rounding=True, weight_2d=False)

  class Probe(TransformerEngineBase):  # TE's quantizer set for this recipe, untouched

    def __call__(self):
      return self.generate_quantizer_set(fp8_recipe=te_recipe.NVFP4BlockScaling(**nvfp4_recipe_kwargs(recipe)))

  raw = Probe().apply({}, rngs={"sr_rng": jax.random.key(0)})
  assert raw.kernel.use_rht, "TE 2.20.2 no longer turns RHT on for a 1D kernel: te_backend's workaround is moot"

  calls = harness.te_calls(_lower_gemm(te, recipe))
  modes = _scaling_modes()
  assert _summary(calls) == sorted([
      (modes["1d"], "true", "false", False),  # x
      (modes["1d"], "false", "false", False),  # W: 1x16 scales, no RHT
      (modes["1d"], "true", "true", True),  # dY
  ])


def test_fp8_current_scaling_module(te):
  from MaxText.nvfp4.gemm import GemmRecipe  # pylint: disable=import-outside-toplevel

  calls = harness.te_calls(_lower_gemm(te, GemmRecipe(), precision="fp8"))
  assert {c.attr("scaling_mode") for c in calls if c.target in (GEMM, QUANTIZE)} == {_scaling_modes()["fp8"]}
  assert not [c for c in calls if c.target == RHT_AMAX] and all("TeDotGeneral_fp8" in c.name for c in calls)


@pytest.mark.parametrize("check", [True, False])
def test_nonfinite_check_ops_sit_beside_te(te, check):
  """nvfp4_nonfinite_check: an is_finite(max|.|) per operand, x and W in the forward, dY in the backward."""
  from MaxText.nvfp4.gemm import GemmRecipe  # pylint: disable=import-outside-toplevel

  text = _lower_gemm(te, GemmRecipe(), nonfinite_check=check)
  assert len(re.findall(r"stablehlo\.is_finite", text)) == (3 if check else 0)
  assert len(harness.te_calls(text)) == 8  # the TE calls themselves are the same either way
  x, w, dy = "tensor<2x64x128xbf16>", "tensor<128x256xbf16>", "tensor<2x64x256xbf16>"
  if check:  # each output selected on the checks of exactly the two operands that feed it
    assert harness.guard_inputs(text, dy) == [{x, w}]  # y
    assert harness.guard_inputs(text, x) == [{dy, w}]  # dx
    assert harness.guard_inputs(text, w) == [{x, dy}]  # dW
    for out in (dy, x, w):  # y, dx, dW: unchanged (x 1) when their operands are finite, NaN (not 0) when one is not
      ((ok, bad),) = harness.guard_factors(text, out)
      assert ok == 1.0 and math.isnan(bad), (out, ok, bad)


def test_backend_probe_uses_te_support_check(te):
  """MaxText.backends.environment asks TE's is_scaling_mode_supported(NVFP4): yes at SM 10.0, TE's own reason at SM 9.0."""
  from MaxText.backends import environment as backend  # pylint: disable=import-outside-toplevel
  from MaxText.backends.table import resolve_backend  # pylint: disable=import-outside-toplevel
  from MaxText.preflight import deviceless  # pylint: disable=import-outside-toplevel

  del te
  assert backend.te_nvfp4_support_error() is None
  try:
    deviceless.answer(90)
    reason = backend.te_nvfp4_support_error()
  finally:
    deviceless.answer()
  assert reason and "10.0" in reason, reason
  env = backend.Environment(te_error=None, gpu_capabilities=(10.0,), te_nvfp4_error=reason)
  with pytest.raises(ValueError, match="support check refuses NVFP4"):
    resolve_backend("te", env)


def test_te_module_serves_a_new_stochastic_rounding_key_each_step(te):
  """TE draws its SR state from make_rng("sr_rng"): the TE module serves sr_key, so two steps with maxtext's same
  rng but the carried call counter get different keys (a constant key would round dY the same way every step)."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  from MaxText.backends import te as te_backend  # pylint: disable=import-outside-toplevel
  from MaxText.backends.sr import SR_COUNT_NAME  # pylint: disable=import-outside-toplevel
  from MaxText.precision.policy import Precision  # pylint: disable=import-outside-toplevel

  del te

  class Probe(te_backend.dot_general_cls(Precision.NVFP4, settings())):  # the TE module's make_rng, TE not run
    @nn.compact
    def __call__(self):  # pylint: disable=arguments-differ
      return self.make_rng("sr_rng")  # once per forward, as TE asks (for the output-gradient quantizer)

  aqt, keys = {SR_COUNT_NAME: jnp.uint32(1)}, []
  for _ in range(3):  # three train steps: the same rng, the counter carried
    key, state = Probe().apply({"aqt": aqt}, rngs={"dropout": jax.random.key(5)}, mutable=["aqt"])
    keys.append(np.asarray(jax.random.key_data(key)))
    aqt = state["aqt"]
  assert len({k.tobytes() for k in keys}) == 3, keys


def test_operand_statistics_sit_beside_te_without_changing_its_calls(te):
  """nvfp4_stats_interval on TE: TE's own calls are unchanged (3 GEMMs, 3 quantizes, 2 RHT amaxes); our quantizer's
  statistics run under conditionals beside them (forward: x, W, x^T; backward: dY, dY^T), and the statistics
  variable gets a 5 x 4 gradient, which maxtext's train step writes back into it."""
  from MaxText.nvfp4.gemm import GemmRecipe  # pylint: disable=import-outside-toplevel

  plain = _lower_gemm(te, GemmRecipe())
  text = _lower_gemm(te, GemmRecipe(), stats_interval=10)
  assert Counter(c.target for c in harness.te_calls(text)) == Counter(c.target for c in harness.te_calls(plain))
  assert text.count("stablehlo.case") >= plain.count("stablehlo.case") + 2, "the statistics are not conditional"
  (main,) = [line for line in text.splitlines() if "func.func public @main" in line]
  assert main.rsplit("->", 1)[1].count("tensor<5x4xf32>") == 1, main  # d/d(statistics variable) is an output


def test_forward_only_switch_keeps_tes_nvfp4_gradients(te):
  """nvfp4_bf16_forward_from_step on TE: one program holding TE's whole NVFP4 GEMM (3 GEMMs, 3 quantizes, 2 RHT
  amaxes: its dgrad and wgrad are TE's, on TE's quantized operands) and, beside it, the unquantized forward GEMM,
  the two forward outputs picked by a conditional on the step."""
  from MaxText.nvfp4.gemm import GemmRecipe  # pylint: disable=import-outside-toplevel
  from MaxText.precision.switches import Switches  # pylint: disable=import-outside-toplevel

  plain = _lower_gemm(te, GemmRecipe())
  text = _lower_gemm(te, GemmRecipe(), switches=Switches(forward_from_step=3))
  assert Counter(c.target for c in harness.te_calls(text)) == {GEMM: 3, QUANTIZE: 3, RHT_AMAX: 2}
  assert text.count("stablehlo.case") > plain.count("stablehlo.case")
  bf16_dot = re.compile(r"stablehlo\.dot_general .*tensor<2x64x128xbf16>, tensor<128x256xbf16>")
  assert bf16_dot.search(text) and not bf16_dot.search(plain), "no unquantized forward GEMM beside TE's"
