# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Compiled, not only lowered: one NVFP4 GEMM (forward and gradients) through XLA's GPU compiler for a B200 (the
TE backend) and an H100 (the emulated backend a Hopper user runs), described by MaxText.backends.targets, on CPU.

What compiling adds to lowering: XLA's GPU passes (fusion, layout, TE's custom calls accepted by the CUDA
compiler pipeline for compute capability 10.0) run to the end, and the executable reports its memory. Not run:
nothing executes (there is no GPU here); a compiled program can still fail at run time on a real device.
"""

from __future__ import annotations

import pytest

from MaxText.backends.targets import TARGETS

DIMS = (((2,), (0,)), ((), ()))


def _device(target: str):
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel

  topology = topologies.get_topology_desc("", "cuda", topology="1x1x1", target_config=TARGETS[target].target_config())
  (device,) = topology.devices
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


def test_te_nvfp4_gemm_compiles_for_b200(te):
  from MaxText.backends import te as te_backend  # pylint: disable=import-outside-toplevel
  from MaxText.nvfp4.gemm import GemmRecipe  # pylint: disable=import-outside-toplevel
  from MaxText.precision.policy import Precision  # pylint: disable=import-outside-toplevel

  del te
  compiled = _compile_gemm(te_backend.dot_general_cls(Precision.NVFP4, GemmRecipe())(), _device("b200"))
  text = compiled.as_text()
  assert text.count('custom_call_target="te_gemm_v2_ffi"') == 3, "fprop, dgrad and wgrad are TE's FP4 GEMMs"
  memory = compiled.memory_analysis()
  assert memory.argument_size_in_bytes == 2 * 64 * 128 * 2 + 128 * 256 * 2 + 4  # x, W and the SR call counter
  assert 0 < memory.temp_size_in_bytes < TARGETS["b200"].memory_bytes


def test_emulated_nvfp4_gemm_compiles_for_h100(te):
  import functools  # pylint: disable=import-outside-toplevel

  from MaxText.backends.emulated import Nvfp4DotGeneral  # pylint: disable=import-outside-toplevel
  from MaxText.nvfp4.gemm import GemmRecipe  # pylint: disable=import-outside-toplevel

  del te
  compiled = _compile_gemm(functools.partial(Nvfp4DotGeneral, recipe=GemmRecipe())(), _device("h100"))
  assert "te_gemm" not in compiled.as_text()
  assert compiled.memory_analysis().temp_size_in_bytes > 0


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_target_gives_a_compile_only_device(te, name):
  del te
  assert _device(name).platform == "gpu"
