# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""A NumPy oracle of TE's NVFP4 quantizer, line by line from docs/numerics.md (#quantize to #random-hadamard-transform).

Independent of MaxText.nvfp4 on purpose: E2M1 rounding is a nearest-value search over the 8 magnitudes
with ties to the even code (not a dtype cast), scales use ml_dtypes' e4m3fn cast after a saturating clamp,
the RHT is a dense 16x16 matrix product, and every step is IEEE float32 arithmetic in NumPy, which keeps
subnormals (XLA:CPU flushes them). The tests compare the JAX quantizer against this bit for bit.
"""

import ml_dtypes
import numpy as np
import scipy.linalg

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float64)
SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float64)


def fminf(a: np.ndarray, b: np.float32) -> np.ndarray:
  """CUDA fminf: the non-NaN operand wins."""
  return np.fmin(a, b)


def e2m1_rne(y: np.ndarray) -> np.ndarray:
  """Nearest E2M1 magnitude, ties to the even code (codes 0..7: even = 0, 1, 2, 3, 4, 6 values...)."""
  a = np.abs(y.astype(np.float64))
  a = np.where(np.isnan(a), 6.0, np.minimum(a, 6.0))
  dist = np.abs(a[..., None] - MAGNITUDES)
  best = dist.min(axis=-1, keepdims=True)
  ties = dist == best
  # Among equally near magnitudes take the one with the even code index.
  code = np.where(ties & (np.arange(8) % 2 == 0), np.arange(8), 99).min(axis=-1)
  code = np.where(code == 99, np.argmin(dist, axis=-1), code)
  mag = MAGNITUDES[code]
  sign = np.where(np.isnan(y), 1.0, np.where(np.signbit(y), -1.0, 1.0))
  return (sign * mag).astype(np.float32)


def e2m1_stochastic(y: np.ndarray, r: np.ndarray) -> np.ndarray:
  """TE's stochastic rounding rule (docs/numerics.md#stochastic-rounding) in float32, as its kernel computes it, with
  r the 8 random bits: a = |y|; t = a + (r / 256) * step(a); the largest E2M1 magnitude <= t (at most 6), y's sign;
  NaN -> +6."""
  with np.errstate(invalid="ignore"):
    a = np.abs(y.astype(np.float32))
    step = np.where(a >= 4, F32(2.0), np.where(a >= 2, F32(1.0), F32(0.5))).astype(np.float32)
    t = (a + (r.astype(np.float32) / F32(256.0)) * step).astype(np.float32)
    below = MAGNITUDES[np.searchsorted(MAGNITUDES, np.minimum(t, 6.0), side="right") - 1]
    return np.where(np.isnan(y), 6.0, np.copysign(below, y)).astype(np.float32)


def e4m3_sat(v: np.ndarray) -> np.ndarray:
  return np.minimum(v, F32(448.0)).astype(ml_dtypes.float8_e4m3fn)


def rht_bf16(x: np.ndarray) -> np.ndarray:
  r = (SIGNS[:, None] * scipy.linalg.hadamard(16)).astype(np.float32) / F32(4.0)
  runs = x.astype(np.float32).reshape(*x.shape[:-1], -1, 16)
  return (runs @ r).reshape(x.shape).astype(ml_dtypes.bfloat16)


def quantize(x: np.ndarray, scaling: str = "1d", rht: bool = False) -> tuple[np.ndarray, np.ndarray, np.float32]:
  """Returns (data as float32 E2M1 values, scales as float8_e4m3fn in the stored 1D layout, amax)."""
  if rht:
    x = rht_bf16(x)
  x = x.astype(np.float32)
  finite = np.where(np.isnan(x), F32(0), np.abs(x))
  amax = F32(finite.max()) if x.size else F32(0)
  with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
    s_enc = F32(2688.0) / amax
    s_enc = F32(min(s_enc, FLT_MAX))
    if amax == 0 or s_enc == 0:
      s_enc = F32(1.0)
    s_dec = F32(1.0) / s_enc
    mult = s_enc * F32(1.0 / 6.0)
    *lead, m, n = (1,) * (2 - x.ndim) + x.shape if x.ndim < 2 else x.shape
    x2 = x.reshape(-1, m, n)
    if scaling == "1d":
      blocks = x2.reshape(-1, m, n // 16, 16)
      bamax = np.max(np.abs(blocks), axis=-1, keepdims=True)
      bamax_rows = bamax
    else:
      tiles = x2.reshape(-1, m // 16, 16, n // 16, 16)
      bamax_t = np.max(np.abs(tiles), axis=(2, 4), keepdims=True)
      bamax_rows = np.broadcast_to(bamax_t, (x2.shape[0], m // 16, 16, n // 16, 1)).reshape(-1, m, n // 16, 1)
      blocks = x2.reshape(-1, m, n // 16, 16)
    sdec = fminf(bamax_rows * mult, FLT_MAX)
    s8 = e4m3_sat(sdec)
    enc = fminf(F32(1.0) / (s8.astype(np.float32) * s_dec), FLT_MAX)
    y = blocks * enc
  q = e2m1_rne(y)
  return q.reshape(x.shape), s8[..., 0].reshape(*x.shape[:-1], n // 16), amax


def statistics(x: np.ndarray, scaling: str = "1d", rht: bool = False) -> dict[str, float]:
  """The four statistics of MaxText.nvfp4.stats from this oracle's quantize (sums in float64): blocks along the last
  axis. Held against the plugin's by tests/nvfp4/stats_test.py and the statistics tap's by
  tests/backends/pipeline_test.py."""
  q, scales, amax = quantize(x, scaling, rht)
  xt = (rht_bf16(x) if rht else x).astype(np.float32).astype(np.float64)
  scale = scales.astype(np.float32).astype(np.float64)  # one per 16 elements (2D: a tile's scale on its 16 rows)
  # Dequantized as the format defines it, in float32: e2m1 * (f32(s8) * (amax / 2688)).
  step = scales.astype(np.float32) * (amax / np.float32(2688.0))
  deq = (q.astype(np.float32).reshape(*q.shape[:-1], -1, 16) * step[..., None]).reshape(q.shape).astype(np.float64)
  norm = np.sum(xt**2)
  blocks = np.abs(xt).reshape(*xt.shape[:-1], -1, 16)
  if scaling == "2d":  # a tile's amax, repeated on each of its 16 rows as the scales are
    m, nb = blocks.shape[-3], blocks.shape[-2]
    tiles = blocks.reshape(*blocks.shape[:-3], m // 16, 16, nb, 16).max(axis=(-3, -1), keepdims=True)
    bamax = np.broadcast_to(tiles, (*tiles.shape[:-4], m // 16, 16, nb, 1)).reshape(*blocks.shape[:-1])
  else:
    bamax = blocks.max(axis=-1)
  nonzero, live = xt != 0, bamax > 0
  return {
      "amax": float(amax),
      "underflow": float(np.sum(nonzero & (q == 0)) / max(np.sum(nonzero), 1)),
      "rel_error": float(np.sqrt(np.sum((deq - xt) ** 2) / norm)) if norm > 0 else 0.0,
      "subnormal_scales": float(np.sum(live & (scale < 2.0**-6)) / max(np.sum(live), 1)),
  }
