# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Stochastic rounding onto the E2M1 grid, with TE's software rule (docs/numerics.md#stochastic-rounding).

TE draws its random bits from Philox per CUDA thread, so no emulation can reproduce TE's rounded values
bit for bit; what we reproduce is the rule and so its distribution: each value goes to one of its two
neighbouring E2M1 values, upwards with probability (distance to the lower neighbour) / (grid step), up to
the 1/256 resolution of 8 random bits. That makes the rounding unbiased, which is why gradients use it.
"""

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.nvfp4.arithmetic import anchored
from MaxText.nvfp4.e2m1 import E2M1_DROPPED_BITS, e2m1_clamped_bits, e2m1_grid_step, e2m1_result

#: Random bits per element: TE consumes 8 (a uniform in {0, 1/256, ..., 255/256}).
RANDOM_BITS = 8
_F32_MANTISSA_BITS = np.finfo(np.float32).nmant
_ONE_BITS = np.float32(1.0).view(np.uint32)
_QUARTER_EXPONENT = np.uint32(np.float32(0.25).view(np.uint32) >> _F32_MANTISSA_BITS)


def _mix32(h: jax.Array) -> jax.Array:
  """lowbias32 (C. Wellons' integer hash): a bijection on uint32 with strong avalanche."""
  h = h ^ (h >> 16)
  h = h * np.uint32(0x7FEB352D)
  h = h ^ (h >> 15)
  h = h * np.uint32(0x846CA68B)
  return h ^ (h >> 16)


def random_bits(key: jax.Array, shape: tuple[int, ...], axis_order: tuple[int, ...] | None = None) -> jax.Array:
  """Eight random bits per element (uint8): a keyed counter-based hash of the element's flat index.

  Why not jax.random.bits for every element: on CPU, threefry (and XLA's RngBitGenerator) cost 5-10x a
  full quantize pass, so stochastic rounding would dominate every backward GEMM of the emulation. Here
  jax.random draws only two 32-bit seed words from `key`; each element's bits are then
  mix32(mix32(index ^ seed0) + seed1) >> 24, which XLA fuses into the rounding loop. The result is a
  deterministic function of (key, shape) and does not depend on how the tensor is sharded (the index is
  the global one). Indices wrap at 2**32 elements, far above any tensor this quantizes in one call.

  `axis_order` gives the bits of `jnp.transpose(x, axis_order)` in x's own layout:
  random_bits(key, x.shape, (1, 0)) == random_bits(key, x.T.shape).T, so a matrix quantized along axis 0 in place
  draws exactly the bits of its transpose quantized along the last axis. None: the identity order.
  """
  seed = jax.random.bits(key, (2,), jnp.uint32)
  # Each axis's index is a 1D iota plus a 0 anchored to the seed, then broadcast: the same index, but data to JAX
  # (arithmetic.anchored: a full-size iota is computed outside a scanned layer loop and read by every layer).
  zero = anchored(np.uint32(0), seed)
  index = jnp.broadcast_to(zero, shape)
  stride = 1
  for axis in reversed(axis_order if axis_order is not None else range(len(shape))):
    along = (jax.lax.iota(jnp.uint32, shape[axis]) + zero) * np.uint32(stride % (1 << 32))
    index = index + jax.lax.broadcast_in_dim(along, shape, (axis,))
    stride *= shape[axis]
  return (_mix32(_mix32(index ^ seed[0]) + seed[1]) >> 24).astype(jnp.uint8)


def _fraction(bits: jax.Array) -> jax.Array:
  """r / 256 for each element's 8 random bits r, float32, exact: 1 + r / 256 assembled on the bits, less 1. Not
  `bits.astype(float32)`: a GPU converts integers to floats at a fraction of its float32 rate (e2m1.e2m1_result)."""
  one_and = (bits.astype(jnp.uint32) << (_F32_MANTISSA_BITS - RANDOM_BITS)) | _ONE_BITS
  return jax.lax.bitcast_convert_type(one_and, jnp.float32) - np.float32(1.0)


def _stochastic(y: jax.Array, bits: jax.Array, as_codes: bool) -> jax.Array:
  magnitude, sign = e2m1_clamped_bits(y)
  a = jax.lax.bitcast_convert_type(magnitude, jnp.float32)
  # The rule's own float32 sum; (r / 256) * step is exact. The random bits enter once, through it: read in two places,
  # XLA:GPU's cost model charges the hash twice and writes the bits out in a kernel of their own.
  t = a + _fraction(bits) * e2m1_grid_step(a)
  t_bits = jax.lax.bitcast_convert_type(t, jnp.uint32)
  # Down to the grid at t. From 1 up the step is E2M1's one mantissa bit, so that is t's bits >> 22: a carry lands on
  # the next binade's first point, as the rule's floor does, and 6 plus less than a step stays 6. Below 1 (where t
  # stays below 1.5): floor(2 t) is 0 below 0.5, 1 in [0.5, 1), 2 from 1, so t's exponent field less 2**-2's, >= 0.
  kept = t_bits >> E2M1_DROPPED_BITS
  exponent = t_bits >> _F32_MANTISSA_BITS
  halves = jnp.maximum(exponent, _QUARTER_EXPONENT) - _QUARTER_EXPONENT
  return e2m1_result(magnitude, sign, kept, halves, as_codes)


def stochastic_round_to_grid(y: jax.Array, bits: jax.Array) -> jax.Array:
  """Rounds float32 `y` (already multiplied by its block's encode scale) to E2M1 stochastically.

  Rule, per element, with r the element's 8 random bits:
    a = |y|; t = a + (r / 256) * step(a); q = min(floor(t / step(t)) * step(t), 6); result = sign(y) * q.
  (step(a) in place of step(t) is equal on every input: a carry into the next binade only reaches its first point, 2
  or 4.) Computed on the bits (e2m1.e2m1_result), held to the rule in float32 by tests/nvfp4/reference.py.

  Args:
    y: float32 values on the E2M1 scale (magnitudes above 6 saturate to 6).
    bits: uint8 array of y's shape.

  Returns:
    float32 array of y's shape holding E2M1 values. NaN becomes +6, as in the nearest-even path.
  """
  return _stochastic(y, bits, as_codes=False)


def stochastic_e2m1_codes(y: jax.Array, bits: jax.Array) -> jax.Array:
  """`stochastic_round_to_grid(y, bits)`'s E2M1 bit patterns (uint8, low nibble), bit for bit, without making the
  rounded value: what the fused backend's GEMM operands store."""
  return _stochastic(y, bits, as_codes=True)
