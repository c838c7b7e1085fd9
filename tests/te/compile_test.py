# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Compiled, not only lowered: one NVFP4 GEMM (forward and gradients) and maxtext's whole train step, through XLA's
GPU compiler for B200s (the TE backend) and an H100 (the emulated backend a Hopper user runs), described by
MaxText.preflight.targets, on CPU.

What compiling adds to lowering: XLA's GPU passes (fusion, layout, TE's custom calls accepted by the CUDA
compiler pipeline for compute capability 10.0) run to the end, and the executable reports its memory. Not run:
nothing executes (there is no GPU here); a compiled program can still fail at run time on a real device.
"""

from __future__ import annotations

import re

import pytest

from MaxText.preflight.compile import compile_train_step, target_devices
from MaxText.preflight.targets import TARGETS
from tests.helpers import MIXTRAL, MIXTRAL_EXPERTS, settings

DIMS = (((2,), (0,)), ((), ()))
_VARIADIC_REDUCE = re.compile(r"= \(\w+\[([\d,]*)\]\{[^}]*\}, [^=]*?\) reduce\([^)]*\), dimensions=\{(\d+)\}")


def _variadic_row_reductions(text: str) -> list[str]:
  """The reduces of a compiled program that give a tuple and reduce only the operand's last axis (its one more axis
  than the result's): XLA:GPU gives such a reduction over 1x16 blocks a warp per block (quantize.block_amax)."""
  return [m.group(0) for m in _VARIADIC_REDUCE.finditer(text) if int(m.group(2)) == len(m.group(1).split(","))]


def _device(target: str):
  (device,) = target_devices(target, 1)
  assert device.device_kind == TARGETS[target].name
  return device


def _compile_gemm(module, device):
  """d/dx, d/dW of sum(y^2) for y = x W (x: 2 x 64 x 128 bf16, W: 128 x 256) compiled for `device`."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jax.sharding import SingleDeviceSharding  # pylint: disable=import-outside-toplevel

  on = SingleDeviceSharding(device)
  x = jax.ShapeDtypeStruct((2, 64, 128), jnp.bfloat16, sharding=on)
  w = jax.ShapeDtypeStruct((128, 256), jnp.bfloat16, sharding=on)
  rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
  variables = jax.eval_shape(lambda a, b: module.init(rngs, a, b, DIMS), x, w)
  variables = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=on), variables)

  def loss(a, b, v):
    y, _ = module.apply(v, a, b, DIMS, rngs={"dropout": jax.random.key(2)}, mutable=["aqt"])
    return jnp.sum(jnp.square(y.astype(jnp.float32)))

  return jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w, variables).compile()


@pytest.mark.parametrize("target", ["b200", "gb300"])
def test_te_nvfp4_gemm_compiles_for_blackwell(te, target):
  from MaxText.backends import te as te_backend  # pylint: disable=import-outside-toplevel
  from MaxText.precision.policy import Precision  # pylint: disable=import-outside-toplevel

  del te
  compiled = _compile_gemm(te_backend.dot_general_cls(Precision.NVFP4, settings())(), _device(target))
  text = compiled.as_text()
  assert text.count('custom_call_target="te_gemm_v2_ffi"') == 3, "fprop, dgrad and wgrad are TE's FP4 GEMMs"
  memory = compiled.memory_analysis()
  assert memory.argument_size_in_bytes == 2 * 64 * 128 * 2 + 128 * 256 * 2 + 4  # x, W and the SR call counter
  assert 0 < memory.temp_size_in_bytes < TARGETS[target].memory_bytes


def test_emulated_nvfp4_gemm_compiles_for_h100(te):

  from MaxText.backends.emulated import Nvfp4DotGeneral  # pylint: disable=import-outside-toplevel

  del te
  compiled = _compile_gemm(Nvfp4DotGeneral(settings=settings()), _device("h100"))
  assert "te_gemm" not in compiled.as_text()
  assert not _variadic_row_reductions(compiled.as_text()), "1x16 block maxima: two sibling reductions on a GPU"
  assert compiled.memory_analysis().temp_size_in_bytes > 0


@pytest.mark.parametrize("target", ["b200", "gb300"])
def test_fused_nvfp4_gemm_compiles_to_te_gemms_on_our_operands_for_blackwell(te, blackwell, target):
  """nvfp4_backend=fused on Blackwell: our quantizer (XLA fusions) feeding TE's NVFP4 GEMM, three te_gemm_v2_ffi
  calls and none of TE's quantize or RHT-amax kernels. Each GEMM writes its output dtype itself (bf16 here: x and W
  are bf16), never an f32 product cast by a kernel of its own; no conditional (the RHT is one dot in the GPU's order,
  hadamard.Order.PLATFORM, with no exact path beside it; the NaN-free global amax is a reduction, not a branch on
  NaN: a fusion barrier and a host round trip on a GPU); the
  maxima of 1x16 blocks are two sibling reductions in one kernel, not one variadic reduction (a warp per block under
  XLA:GPU)."""
  from MaxText.backends import table  # pylint: disable=import-outside-toplevel
  from MaxText.nvfp4 import hadamard  # pylint: disable=import-outside-toplevel
  from MaxText.precision.modes import Backend  # pylint: disable=import-outside-toplevel
  from MaxText.precision.policy import Precision  # pylint: disable=import-outside-toplevel

  del te, blackwell
  module = table.module_class(Precision.NVFP4, Backend.FUSED, settings())()
  text = _compile_gemm(module, _device(target)).as_text()
  assert text.count('custom_call_target="te_gemm_v2_ffi"') == 3, "fprop, dgrad and wgrad are TE's FP4 GEMMs"
  assert "te_dbias_quantize_ffi" not in text and "te_rht_amax_ffi" not in text  # quantized by our code
  outputs = re.findall(r"= \((\w+)\[[\d,]*\]\{[\d,]*\}, u8\[\d+\]\{0\}\) custom-call\([^\n]*te_gemm_v2_ffi", text)
  assert outputs == ["bf16"] * 3, outputs
  conditionals = re.findall(r" conditional\([^\n]*", text)
  assert not conditionals and hadamard.EXACT_FALLBACK_SCOPE not in text, conditionals
  assert not _variadic_row_reductions(text)


#: The operand the quantizer's compile tests make: bf16 rows x columns.
_OPERAND = (8192, 4096)


def _operand_sized_kernels(fn, operands: int, key: bool = False) -> list:
  """The kernels of `fn` compiled for one GB300 on `operands` bf16 `_OPERAND` inputs (then a jax.random key, with
  `key`) that move at least a byte per input element: the passes over an operand."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jax.sharding import SingleDeviceSharding  # pylint: disable=import-outside-toplevel

  from MaxText.preflight.kernels import kernels  # pylint: disable=import-outside-toplevel

  on = SingleDeviceSharding(_device("gb300"))
  args = [jax.ShapeDtypeStruct(_OPERAND, jnp.bfloat16, sharding=on)] * operands
  if key:
    example = jax.random.key(0)
    args.append(jax.ShapeDtypeStruct(example.shape, example.dtype, sharding=on))
  text = jax.jit(fn).lower(*args).compile().as_text()
  return [k for k in kernels(text) if k.bytes >= _OPERAND[0] * _OPERAND[1]]


@pytest.mark.parametrize("stochastic,axis,most", [(False, 1, 25), (True, 0, 54)])
def test_fused_operand_codes_are_one_pass_of_few_instructions_an_element(te, stochastic, axis, most):
  """The fused backend's GEMM operand (quantize_codes of an 8192 x 4096 bf16 input, 1x16 blocks along `axis`) compiled
  for one GB300: two kernels read the input, the block maxima and then the codes, which make their random bits in the
  same pass (when the bits were read twice, XLA:GPU's cost model charged the hash twice and wrote the bits out in a
  kernel of their own), in at most `most` instructions an element by classify._lane_ops: 24 to nearest, 53 with
  stochastic rounding's hash, against 48 and 73 before the codes were made on the float's bits. (53 was 51 before the
  int-float conversions went, each one op here and one to three cheaper ones now: the machine code's count fell,
  tests/te/sass_test.py.) A GPU runs these passes bound by their instructions, not their bytes (docs/prediction.md)."""
  from MaxText.nvfp4.block_scaled import quantize_codes  # pylint: disable=import-outside-toplevel

  del te

  def codes(x, key):
    operand = quantize_codes(x, "1d", stochastic_rounding=stochastic, key=key if stochastic else None, axis=axis)
    return operand.codes, operand.scales, operand.amax

  operand_sized = _operand_sized_kernels(codes, 1, key=True)
  assert len(operand_sized) == 2, [(k.name, k.bytes) for k in operand_sized]
  per_element = operand_sized[-1].work.lane_ops / (_OPERAND[0] * _OPERAND[1])
  assert per_element <= most, per_element


def test_a_fresh_operands_block_maxima_fuse_into_the_kernel_that_makes_it(te):
  """h = silu(g) * u made and quantized for the fused backend (quantize_codes, 1x16 blocks) compiled for one GB300: two
  operand-sized kernels, the product writing h and its block maxima in one multi-output fusion, then the codes; the
  maxima as two sibling reductions (the NaN-propagating one and the NaN-free one) were a third kernel, reading h
  once more (quantize.block_amax: the operand forms take the second from the first)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from MaxText.nvfp4.block_scaled import quantize_codes  # pylint: disable=import-outside-toplevel

  del te

  def made_and_quantized(g, u):
    h = (jax.nn.silu(g.astype(jnp.float32)) * u.astype(jnp.float32)).astype(jnp.bfloat16)
    operand = quantize_codes(h, "1d")
    return operand.codes, operand.scales, operand.amax, h

  operand_sized = _operand_sized_kernels(made_and_quantized, 2)
  assert len(operand_sized) == 2, [(k.name, k.bytes) for k in operand_sized]


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_target_gives_a_compile_only_device(te, name):
  del te
  assert _device(name).platform == "gpu"


#: The tiny model at TE's sizes: RHT wants 64 token rows and 128 columns per device.
TINY_TE = ["base_emb_dim=128", "head_dim=32", "base_mlp_dim=256", "per_device_batch_size=1", "max_target_length=128"]


def _train_step(overrides, target, count):
  from tests.helpers import TINY_YML  # pylint: disable=import-outside-toplevel
  from tests.te import harness  # pylint: disable=import-outside-toplevel

  given = {o.split("=", 1)[0] for o in overrides}
  base = [o for o in TINY_TE if o.split("=", 1)[0] not in given]  # maxtext refuses a key given twice
  return compile_train_step(harness.load_config(TINY_YML, [*base, *overrides]), target, count)


def _te_gemms(compiled) -> int:
  """TE FP4 GEMM custom calls in the compiled program (one per instruction that calls it)."""
  return len(re.findall(r"custom_call_target=\"te_gemm_v2_ffi\"", compiled.as_text()))


@pytest.mark.parametrize("overrides,count,target", [
    (["quantization=te_nvfp4"], 1, "b200"),
    # One GB300 compute tray, fsdp over its 4 GPUs, with the attention projections in NVFP4 too (the opt-in).
    (["quantization=te_nvfp4", "nvfp4_attention_precision=nvfp4"], 4, "gb300"),
    # te_nvfp4_no_rht, FP8 attention, BF16 edge layers, the late switch and the forward-only switch, unscanned.
    (["quantization=te_nvfp4_no_rht", "nvfp4_attention_precision=fp8", "base_num_decoder_layers=4",
      "nvfp4_bf16_first_layers=1", "nvfp4_bf16_last_layers=1", "nvfp4_bf16_from_step=8",
      "nvfp4_bf16_forward_from_step=5", "scan_layers=false"], 1, "b200"),
    # emb 256: maxtext shards the activations' embed dim over tensor, and TE's RHT wants 128 columns per shard.
    (["quantization=te_nvfp4", "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", "base_emb_dim=256"], 4, "b200"),
    # Gate and up as one GEMM (the exact vLLM export), and every dense GEMM in NVFP4.
    (["quantization=te_nvfp4", "fused_mlp=true", "nvfp4_attention_precision=nvfp4"], 1, "b200"),
    # Our quantizer, TE's GEMM; for one B200 the fused step is compiled by the self-check (tests/te/selfcheck_test.py).
    (["quantization=te_nvfp4", "nvfp4_backend=fused"], 4, "gb300"),
    # Routed experts in NVFP4 on Blackwell: each product one TE NVFP4 GEMM batched over the experts (both layouts).
    (["quantization=te_nvfp4", "nvfp4_backend=fused", *MIXTRAL, "sparse_matmul=false"], 1, "b200"),
    (["quantization=te_nvfp4", "nvfp4_backend=fused", *MIXTRAL, "sparse_matmul=true", "megablox=false"], 1, "b200"),
], ids=["te_nvfp4", "te_nvfp4_gb300_tray_attention", "no_rht_fp8_attention_switches", "fsdp2_tensor2",
        "fused_mlp_attention",
        "fused_gb300_tray", "fused_experts_dense", "fused_experts_sparse"])
def test_te_train_step_compiles_for_blackwell(te, blackwell, overrides, count, target):
  del te, blackwell
  backend = [] if any(o.startswith("nvfp4_backend=") for o in overrides) else ["nvfp4_backend=te"]
  compiled = _train_step([*backend, *overrides], target, count)
  gemms = 2 if "fused_mlp=true" in overrides else 3  # MLP GEMMs per layer body: wi (or wi_0, wi_1) and wo
  if "decoder_block=mixtral" in overrides:  # per expert: fprop, dgrad and wgrad of wi_0, wi_1 and wo
    gemms = 3 * 3 * MIXTRAL_EXPERTS
  if "nvfp4_attention_precision=nvfp4" in overrides:  # and query, key, value and out
    gemms += 4
  assert _te_gemms(compiled) >= gemms, "TE's FP4 GEMMs did not survive to the executable"
  memory = compiled.memory_analysis()
  assert 0 < memory.argument_size_in_bytes and 0 < memory.temp_size_in_bytes < TARGETS[target].memory_bytes


@pytest.mark.parametrize("backend", ["emulated", "fused"])
def test_train_step_compiles_for_h100(te, backend):
  """What a Hopper user runs: the emulated step, and the fused one, whose codes and scales go to jax.nn.scaled_matmul
  (XLA's block-scaled dot, a dequantize + dot on Hopper): no TE GEMM either way (TE refuses NVFP4 there)."""
  del te
  compiled = _train_step(["quantization=te_nvfp4", f"nvfp4_backend={backend}"], "h100", 1)
  assert _te_gemms(compiled) == 0 and compiled.memory_analysis().temp_size_in_bytes > 0


def test_what_the_4_gpu_compile_found_is_refused_at_load(blackwell):
  """Compiling for 4 B200s with fsdp 2 x tensor 2 and emb 128 failed inside TE's partitioner ("Rows must be multiple
  of 64 and cols multiple of 128 when use_rht is True ... rows 256 and cols 64"): maxtext shards the activations'
  embed dim over tensor, so x of wi and dY of wo reach TE's RHT with emb / 2 columns. The config now fails at load,
  naming the GEMM, the column count and the keys."""
  del blackwell
  from tests.helpers import TINY_YML, load_config  # pylint: disable=import-outside-toplevel

  with pytest.raises(Exception) as info:
    load_config(TINY_YML, *TINY_TE, "quantization=te_nvfp4", "nvfp4_backend=te", "ici_fsdp_parallelism=2",
                "ici_tensor_parallelism=2", "internal_compile=true", "internal_compile_num_devices=4")
  assert "K (the columns of x) = 64 per device from emb_dim=128 (base_emb_dim=128) split by tensor=2" in str(info.value)
