# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""maxtext's whole train step with the TE backend, lowered to CUDA StableHLO on CPU (no GPU, nothing compiled).

Inputs come from maxtext's `train_compile.get_shaped_inputs`, the program is maxtext's `train_step`, so this is the
program a Blackwell node would compile. Checked: which TE custom calls it holds, that they sit in the MLP GEMMs
only (attributed through the name stack, which names the TE module class and so the precision, and through the
GEMM's shapes: every MLP GEMM has the mlp dimension, no attention GEMM does), and the recipe's attributes; for
te_nvfp4, te_nvfp4_no_rht, FP8 attention, a BF16 MLP, scan on and off, the Llama 3 8B recipe's shapes (one
layer), and 4 simulated devices with fsdp and tensor parallelism (TE's sharding rules, custom partitioning).
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter

import pytest

from tests.te import harness

GEMM, QUANTIZE, RHT_AMAX = "te_gemm_v2_ffi", "te_dbias_quantize_ffi", "te_rht_amax_ffi"
TINY = harness.REPO_ROOT / "configs" / "tiny.yml"
LLAMA3_8B = harness.REPO_ROOT / "configs" / "recipes" / "llama3_8b_te_nvfp4.yml"
#: The tiny model with every GEMM dim TE's RHT accepts: 64 tokens per device, emb 128, mlp 256, 4 heads of 32.
TINY_TE = ["base_emb_dim=128", "head_dim=32", "base_mlp_dim=256", "per_device_batch_size=1", "max_target_length=64"]
ONE_DEVICE = ["internal_compile=true", "internal_compile_num_devices=1"]  # a 1-device mesh: TE's calls lower directly
MLP_DIM = 256


def _say(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def blackwell(te):
  """Backends are chosen as on a Blackwell node whose TE accepts NVFP4 (TE's own check, with TE imported without a
  driver)."""
  from MaxText.backends import environment as backend  # pylint: disable=import-outside-toplevel
  from tests.helpers import blackwell_environment  # pylint: disable=import-outside-toplevel

  del te
  with backend.answering(blackwell_environment(4, backend.te_nvfp4_support_error())):
    yield


def _lower(config_path, overrides) -> str:
  start = time.perf_counter()
  _say(f"\n  TE lowering: {config_path.name} {' '.join(overrides)}")
  config = harness.load_config(config_path, ["run_name=te_lowering", "enable_checkpointing=false",
                                             "base_output_directory=/tmp/te_lowering", *overrides])
  text = harness.lower_train_step(config, log=_say)
  _say(f"  ... {time.perf_counter() - start:.1f} s in all")
  return text


def _tensor_dims(call) -> set[int]:
  """Every dimension size in the operand and result types of a custom call."""
  dims = set()
  for shape in re.findall(r"tensor<([0-9x]+)x[a-zA-Z]", call.attrs):
    dims.update(int(d) for d in shape.split("x"))
  return dims


def _backward(call) -> bool:
  """In the gradient computation (transposed), not in the forward or a rematerialized forward."""
  return "transpose(" in call.name.split("TeDotGeneral")[-1] or (
      "transpose(" in call.name and "rematted_computation" not in call.name)


def _check_nvfp4_mlp(calls, rht: bool, mlp_dim: int = MLP_DIM, layer_bodies: int = 1, per_layer: int = 3) -> None:
  """The recipe, GEMM by GEMM: `per_layer` MLP GEMMs per layer body (wi_0, wi_1, wo; or the fused wi and wo), each
  fprop + dgrad + wgrad in FP4."""
  nvfp4 = [c for c in calls if "TeDotGeneral_nvfp4" in c.name]
  gemms = [c for c in nvfp4 if c.target == GEMM]
  mlp_dims = {mlp_dim, 2 * mlp_dim}  # the fused wi's N is gate and up together
  assert gemms and all(mlp_dims & _tensor_dims(c) for c in gemms), "an NVFP4 TE GEMM without the mlp dimension"
  backward = [c for c in gemms if _backward(c)]
  assert len(backward) == 2 * per_layer * layer_bodies, [c.name for c in backward]  # dgrad + wgrad of each
  quantize = [c for c in nvfp4 if c.target == QUANTIZE]
  kernel = [c for c in quantize if c.attr("scaling_mode") == "5"]  # NVFP4_2D_SCALING: the weights
  assert kernel and all(c.attr("use_rht") == "false" and c.attr("stochastic_rounding") == "false" for c in kernel)
  sr = [c for c in quantize if c.attr("stochastic_rounding") == "true"]
  assert len(sr) == per_layer * layer_bodies and all(_backward(c) and c.attr("scaling_mode") == "4" for c in sr)  # dY
  rht_quantize = [c for c in quantize if c.attr("use_rht") == "true"]
  rht_amax = [c for c in nvfp4 if c.target == RHT_AMAX]
  if rht:
    assert rht_quantize and len(rht_amax) == len(rht_quantize)  # x and dY, each with its post-RHT amax
    assert {c.attr("scaling_mode") for c in rht_quantize} == {"4"}
  else:
    assert not rht_quantize and not rht_amax


@pytest.fixture(scope="module")
def te_nvfp4_text(blackwell) -> str:
  del blackwell
  return _lower(TINY, ["quantization=te_nvfp4", "nvfp4_backend=te", *TINY_TE, *ONE_DEVICE])


def test_te_nvfp4_scanned_train_step(te_nvfp4_text):
  calls = harness.te_calls(te_nvfp4_text)
  assert calls and all("TeDotGeneral_nvfp4" in c.name for c in calls)  # attention stays bf16: no TE there
  _check_nvfp4_mlp(calls, rht=True)


def test_nonfinite_check_in_the_train_step(blackwell, te_nvfp4_text):
  """nvfp4_nonfinite_check=false removes exactly the guard's is_finite ops (3 per GEMM: x, W forward; dY backward)."""
  del blackwell
  off = _lower(TINY, ["quantization=te_nvfp4", "nvfp4_backend=te", "nvfp4_nonfinite_check=false", *TINY_TE,
                      *ONE_DEVICE])

  def count(text):
    return len(re.findall(r"stablehlo\.is_finite", text))

  # 3 MLP GEMMs in the scanned layer body: x and W checked in the forward and again in its rematerialization for
  # the backward (maxtext's remat), dY in the backward. Nothing else in maxtext's train step uses is_finite.
  assert (count(te_nvfp4_text), count(off)) == (3 * (2 + 2 + 1), 0)
  assert Counter(c.target for c in harness.te_calls(off)) == Counter(c.target for c in harness.te_calls(te_nvfp4_text))


def test_te_nvfp4_no_rht_train_step(blackwell):
  del blackwell
  calls = harness.te_calls(_lower(TINY, ["quantization=te_nvfp4_no_rht", "nvfp4_backend=te", *TINY_TE, *ONE_DEVICE]))
  _check_nvfp4_mlp(calls, rht=False)


def test_fp8_attention_and_unscanned_layers(blackwell):
  """FP8 current scaling in the attention projections only; scan off: each of the 2 layers has its own GEMMs."""
  del blackwell
  calls = harness.te_calls(_lower(TINY, ["quantization=te_nvfp4", "nvfp4_backend=te", "nvfp4_attention_precision=fp8",
                                         "scan_layers=false", *TINY_TE, *ONE_DEVICE]))
  fp8 = [c for c in calls if "TeDotGeneral_fp8" in c.name]
  fp8_gemms = [c for c in fp8 if c.target == GEMM]
  assert fp8_gemms and all(MLP_DIM not in _tensor_dims(c) for c in fp8_gemms)  # attention shapes only
  assert {c.attr("scaling_mode") for c in fp8 if c.target in (GEMM, QUANTIZE)} == {"3"}  # CURRENT_TENSOR_SCALING
  assert len([c for c in fp8_gemms if _backward(c)]) == 2 * 4 * 2  # dgrad + wgrad of q, k, v, out in 2 layers
  _check_nvfp4_mlp([c for c in calls if c not in fp8], rht=True, layer_bodies=2)


def test_fused_gate_and_up_is_one_nvfp4_gemm(blackwell):
  """fused_mlp=true: maxtext's gate and up are one `wi` GEMM through TE (x quantized once, one tensor scale for both,
  as the export assumes: tests/export/fused_test.py), so 2 NVFP4 MLP GEMMs per layer body."""
  del blackwell
  calls = harness.te_calls(_lower(TINY, ["quantization=te_nvfp4", "nvfp4_backend=te", "fused_mlp=true", *TINY_TE,
                                         *ONE_DEVICE]))
  _check_nvfp4_mlp(calls, rht=True, per_layer=2)


def test_bf16_mlp_has_no_te_call(blackwell):
  del blackwell
  text = _lower(TINY, ["quantization=te_nvfp4", "nvfp4_backend=te", "nvfp4_mlp_precision=bf16", *TINY_TE, *ONE_DEVICE])
  assert harness.te_calls(text) == []


def test_llama3_8b_recipe_shapes(blackwell):
  """The recipe file itself (seq 8192, emb 4096, mlp 14336, scan, remat), one decoder layer, dot-product attention
  (cuDNN's fused attention asks the GPU when traced)."""
  del blackwell
  calls = harness.te_calls(_lower(LLAMA3_8B, ["override_model_config=true", "base_num_decoder_layers=1",
                                              "attention=dot_product",
                                              "per_device_batch_size=1", "dataset_type=synthetic", *ONE_DEVICE]))
  _check_nvfp4_mlp(calls, rht=True, mlp_dim=14336)
  assert any({8192, 4096, 14336} <= _tensor_dims(c) for c in calls if c.target == GEMM)


def test_fsdp_and_tensor_parallel_on_4_devices(blackwell, te_nvfp4_text):
  """ici_fsdp_parallelism=2 ici_tensor_parallelism=2: TE's primitives become custom-partitioned calls carrying TE's
  Shardy sharding rules, each registered with its partitioning callback on the 2x2 mesh. emb 256: with 128 the
  activations' embed shard (emb / tensor) is below TE's RHT minimum, which only a compile shows (compile_test.py)
  and the config now refuses at load."""
  from jax._src import custom_partitioning  # pylint: disable=import-outside-toplevel

  del blackwell
  text = _lower(TINY, ["quantization=te_nvfp4", "nvfp4_backend=te", "ici_fsdp_parallelism=2",
                       "ici_tensor_parallelism=2", "base_emb_dim=256", *TINY_TE[1:3], "per_device_batch_size=1"])
  partitioned = [c for c in harness.custom_calls(text) if c.target == "CustomSPMDPartitioning"]
  assert partitioned and all("TeDotGeneral_nvfp4" in c.name and "sdy.sharding_rule" in c.attrs for c in partitioned)
  primitives, meshes = Counter(), set()
  for c in partitioned:  # the callback XLA's partitioner will call, registered under the call's backend_config
    key = re.search(r'backend_config = "(\d+)"', c.attrs).group(1).encode()
    info = custom_partitioning._sharding_callbacks[key]  # pylint: disable=protected-access
    primitives[info.partition.__qualname__.split(".")[0]] += 1
    meshes.add(tuple(sorted((axis, size) for axis, size in info.mesh.shape.items() if size > 1)))
  assert meshes == {(("fsdp", 2), ("tensor", 2))}, meshes
  # The same TE GEMMs, quantizations and RHT amaxes as the single-device program; sharded, the tensor amaxes that a
  # single device takes inside the quantize kernel become their own (all-reduced) amax primitive.
  single = Counter(c.target for c in harness.te_calls(te_nvfp4_text))
  assert primitives["GemmPrimitive"] == single[GEMM], (primitives, single)
  assert primitives["BaseDBiasQuantizePrimitive"] == single[QUANTIZE], (primitives, single)
  assert primitives["RHTAmaxCalculationPrimitive"] == single[RHT_AMAX], (primitives, single)
  assert set(primitives) <= {"GemmPrimitive", "BaseDBiasQuantizePrimitive", "RHTAmaxCalculationPrimitive",
                             "AmaxCalculationPrimitive"}, primitives


def test_bf16_edge_layers_and_late_switch(blackwell, te_nvfp4_text):
  """nvfp4_bf16_first/last_layers, nvfp4_bf16_from_step and nvfp4_bf16_forward_from_step on TE, in one config that
  loads (the forward-only switch is no longer refused on TE): the same NVFP4 TE calls, now one branch of a
  conditional (stablehlo.case) whose other branch is the plain GEMM, chosen per layer and step at run time."""
  del blackwell
  text = _lower(TINY, ["quantization=te_nvfp4", "nvfp4_backend=te", "base_num_decoder_layers=4",
                       "nvfp4_bf16_first_layers=1", "nvfp4_bf16_last_layers=1", "nvfp4_bf16_from_step=5",
                       "nvfp4_bf16_forward_from_step=3", *TINY_TE, *ONE_DEVICE])
  calls = harness.te_calls(text)
  _check_nvfp4_mlp(calls, rht=True)
  assert Counter(c.target for c in calls) == Counter(c.target for c in harness.te_calls(te_nvfp4_text))
  assert "stablehlo.case" not in te_nvfp4_text and len(re.findall(r"stablehlo\.case", text)) >= 3
