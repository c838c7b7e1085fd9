# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""quantization_stats against the plain-NumPy oracle of TE's quantizer (tests/nvfp4/reference.py)."""

import hypothesis
import hypothesis.extra.numpy as hnp
import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import strategies as st

from MaxText.nvfp4 import quantization_stats
from MaxText.nvfp4.stats import STAT_NAMES, WGRAD_STAT_NAMES, weight_gradient_stats
from tests.helpers import examples
from tests.nvfp4 import reference


def _ours(x: np.ndarray, **kwargs) -> dict[str, float]:
  stats = jax.jit(lambda a: quantization_stats(a, **kwargs))(x)
  assert set(stats) == set(STAT_NAMES) and all(v.dtype == np.float32 and v.shape == () for v in stats.values())
  return {k: float(v) for k, v in stats.items()}


def _assert_matches(x: np.ndarray, scaling: str = "1d", rht: bool = False) -> dict[str, float]:
  got, want = _ours(x, scaling=scaling, rht=rht), reference.statistics(x, scaling, rht)
  assert got["amax"] == want["amax"]
  assert got["underflow"] == pytest.approx(want["underflow"], rel=1e-6, abs=0)
  assert got["subnormal_scales"] == pytest.approx(want["subnormal_scales"], rel=1e-6, abs=0)
  # abs 1e-6: XLA:CPU may fuse dequantize-minus-x into one FMA (no rounding of the dequantized value), NumPy rounds
  # it to float32 first; the two differ by up to float32's epsilon, far below any error NVFP4 makes. rel 1e-4: ours
  # sums the squares in float32, the oracle in float64; hypothesis found blocks of 3e3 beside 1.0 that put the
  # float32 sums 2e-5 apart (relative). A statistic is read to 2-3 digits.
  assert got["rel_error"] == pytest.approx(want["rel_error"], rel=1e-4, abs=1e-6)
  return got


@hypothesis.settings(max_examples=examples(40), deadline=None)
@hypothesis.given(
    x=hnp.arrays(np.float32, st.tuples(st.sampled_from([16, 32]), st.sampled_from([16, 48])),
                 elements=st.floats(-1e4, 1e4, width=32, allow_subnormal=False)),
    scaling=st.sampled_from(["1d", "2d"]),
    as_bf16=st.booleans(),
)
def test_matches_the_oracle_property(x, scaling, as_bf16):
  amax = np.abs(x).max()
  hypothesis.assume(amax == 0 or amax >= 1e-30)  # the quantizer's exact domain (quantize module docstring)
  _assert_matches(x.astype(ml_dtypes.bfloat16) if as_bf16 else x, scaling)


@pytest.mark.parametrize("scaling", ["1d", "2d"])
def test_matches_the_oracle_on_heavy_tailed_blocks(scaling):
  """Gaussian with rare large outliers: blocks next to an outlier flush small values; far blocks go subnormal."""
  rng = np.random.default_rng(0)
  x = (rng.standard_normal((64, 128)) * np.exp(rng.standard_normal((64, 128)))).astype(np.float32)
  x[3, 7] = 5e4
  x[32:48, :16] *= 1e-5  # a whole 16x16 tile ~10 orders below the tensor amax: its scales underflow
  got = _assert_matches(x.astype(ml_dtypes.bfloat16), scaling)
  assert got["underflow"] > 0.1 and got["subnormal_scales"] > 0 and got["rel_error"] > 0


def test_rht_statistics_describe_the_transformed_operand():
  rng = np.random.default_rng(1)
  x = rng.standard_normal((32, 64)).astype(ml_dtypes.bfloat16)
  got = _assert_matches(x, "1d", rht=True)
  plain = _ours(x)
  assert got["amax"] != plain["amax"] and got["rel_error"] != plain["rel_error"]


def test_axis_0_equals_the_transpose():
  """The wgrad operand x^T is x blocked along axis 0: the same statistics as x.T blocked along its last axis."""
  x = np.random.default_rng(2).standard_normal((48, 32)).astype(ml_dtypes.bfloat16)
  for rht in (False, True):
    got, want = _ours(x, axis=0, rht=rht), _ours(np.ascontiguousarray(x.T), rht=rht)
    assert got.pop("rel_error") == pytest.approx(want.pop("rel_error"), rel=1e-5)  # f32 sums in another order
    assert got == want


def test_special_cases():
  zeros = np.zeros((16, 32), np.float32)
  assert _ours(zeros) == {"amax": 0.0, "underflow": 0.0, "rel_error": 0.0, "subnormal_scales": 0.0}
  exact = np.tile(np.array([0.5, 1, 1.5, 2, 3, 4, 6, -6] * 2, np.float32), (16, 2))  # on the grid: lossless
  assert _ours(exact)["rel_error"] < 1e-6 and _ours(exact)["underflow"] == 0.0
  flushed = np.full((16, 32), 1e-3, np.float32)
  flushed[0, 0] = 1e3  # its block scale is set by 1e3: 1e-3 is far below half its smallest step
  stats = _ours(flushed)
  assert stats["underflow"] == pytest.approx(15 / 512) and stats["amax"] == 1e3
  nan = np.ones((16, 32), np.float32)
  nan[2, 3] = np.nan
  assert np.isnan(_ours(nan)["rel_error"])  # never hidden, although the quantizer stores a finite value


def test_bad_input_is_refused_like_quantize():
  with pytest.raises(ValueError, match="multiple of 16"):
    quantization_stats(np.ones((16, 20), np.float32))
  with pytest.raises(TypeError, match="dtype int32"):
    quantization_stats(np.ones((16, 16), np.int32))


# A hand-built weight gradient, K = 4 rows by N = 4 output channels: column 0 holds three zeros (one of them -0.0),
# column 1 one zero and a NaN (not zero), column 2 is all zero, column 3 has none. 8 of 16 entries, 1 of 4 channels.
_DW = np.array([[0.0, 1.0, 0.0, 5.0],
                [-0.0, 2.0, 0.0, 6.0],
                [3.0, 0.0, 0.0, 7.0],
                [0.0, np.nan, 0.0, 8.0]], np.float32)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_weight_gradient_zero_shares_of_a_hand_built_gradient(dtype):
  got = np.asarray(jax.jit(weight_gradient_stats)(_DW.astype(dtype)))
  assert got.dtype == np.float32 and got.shape == (len(WGRAD_STAT_NAMES),)
  np.testing.assert_array_equal(got, [0.5, 0.25])


def test_weight_gradient_channels_are_the_axes_not_contracted():
  """The same gradient as W^T (channels along axis 0) and as a 3-D kernel (K, heads, head_dim), channels over the
  last two axes: the same shares. Contracting over the channels instead finds no whole-zero row."""
  transposed = jax.jit(lambda d: weight_gradient_stats(d, (1,)))(_DW.T.copy())
  np.testing.assert_array_equal(np.asarray(transposed), [0.5, 0.25])
  kernel = jax.jit(lambda d: weight_gradient_stats(d, (0,)))(_DW.reshape(4, 2, 2))
  np.testing.assert_array_equal(np.asarray(kernel), [0.5, 0.25])
  np.testing.assert_array_equal(np.asarray(weight_gradient_stats(_DW, (1,))), [0.5, 0.0])


def test_weight_gradient_of_zeros_and_of_no_zero():
  np.testing.assert_array_equal(np.asarray(weight_gradient_stats(np.zeros((16, 32), np.float32))), [1.0, 1.0])
  np.testing.assert_array_equal(np.asarray(weight_gradient_stats(np.full((16, 32), 1e-30, np.float32))), [0.0, 0.0])
