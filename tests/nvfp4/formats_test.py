# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Format constants and the two saturating casts: exact tables, ties to even, saturation, signed zero."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from MaxText.nvfp4 import arithmetic, e2m1, formats
from MaxText.nvfp4.gemm import GemmRecipe
from tests.nvfp4 import reference
from tests.nvfp4.helpers import e2m1_test_inputs, every_bf16


def test_constants():
  assert formats.BLOCK_SIZE == 16 and formats.E2M1_MAX == 6 and formats.E4M3_MAX == 448
  assert formats.TENSOR_SCALE_RANGE == 2688
  assert np.float32(formats.ONE_SIXTH).view(np.uint32) == 0x3E2AAAAB
  assert float(jnp.asarray(formats.E2M1_MAGNITUDES).astype(formats.E2M1).astype(jnp.float32)[-1]) == 6.0


@pytest.mark.parametrize("element_dtype,scale_dtype,grid,scale_max", [
    (ml_dtypes.float6_e3m2fn, ml_dtypes.float8_e8m0fnu, [0, 0.0625, 0.125, 0.1875, 0.25, 28], 2.0**127),
    (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fn, [0, 2.0**-9, 2.0**-8, 3 * 2.0**-9, 2.0**-7, 448], 448),
])
def test_a_formats_element_grid_and_largest_scale_are_read_off_its_dtypes(element_dtype, scale_dtype, grid, scale_max):
  """Another block format is one entry: its element values (finite codes with the sign bit clear, ascending, a NaN
  code left out) and its largest scale come from the dtypes' bits, with nothing written for it."""
  fmt = formats.BlockFormat(name="toy", element_dtype=element_dtype, block_size=32, scale_dtype=scale_dtype,
                            scale_rule=formats.ScaleRule.RN_SATFINITE)
  magnitudes = np.array(fmt.element_magnitudes)
  np.testing.assert_array_equal(magnitudes[[0, 1, 2, 3, 4, -1]], grid)
  assert np.all(np.diff(magnitudes) > 0) and len(magnitudes) == {6: 32, 8: 127}[ml_dtypes.finfo(element_dtype).bits]
  assert fmt.element_max == grid[-1] and fmt.scale_max == np.float32(scale_max)
  assert fmt.tensor_scale_range == np.float32(grid[-1] * scale_max)


def test_the_nvfp4_object_agrees_with_its_dtypes():
  """The literals written once in NVFP4 are the storage dtypes' own facts (ml_dtypes), and its derived values are
  the float32 constants the kernels use."""
  fmt = formats.NVFP4
  codes = np.arange(8, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
  np.testing.assert_array_equal(np.array(fmt.element_magnitudes, np.float32), codes)
  assert fmt.element_max == jnp.finfo(fmt.element_dtype).max and fmt.scale_max == jnp.finfo(fmt.scale_dtype).max
  assert fmt.tensor_scale_range == np.float32(2688) and fmt.tensor_scale_range.dtype == np.float32
  assert fmt.scale_min_normal == np.float32(2.0**-6) and fmt.block_size == 16
  assert formats.E4M3_MAX == fmt.scale_max and formats.E4M3_MAX.dtype == np.float32 and formats.BLOCK_SIZE == fmt.block_size


def test_the_recipe_carries_the_format_and_refuses_one_the_quantizer_lacks():
  assert GemmRecipe().format is formats.NVFP4
  assert hash(GemmRecipe()) == hash(GemmRecipe(rht=True)) and GemmRecipe() == GemmRecipe(format=formats.NVFP4)
  with pytest.raises(NotImplementedError, match="nvfp4 only"):
    GemmRecipe(format=dataclasses.replace(formats.NVFP4, name="blocks_of_32", block_size=32))


def test_e2m1_values_decode_every_code_as_the_float4_dtype_does():
  codes = np.arange(16, dtype=np.uint8)
  want = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
  got = np.asarray(jax.jit(e2m1.e2m1_values)(codes))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # code 8 is -0
  np.testing.assert_array_equal(np.asarray(e2m1.e2m1_magnitudes(codes)), np.abs(want))


def test_e2m1_neighbours_bracket_the_input_on_the_grid():
  y = np.concatenate([np.linspace(-7, 7, 2801), np.arange(-14, 15) / 4, [1e-3, -1e-3]]).astype(np.float32)
  lower, upper, step = (np.asarray(a) for a in e2m1.e2m1_neighbours(jnp.asarray(y)))
  a = np.minimum(np.abs(y), 6)
  assert np.all(np.isin(lower, formats.E2M1_MAGNITUDES)) and np.all(np.isin(upper, formats.E2M1_MAGNITUDES))
  assert np.all((lower <= a) & (a <= upper)) and np.all((upper - lower == step) | (upper == lower))
  np.testing.assert_array_equal(lower == upper, np.isin(a, formats.E2M1_MAGNITUDES))
  # lower is the largest grid value not above |y|: rounding toward zero.
  want = formats.E2M1_MAGNITUDES[np.searchsorted(formats.E2M1_MAGNITUDES, a, side="right") - 1]
  np.testing.assert_array_equal(lower, want)


@pytest.mark.parametrize("value,want", [
    (0.0, 0.0), (0.24, 0.0), (0.25, 0.0), (0.26, 0.5), (0.5, 0.5), (0.75, 1.0), (1.0, 1.0), (1.25, 1.0),
    (1.5, 1.5), (1.75, 2.0), (2.0, 2.0), (2.5, 2.0), (3.0, 3.0), (3.5, 4.0), (4.0, 4.0), (5.0, 4.0),
    (5.01, 6.0), (6.0, 6.0), (6.5, 6.0), (1e30, 6.0), (np.inf, 6.0), (np.nan, 6.0),
])
def test_e2m1_rne_table(value, want):
  got = jax.jit(e2m1.round_to_e2m1_grid)(jnp.array([value, -value], jnp.float32)).astype(formats.E2M1).astype(jnp.float32)
  assert float(got[0]) == want
  if not np.isnan(value):
    assert float(got[1]) == -want and np.signbit(np.asarray(got)[1])  # symmetric; -0 keeps its sign


@pytest.mark.parametrize("value,want", [
    (0.0, 0.0), (2.0**-10, 0.0), (1.5 * 2.0**-10, 2.0**-9), (2.0**-9, 2.0**-9), (3 * 2.0**-9, 3 * 2.0**-9),
    (2.0**-6, 2.0**-6), (1.0625, 1.0), (1.1875, 1.25), (72.0, 72.0), (74.66667, 72.0), (76.0, 80.0),
    (440.0, 448.0), (464.0, 448.0), (465.0, 448.0), (1e30, 448.0), (np.finfo(np.float32).max, 448.0),
])
def test_e4m3_rne_saturating_table(value, want):
  got = jax.jit(formats.to_e4m3_satfinite)(jnp.array([value], jnp.float32))
  assert float(got.astype(jnp.float32)[0]) == want


def test_fmin_flt_max():
  got = np.asarray(arithmetic.fmin_flt_max(jnp.array([1.0, np.inf, np.nan], jnp.float32)))
  np.testing.assert_array_equal(got, [1.0, arithmetic.FLT_MAX, arithmetic.FLT_MAX])


def test_grid_rounding_equals_the_float4_cast():
  """round_to_e2m1_grid (on the bits) == the round-to-nearest-even float4 cast of the clamped value (ml_dtypes', on the
  host: XLA's GPU compiler drops a jitted cast-and-widen pair, so a jitted reference would round nothing there), and
  == the NumPy oracle's nearest E2M1 value (NaN -> +6), on `e2m1_test_inputs` (every bf16 pattern, the boundaries and
  their neighbours, uniform values with all 23 mantissa bits, random bit patterns)."""
  y = e2m1_test_inputs()
  grid = np.asarray(jax.jit(e2m1.round_to_e2m1_grid)(y))
  finite = ~np.isnan(y)
  cast = np.clip(y[finite], -6, 6).astype(formats.E2M1).astype(np.float32)
  np.testing.assert_array_equal(grid[finite].view(np.uint32), cast.view(np.uint32))
  np.testing.assert_array_equal(grid.view(np.uint32), reference.e2m1_rne(y).view(np.uint32))


def test_e2m1_codes_and_packing_equal_the_float4_cast():
  """e2m1_codes + pack_e2m1 (on the float's bits, bitcast) == round_to_e2m1_grid + XLA's float4 cast, bit for bit,
  on `e2m1_test_inputs` (red with the half-to-even bit of the normal range dropped, or NaN's sign kept)."""
  y = e2m1_test_inputs()
  fast = np.asarray(jax.jit(lambda y: e2m1.pack_e2m1(e2m1.e2m1_codes(y)))(y))
  cast = np.asarray(jax.jit(lambda y: e2m1.round_to_e2m1_grid(y).astype(formats.E2M1))(y))
  assert fast.dtype == cast.dtype == formats.E2M1 and fast.shape == y.shape
  bad = np.flatnonzero(fast.view(np.uint8) != cast.view(np.uint8))
  assert bad.size == 0, (bad.size, y[bad[:5]], fast.view(np.uint8)[bad[:5]], cast.view(np.uint8)[bad[:5]])
  unpacked = np.asarray(jax.jit(e2m1.e2m1_codes)(y))
  assert set(unpacked.tolist()) == set(range(16))


def test_pack_e2m1_keeps_element_order():
  codes = jnp.arange(16, dtype=jnp.uint8).reshape(2, 8)
  got = np.asarray(e2m1.pack_e2m1(codes)).view(np.uint8).reshape(2, 8)
  np.testing.assert_array_equal(got, np.arange(16).reshape(2, 8))


def _neighbourhood(dtype: np.dtype, top: float) -> np.ndarray:
  """Every finite non-negative value of `dtype` up to `top`, the midpoints between them (the ties) and the float32
  values just either side of each: where a rounding can go wrong; with their negatives."""
  values = np.arange(2 ** (8 * dtype.itemsize), dtype=f"u{dtype.itemsize}").view(dtype).astype(np.float32)
  values = np.unique(np.abs(values[np.isfinite(values)]))
  values = values[values <= top]
  mids = (values[1:] + values[:-1]) / 2
  v = np.concatenate([values, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf), np.nextafter(values, 0),
                      np.nextafter(values, np.inf)])
  v = v[v <= top]
  return np.concatenate([v, -v]).astype(np.float32)


@pytest.mark.parametrize("dtype,top", [(ml_dtypes.float8_e4m3fn, 448.0), (ml_dtypes.bfloat16, float(arithmetic.FLT_MAX)),
                                       (np.float16, 65504.0)], ids=["e4m3", "bf16", "f16"])
def test_round_to_equals_the_cast(dtype, top):
  """round_to(v, dtype) == v cast to dtype and back (ml_dtypes, on the host), ties and subnormals included: the
  explicit rounding that XLA's GPU compiler keeps where it drops a cast-and-widen pair (docs/numerics.md#on-a-gpu)."""
  dtype = np.dtype(dtype)
  v = _neighbourhood(dtype, top)
  got = np.asarray(jax.jit(lambda v: arithmetic.round_to(v, dtype))(v))
  np.testing.assert_array_equal(got.view(np.uint32), v.astype(dtype).astype(np.float32).view(np.uint32))


def test_copysign_on_the_bits_equals_jnp_copysign():
  """arithmetic.copysign == jnp.copysign bit for bit, magnitude and sign each from every bf16 pattern's f32 value
  (both zeros, subnormals, infinities and NaNs of either sign) and a few f32 subnormals and NaN payloads."""
  extra = np.array([0x00000001, 0x807FFFFF, 0x7FC00001, 0xFFA00000], np.uint32).view(np.float32)
  values = np.concatenate([every_bf16(), extra])
  rng = np.random.default_rng(0)
  magnitude, sign = values, rng.permutation(values)
  got = np.asarray(jax.jit(arithmetic.copysign)(magnitude, sign)).view(np.uint32)
  want = np.asarray(jax.jit(jnp.copysign)(magnitude, sign)).view(np.uint32)
  np.testing.assert_array_equal(got, want)
