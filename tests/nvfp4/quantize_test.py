# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""quantize/dequantize: bit-exactness against the NumPy oracle, hand-computed cases, edge cases, errors."""

import re

import hypothesis
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import strategies as st

from MaxText.nvfp4 import Nvfp4Tensor, dequantize, quantize
from MaxText.nvfp4.block_scaled import quantize_block_scaled, quantize_codes
from tests.helpers import EXACT_RUN_BINADES, examples
from tests.nvfp4 import reference

#: The functions under test compiled once per shape and arguments, for the tests that check values rather than eager
#: dispatch, the bit-exact ones among them (op by op, each of the quantizer's hundred or so operations compiles a
#: program of its own). The plain functions still run eagerly where that is the point: test_pytree_jit_and_vmap, the
#: NaN/Inf test's second half and test_errors.
_quantize = jax.jit(quantize, static_argnames=("scaling", "rht", "stochastic_rounding"))
_dequantize = jax.jit(dequantize)
_block_scaled = jax.jit(quantize_block_scaled, static_argnames=("scaling", "rht", "stochastic_rounding", "axis"))


def assert_bit_exact(x: np.ndarray, scaling: str = "1d", rht: bool = False) -> None:
  """data, scale and amax of the jitted JAX quantizer equal the oracle's bit for bit."""
  t = _quantize(jnp.asarray(x), scaling=scaling, rht=rht)
  want_q, want_s, want_amax = reference.quantize(np.asarray(x), scaling, rht)
  got_q = np.asarray(t.data).astype(np.float32)
  bad = np.flatnonzero(got_q.view(np.uint32) != want_q.view(np.uint32))
  assert bad.size == 0, (
      f"{bad.size} data mismatches ({scaling}, rht={rht}), first at flat {bad[0]}: "
      f"got {got_q.flat[bad[0]]}, want {want_q.flat[bad[0]]}"
  )
  got_s = np.asarray(t.scale).view(np.uint8)
  bad = np.flatnonzero(got_s != want_s.view(np.uint8))
  assert bad.size == 0, (
      f"{bad.size} scale mismatches, first at flat {bad[0]}: got {np.asarray(t.scale).flat[bad[0]]}, "
      f"want {want_s.flat[bad[0]]}"
  )
  assert np.asarray(t.amax).view(np.uint32) == np.float32(want_amax).view(np.uint32), (t.amax, want_amax)


# ----------------------------------------------------------------------------- hand-computed cases


def test_hand_computed_block():
  """amax 6: S_enc = 448, mult = 448 * f32(1/6) = 74.66667; block amax 6 -> sdec 448 -> s8 448, enc = 1."""
  x = np.array([6.0, -3.0, 2.5, 1.25, 0.75, 0.25, -0.1, 5.0, 0, 0, 0, 0, 0, 0, 0, 0.5], np.float32)
  t = _quantize(x)
  np.testing.assert_array_equal(
      np.asarray(t.data).astype(np.float32),
      np.array([6, -3, 2, 1, 1, 0, -0.0, 4, 0, 0, 0, 0, 0, 0, 0, 0.5], np.float32),
  )
  assert float(t.scale[0]) == 448.0 and float(t.amax) == 6.0
  assert np.signbit(np.asarray(t.data).astype(np.float32)[6])  # -0.1 -> -0, as the kernels keep the sign


def test_hand_computed_two_blocks_scale_rounding():
  """Second block amax 1: sdec = 1 * 74.66667 rounds (e4m3 RNE) to 72; enc = 1 / (72 / 448) = 6.2222223."""
  x = np.zeros(32, np.float32)
  x[0], x[16], x[17] = 6.0, 1.0, 0.2
  t = _quantize(x)
  assert float(t.scale[1]) == 72.0
  # 1.0 * 6.2222223 = 6.22 saturates to 6; 0.2 * 6.2222223 = 1.244 -> 1.0 (nearest)
  assert float(t.data[16]) == 6.0 and float(t.data[17]) == 1.0
  np.testing.assert_allclose(np.asarray(_dequantize(t))[16:18], [6 * 72 * 6 / 2688, 72 * 6 / 2688], rtol=1e-6)


def test_one_sixth_constant_order_matters():
  """Blocks where (bamax / 6) * S_enc and bamax * (S_enc * f32(1/6)) round to different e4m3 scales."""
  rng = np.random.default_rng(0)  # bf16-valued amaxes: short mantissas make e4m3 ties reachable (~0.1%)
  amax = rng.uniform(1, 100, 200_000).astype(ml_dtypes.bfloat16).astype(np.float32)
  bamax = (rng.uniform(0.01, 1, amax.size) * amax).astype(ml_dtypes.bfloat16).astype(np.float32)
  s_enc = np.float32(2688) / amax
  wrong = reference.e4m3_sat((bamax / np.float32(6)) * s_enc).view(np.uint8)
  right = reference.e4m3_sat(bamax * (s_enc * np.float32(1 / 6))).view(np.uint8)
  differ = np.flatnonzero(wrong != right)
  assert differ.size > 20, differ.size
  rows = np.zeros((differ.size, 32), np.float32)
  rows[:, 0], rows[:, 16] = amax[differ], bamax[differ]
  got = np.asarray(jax.jit(jax.vmap(quantize))(rows).scale).view(np.uint8)[:, 1]  # one tensor (global amax) per row
  np.testing.assert_array_equal(got, right[differ])


# ----------------------------------------------------------------------------- bit-exact vs oracle

_DISTRIBUTIONS = {
    "normal": lambda rng, shape: rng.standard_normal(shape),
    "heavy_tailed": lambda rng, shape: rng.standard_t(1.5, shape) * 10,
    "cauchy_outliers": lambda rng, shape: rng.standard_cauchy(shape),
    "lognormal_wide": lambda rng, shape: rng.lognormal(0, 6, shape) * rng.choice([-1, 1], shape),
    "mixed_block_scales": lambda rng, shape: rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 4, (shape[0], 1)),
}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("dist", sorted(_DISTRIBUTIONS))
@pytest.mark.parametrize("scaling,rht", [("1d", False), ("2d", False), ("1d", True)])
def test_bit_exact_distributions(dtype, dist, scaling, rht):
  rng = np.random.default_rng(hash((dist, scaling, rht)) % 2**32)
  x = _DISTRIBUTIONS[dist](rng, (64, 128)).astype(np.float32).astype(dtype)
  if rht:
    x = x.astype(jnp.bfloat16)  # TE's RHT kernel takes bf16
  assert_bit_exact(x, scaling, rht)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("scaling", ["1d", "2d"])
def test_bit_exact_edge_cases(dtype, scaling):
  rng = np.random.default_rng(1)
  x = rng.standard_normal((48, 64)).astype(np.float32)
  x[0:16, 0:16] = 0.0  # a zero block / tile
  x[16, :16] = 1e-9  # blocks whose scale underflows to 0 next to a large amax
  x[17, 16:32] = 3e-6  # scales in e4m3's subnormal range
  x[18, 32:48] = np.linspace(-3e-5, 3e-5, 16)
  x[20, 0] = 4e5  # the global amax, far above the rest: many blocks saturate low
  x[21, :] = 4e5 * np.float32([0.75, 0.25, 1 / 12, 5 / 12] * 16)  # ties in e2m1 rounding
  assert_bit_exact(x.astype(dtype), scaling)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_bit_exact_all_zero(dtype):
  x = np.zeros((16, 32), np.float32).astype(dtype)
  assert_bit_exact(x)
  t = _quantize(jnp.asarray(x))
  assert float(t.amax) == 0.0 and not np.any(np.asarray(t.scale).astype(np.float32))
  np.testing.assert_array_equal(np.asarray(_dequantize(t)), 0.0)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_bit_exact_amax_near_dtype_max(dtype):
  big = float(jnp.finfo(dtype).max)
  x = np.random.default_rng(2).uniform(-1, 1, (32, 32)).astype(np.float32) * np.float32(big * 0.99)
  x[3, 5] = big
  x = np.asarray(jnp.asarray(x, dtype))
  assert_bit_exact(x, "1d")
  assert_bit_exact(x, "2d")


def test_bit_exact_subnormal_inputs():
  """f32 subnormal elements in a tensor of normal amax (>= 1e-30: see the quantize module docstring)."""
  rng = np.random.default_rng(3)
  x = (rng.standard_normal((32, 64)) * 1e-30).astype(np.float32)
  x[5, :16] = rng.standard_normal(16).astype(np.float32) * np.float32(1e-39)
  x[6, :16] = np.float32(1e-45)
  assert_bit_exact(x)
  assert_bit_exact(x.astype(ml_dtypes.bfloat16))


def _in_exact_domain(x: np.ndarray) -> bool:
  """The documented domain of bit-exactness: amax == 0 or amax >= 1e-30 (quantize module docstring)."""
  amax = np.abs(x.astype(np.float32)).max()
  return amax == 0 or amax >= 1e-30


@hypothesis.settings(max_examples=examples(60), deadline=None)
@hypothesis.given(
    x=hnp.arrays(
        np.float32,
        st.tuples(st.sampled_from([16, 32]), st.sampled_from([16, 48])),
        elements=st.floats(-1e6, 1e6, width=32, allow_subnormal=False),
    ),
    scaling=st.sampled_from(["1d", "2d"]),
    as_bf16=st.booleans(),
)
def test_bit_exact_property(x, scaling, as_bf16):
  hypothesis.assume(_in_exact_domain(x))
  assert_bit_exact(x.astype(ml_dtypes.bfloat16) if as_bf16 else x, scaling)


@hypothesis.settings(max_examples=examples(30), deadline=None)
@hypothesis.given(
    mantissas=hnp.arrays(np.int32, (16, 32), elements=st.integers(-255, 255)),
    binades=hnp.arrays(np.int32, (16, 32), elements=st.integers(0, EXACT_RUN_BINADES)),
    top=st.integers(-30, 13),
)
def test_bit_exact_rht_property(mantissas, binades, top):
  """Inputs whose RHT sums are exact in f32, in any order: every value m * 2^(top - 7 - d) with |m| < 256 and
  0 <= d <= EXACT_RUN_BINADES (12) lies on the grid 2^(top - 19) below 2^(top + 1), so a run's 16 terms (times
  +-1/4) and all their partial sums fit f32's 24 bits. Where a run's sums round, the last bit of the f32 sum depends
  on the order of accumulation, which no two implementations share (TE's MMA, XLA:CPU's dot library, NumPy's BLAS): a
  run of large terms that cancel beside tiny ones then leaves residues of either sign, 0 against -0 codes
  (docs/numerics.md#random-hadamard-transform).
  The bf16 rounding of the exact sums still rounds and ties. The transformed amax is 0 or at least 2^-51, inside the
  documented domain (_in_exact_domain) by construction, and no term is subnormal."""
  x = (mantissas * np.exp2(top - 7 - binades)).astype(np.float32)
  assert np.array_equal(x.astype(ml_dtypes.bfloat16).astype(np.float32), x)  # the grid is bf16's
  assert_bit_exact(x.astype(ml_dtypes.bfloat16), "1d", rht=True)


# ----------------------------------------------------------------------------- structure and invariants


@pytest.mark.parametrize("shape", [(16,), (3, 32), (2, 4, 48)])
def test_shapes_and_dtypes(shape):
  x = jnp.ones(shape, jnp.bfloat16)
  t = _quantize(x)
  assert t.data.shape == shape and t.data.dtype == jnp.float4_e2m1fn
  assert t.scale.shape == shape[:-1] + (shape[-1] // 16,) and t.scale.dtype == jnp.float8_e4m3fn
  assert t.amax.shape == () and t.amax.dtype == jnp.float32


def test_2d_scales_repeat_per_tile_and_transpose_sees_same_tiles():
  x = np.random.default_rng(4).standard_normal((64, 32)).astype(np.float32)
  x[0:16, 16:32] *= 100
  t = _quantize(x, "2d")
  s = np.asarray(t.scale).astype(np.float32)  # (64, 2)
  for r in range(0, 64, 16):
    assert np.all(s[r:r + 16] == s[r])  # each row of a tile group repeats the tile's scale
  tt = _quantize(x.T, "2d")
  np.testing.assert_array_equal(np.asarray(tt.data).astype(np.float32), np.asarray(t.data).astype(np.float32).T)
  np.testing.assert_array_equal(np.asarray(_dequantize(tt)), np.asarray(_dequantize(t)).T)


@pytest.mark.parametrize("scaling,rht", [("1d", False), ("2d", False), ("1d", True)])
def test_dequantize_close_to_input(scaling, rht):
  x = jax.random.normal(jax.random.key(0), (64, 256), jnp.float32)
  y = _dequantize(_quantize(x.astype(jnp.bfloat16), scaling, rht=rht))
  rel = float(jnp.linalg.norm(y - x) / jnp.linalg.norm(x))
  assert rel < 0.14, rel  # E2M1 with per-block scales: ~9-12% relative RMS error on Gaussian data


def test_rht_describes_transformed_tensor():
  x = jax.random.normal(jax.random.key(1), (16, 64), jnp.bfloat16)
  t = _quantize(x, rht=True)
  assert t.rht
  assert float(t.amax) == float(jnp.max(jnp.abs(reference.rht_bf16(np.asarray(x)).astype(np.float32))))


def test_pytree_jit_and_vmap():
  x = jax.random.normal(jax.random.key(2), (4, 16, 32), jnp.bfloat16)
  t = jax.jit(lambda x: quantize(x, "2d"))(x)
  assert isinstance(t, Nvfp4Tensor) and t.scaling.value == "2d"
  leaves, treedef = jax.tree_util.tree_flatten(t)
  assert len(leaves) == 3 and jax.tree_util.tree_unflatten(treedef, leaves).scaling == t.scaling
  per = jax.vmap(quantize)(x)  # per-slice amax
  assert per.amax.shape == (4,)
  for i in range(4):
    np.testing.assert_array_equal(np.asarray(per.data[i]).astype(np.float32),
                                  np.asarray(quantize(x[i]).data).astype(np.float32))


# ----------------------------------------------------------------------------- special values


def test_nan_and_inf_do_not_crash_and_follow_the_docstring():
  x = np.random.default_rng(5).standard_normal((2, 32)).astype(np.float32)
  x[0, 3] = np.nan
  t = jax.jit(quantize)(x)
  assert float(t.amax) == float(np.nanmax(np.abs(x)))  # NaN ignored by the global amax
  assert float(t.scale[0, 0]) == 448.0  # the NaN block gets the largest scale
  assert float(t.data[0, 3]) == 6.0  # the NaN element becomes +6
  assert_bit_exact(x)
  x[1, 20] = -np.inf
  t = quantize(x)
  assert np.isinf(float(t.amax)) and float(t.data[1, 20]) == -6.0 and float(t.scale[1, 1]) == 448.0
  assert not np.all(np.isfinite(np.asarray(dequantize(t))))


# ----------------------------------------------------------------------------- bad input


def test_errors():
  with pytest.raises(ValueError, match=r"shape \(4, 40\), axis 1 \(size 40\)"):
    quantize(jnp.ones((4, 40)))
  with pytest.raises(ValueError, match=r"shape \(40, 32\), axis 0 \(size 40\)"):
    quantize(jnp.ones((40, 32)), "2d")
  with pytest.raises(ValueError, match="rank >= 2"):
    quantize(jnp.ones((32,)), "2d")
  with pytest.raises(TypeError, match="dtype int32"):
    quantize(jnp.ones((4, 32), jnp.int32))
  with pytest.raises(ValueError, match="needs a PRNG key"):
    quantize(jnp.ones((4, 32)), stochastic_rounding=True)
  with pytest.raises(ValueError, match="'3d' is not a valid Scaling"):
    quantize(jnp.ones((4, 32)), "3d")


@pytest.mark.parametrize("kw", [dict(), dict(scaling="2d"), dict(rht=True),
                                dict(stochastic_rounding=True, key=jax.random.key(3))])
def test_block_scaled_equals_quantize(kw):
  """The GEMM's operand form is e2m1 * f32(scale) of exactly what quantize returns."""
  x = jax.random.normal(jax.random.key(0), (32, 64), jnp.bfloat16) * 3
  t = _quantize(x, **kw)
  values, amax = _block_scaled(x, **kw)
  want = (np.asarray(t.data).astype(np.float32).reshape(32, 4, 16)
          * np.asarray(t.scale).astype(np.float32)[..., None]).reshape(32, 64)
  assert values.dtype == jnp.bfloat16  # exact: e2m1 * e4m3 has at most 5 significant bits
  np.testing.assert_array_equal(np.asarray(values).astype(np.float32), want)
  assert float(amax) == float(t.amax)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("kw", [dict(), dict(rht=True), dict(stochastic_rounding=True, key=jax.random.key(3)),
                                dict(rht=True, stochastic_rounding=True, key=jax.random.key(4))],
                         ids=["rne", "rht", "sr", "rht_sr"])
def test_block_scaled_in_place_along_axis_0_equals_the_transpose(dtype, kw):
  """axis=0 (the wgrad operands x^T, dY^T, never transposed) == quantizing x.T, random bits included."""
  rng = np.random.default_rng(6)
  x = np.exp2(rng.uniform(-10, 12, (96, 48))) * rng.choice([-1, 1], (96, 48))  # sums that round in the RHT
  x[rng.integers(0, 96, 5), rng.integers(0, 48, 5)] *= 1e3
  x = jnp.asarray(x.astype(np.float32), dtype)
  got, got_amax = jax.jit(lambda x: quantize_block_scaled(x, axis=0, **kw))(x)
  want, want_amax = jax.jit(lambda x: quantize_block_scaled(x.T, **kw))(x)
  assert got.shape == x.shape and float(got_amax) == float(want_amax)
  np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).T.view(np.uint16))
  if "key" in kw:  # the bits follow the transpose's element order, not x's
    plain = _block_scaled(x, axis=0, **{**kw, "stochastic_rounding": False, "key": None})[0]
    assert not np.array_equal(np.asarray(got), np.asarray(plain))


@pytest.mark.parametrize("kw,big,block", [
    (dict(), (0, 1), np.s_[0, :16]), (dict(axis=0), (1, 0), np.s_[:16, 0]), (dict(scaling="2d"), (1, 1), np.s_[:16, :16]),
])
def test_the_gemm_operands_amax_leaves_out_blocks_holding_a_nan(kw, big, block):
  """quantize keeps TE's rule (the global amax ignores NaN elements); the GEMM operand forms, where every value of a
  block holding a NaN is NaN, leave such a block out whole, so its largest finite element does not set the tensor
  scale (one reduction then gives both block maxima: quantize.block_amax). The codes form (the fused backend's) agrees.
  Red with the operand forms' amax taken as quantize's."""
  from MaxText.nvfp4.block_scaled import quantize_codes  # pylint: disable=import-outside-toplevel  # this test's alone

  x = np.array(jax.random.normal(jax.random.key(1), (32, 64), jnp.float32))
  x[0, 0], x[big] = np.nan, 100.0  # in one block
  rest = np.abs(x)
  rest[block] = 0.0
  _, amax = _block_scaled(jnp.asarray(x), **kw)
  assert float(amax) == float(quantize_codes(jnp.asarray(x), **kw).amax) == float(rest.max())
  assert float(quantize(x, scaling=kw.get("scaling", "1d")).amax) == 100.0


@pytest.mark.parametrize("kw", [dict(), dict(axis=0), dict(scaling="2d")], ids=["1d", "axis0", "2d"])
@pytest.mark.parametrize("inf", [np.inf, -np.inf])
def test_an_infinity_is_the_gemm_operands_amax_not_a_nan_block_left_out(kw, inf):
  """The NaN-free block maximum leaves out NaN, never infinity: an operand holding +-inf has an infinite tensor amax
  in every form (TE's amax is max |x| ignoring NaN only), so its scales say so. Red when a block holding +inf is
  taken for a NaN block (the amax is then the largest finite element, 100 here)."""
  from MaxText.nvfp4.block_scaled import quantize_codes  # pylint: disable=import-outside-toplevel  # this test's alone

  x = np.array(jax.random.normal(jax.random.key(2), (32, 64), jnp.float32))
  x[3, 5], x[20, 40] = inf, 100.0
  _, amax = _block_scaled(jnp.asarray(x), **kw)
  assert np.isposinf(float(amax)), float(amax)
  assert np.isposinf(float(quantize_codes(jnp.asarray(x), **kw).amax))
  assert np.isposinf(float(quantize(x, scaling=kw.get("scaling", "1d")).amax))


@pytest.mark.parametrize("kw", [dict(), dict(scaling="2d"), dict(rht=True), dict(axis=0, rht=True),
                                dict(stochastic_rounding=True, key=jax.random.key(3))])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_block_scaled_makes_a_non_finite_block_nan(kw, bad):
  """The GEMM operand of a block holding NaN/Inf is NaN (quantize keeps TE's 448/+6); the rest is unchanged."""
  x = np.asarray(jax.random.normal(jax.random.key(0), (32, 64), jnp.float32)) * 3
  x[5, 20] = bad
  values, _ = _block_scaled(jnp.asarray(x, jnp.bfloat16), **kw)
  values = np.asarray(values).astype(np.float32)
  rows = slice(0, 16) if kw.get("scaling") == "2d" or kw.get("axis") == 0 else slice(5, 6)
  cols = slice(16, 32) if kw.get("axis") != 0 else slice(20, 21)
  assert np.all(np.isnan(values[rows, cols]))
  mask = np.ones(values.shape, bool)
  mask[rows, cols] = False
  assert np.all(np.isfinite(values[mask]))


@pytest.mark.parametrize("axis", [-1, 0])
def test_stochastic_rounding_decides_each_block_on_its_own(axis):
  """Blocks with identical inputs get different rounding decisions under one key (independent random bits per
  element, not per position in a block): 64 identical blocks of values halfway between grid points."""
  block = jnp.linspace(0.3, 5.7, 16, dtype=jnp.float32)  # amax 5.7 -> scale ~1: most values between grid points
  x = jnp.tile(block, (64, 1))  # (64, 16): 64 identical blocks along the last axis
  if axis == 0:
    x = x.T  # 64 identical blocks along axis 0
  values, _ = _block_scaled(x, "1d", stochastic_rounding=True, key=jax.random.key(3), axis=axis)
  blocks = np.asarray(values.astype(jnp.float32) if axis == -1 else values.T.astype(jnp.float32))
  distinct = {tuple(row) for row in blocks}
  assert len(distinct) > 32, f"{len(distinct)} distinct roundings of 64 identical blocks"


def test_on_the_cpu_per_block_work_and_the_codes_are_made_apart():
  """The emulation's speed on a CPU (`arithmetic.materialized_on_cpu`), read off the compiled programs. XLA:CPU would fuse
  the E4M3 block scale (a software conversion there) into `quantize_block_scaled`'s elementwise pass and make it once
  per element (8.4 against 3.0 ms for 2048^2), and `quantize_codes`' codes into the packing's strided reads, where the
  loop stops vectorizing (17 against 3 ms)."""
  x = jax.random.normal(jax.random.key(0), (64, 128), jnp.bfloat16)
  def compiled(quantizer):
    return jax.jit(lambda x: quantizer(x, "1d")).lower(x).compile().as_text()
  converting = [c for c in compiled(quantize_block_scaled).split("\n\n") if "f8e4m3fn[" in c and " convert(" in c]
  assert converting and not [c for c in converting if "[64,128]" in c or "[64,8,16]" in c], converting
  assert re.search(r"= u8\[64,128\]\S* fusion\(", compiled(quantize_codes))  # the codes written, then packed
