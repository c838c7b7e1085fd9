# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The GEMM check's float32-accumulation bound holds for the emulated GEMM and the fused backend's block-scaled GEMM,
and catches a GEMM off by a fraction of a percent; stochastic rounding's moments are TE's rule with 8 random bits."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from MaxText.nvfp4 import audit
from MaxText.nvfp4.gemm import GemmRecipe, scaled_matmul_gemm
from MaxText.selfcheck import checks
from MaxText.selfcheck.candidates import Emulator, Fused

_SHAPES = [checks.Shape(64, 32, 48, ("mlp/wi_0",))]


@dataclasses.dataclass(frozen=True)
class _Off(Emulator):
  """The emulated GEMMs with every output 0.4% too large."""

  def gemms(self, x, w, dy, recipe):
    return tuple((o.astype(jnp.float32) * 1.004).astype(o.dtype) for o in super().gemms(x, w, dy, recipe))


def test_the_bound_holds_for_the_emulated_gemms_and_catches_a_wrong_one():
  good = checks.gemms(Emulator(), _SHAPES, GemmRecipe())
  assert [r.ok for r in good] == [True] * 3 and all(r.values["worst_error_over_bound"] < 1 for r in good)
  bad = checks.gemms(_Off(), _SHAPES, GemmRecipe())
  assert [r.ok for r in bad] == [False] * 3 and "float64 reference" in bad[0].detail


def test_the_fused_backends_gemm_holds_and_a_wrong_block_scaled_gemm_is_caught():
  """The fused candidate's GEMMs are the block-scaled GEMM it is given (scaled_matmul here; TE's on Blackwell): the
  check passes it, and fails one whose products are 0.4% too large, in every GEMM, naming the GEMM."""

  def off(a, a_axis, b, b_axis, out_dtype):
    return (scaled_matmul_gemm(a, a_axis, b, b_axis, jnp.float32) * 1.004).astype(out_dtype)

  good = checks.gemms(Fused(scaled_matmul_gemm, "jax.nn.scaled_matmul"), _SHAPES, GemmRecipe())
  assert [r.ok for r in good] == [True] * 3
  bad = checks.gemms(Fused(off, "off"), _SHAPES, GemmRecipe())
  assert [r.ok for r in bad] == [False] * 3 and [r.subject.split()[0] for r in bad] == ["fprop", "dgrad", "wgrad"]


def test_stochastic_rounding_moments_are_tes_rule():
  """1.3 on the grid of step 0.5 between 1.0 and 1.5: up with probability floor(256 * 0.6) / 256 = 153/256."""
  mean, var = (np.asarray(a) for a in audit.sr_moments(jnp.asarray([1.3, -1.3, 1.5, 7.0], jnp.float32)))
  p = 153 / 256
  np.testing.assert_allclose(mean, [1.0 + 0.5 * p, -(1.0 + 0.5 * p), 1.5, 6.0], rtol=1e-6)
  np.testing.assert_allclose(var, [0.25 * p * (1 - p), 0.25 * p * (1 - p), 0.0, 0.0], rtol=1e-6)


def test_speed_rows_give_tflops_and_ratios():
  (row,) = checks.speed({"nvfp4": lambda x, w: x @ w, "bf16": lambda x, w: x @ w}, _SHAPES, repeats=1)
  assert set(row.values["tflops"]) == {"nvfp4", "bf16"} and "nvfp4 / bf16" in row.detail
