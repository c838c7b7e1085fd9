# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The stochastic-rounding key of a GEMM call (sr.sr_key): different at every step and in every layer.

Why it matters: with one key at every step, the output gradients of a GEMM would round the same way each step (for
the same values), a systematic bias, exactly what stochastic rounding exists to avoid. maxtext hands the train step
the same rng every step, so the per-GEMM call counter folded into the key is what makes steps differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.backends.emulated import Nvfp4DotGeneral
from MaxText.backends.sr import SR_COUNT_NAME
from MaxText.nvfp4.gemm import MATMUL_DIMS
from tests.helpers import REPO_ROOT, TINY_YML, settings


def test_the_same_gemm_rounds_differently_at_the_next_step():
  """Two applies as two train steps: the same rng (as maxtext passes it), the counter carried in "aqt" from one to
  the next, the same x, W and dY: dx and dW differ, while the forward (no rounding noise) is identical."""
  x = jax.random.normal(jax.random.key(0), (32, 64), jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (64, 48), jnp.float32)
  dy = jax.random.normal(jax.random.key(2), (32, 48), jnp.bfloat16)
  module = Nvfp4DotGeneral(settings=settings())
  variables = module.init({"params": jax.random.key(3), "dropout": jax.random.key(4)}, x, w, MATMUL_DIMS)

  @jax.jit  # one program for both steps, as maxtext's train step is
  def step(aqt):
    def fwd(a, b):
      return module.apply({"aqt": aqt}, a, b, MATMUL_DIMS, rngs={"dropout": jax.random.key(5)}, mutable=["aqt"])
    y, vjp, new_state = jax.vjp(fwd, x, w, has_aux=True)
    return y, vjp(dy), new_state["aqt"]

  y0, grads0, aqt1 = step(variables["aqt"])
  y1, grads1, _ = step(aqt1)
  assert int(aqt1[SR_COUNT_NAME]) == int(variables["aqt"][SR_COUNT_NAME]) + 1
  np.testing.assert_array_equal(y0, y1)
  assert not np.array_equal(grads0[0], grads1[0]) and not np.array_equal(grads0[1], grads1[1])


_SPY = """
import json, runpy, sys
import jax
from MaxText.backends import emulated, flags
original, out = emulated.nvfp4_dot_general, open(sys.argv[1], "w")

def record(key, step):
  out.write(json.dumps([int(step), [int(v) for v in key.ravel()]]) + "\\n"); out.flush()

def spy(lhs, rhs, dimension_numbers, *, key, **kwargs):
  if flags.current_step() is not None:  # in a train step (not the init)
    jax.debug.callback(record, jax.random.key_data(key), flags.current_step())
  return original(lhs, rhs, dimension_numbers, key=key, **kwargs)

emulated.nvfp4_dot_general = spy
sys.argv = ["MaxText.train", *sys.argv[2:]]
runpy.run_module("MaxText.train", run_name="__main__")
"""


@pytest.mark.slow
def test_keys_differ_between_steps_and_between_scanned_layers(tmp_path, jax_cache_dir):
  """maxtext's own trainer, 2 steps of the scanned 2-layer tiny model: every key each GEMM draws (wi_0, wi_1, wo in
  layers 0 and 1) is distinct within a step, and no key of step 0 comes back at step 1."""
  log = tmp_path / "keys.jsonl"
  proc = subprocess.run(
      [sys.executable, "-c", _SPY, str(log), str(TINY_YML), "run_name=sr", f"base_output_directory={tmp_path}",
       f"jax_cache_dir={jax_cache_dir}", "quantization=te_nvfp4", "nvfp4_backend=emulated", "steps=2"],
      cwd=REPO_ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
      timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  keys: dict[int, set[tuple[int, ...]]] = {}
  for line in log.read_text().splitlines():
    step, key = json.loads(line)
    keys.setdefault(step, set()).add(tuple(key))
  assert sorted(keys) == [0, 1], sorted(keys)
  assert all(len(k) >= 6 for k in keys.values()), {s: len(k) for s, k in keys.items()}  # 2 layers x 3 GEMMs
  assert not keys[0] & keys[1]
