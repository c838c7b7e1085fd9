# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What the numerics' tests share (jax): the dequantizing reference of a GEMM operand, compiled, and the inputs the E2M1
codings are held to their float4 cast on. The plain-NumPy oracle of TE's quantizer is tests/nvfp4/reference.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.nvfp4 import dequantize, quantize

__all__ = ["dequantized", "e2m1_test_inputs", "every_bf16"]


@functools.partial(jax.jit, static_argnames=("scaling", "rht", "stochastic_rounding"))
def dequantized(x, scaling="1d", rht=False, stochastic_rounding=False, key=None):
  """quantize then dequantize: the values a GEMM on NVFP4 operands multiplies (in float32), compiled once per shape
  and switches (op by op, each of the quantizer's hundred or so operations would compile a program of its own)."""
  return dequantize(quantize(x, scaling=scaling, rht=rht, stochastic_rounding=stochastic_rounding, key=key))


def every_bf16() -> np.ndarray:
  """The float32 value of every bfloat16 bit pattern: both zeros, subnormals, infinities and NaNs of either sign."""
  return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(jnp.bfloat16).astype(np.float32)


def e2m1_test_inputs() -> np.ndarray:
  """float32 inputs for the E2M1 codings: every bfloat16 bit pattern (NaNs, infinities, subnormals, both zeros), each
  rounding boundary with its two neighbouring floats, uniform values over the grid's range with all 23 mantissa bits,
  and random bit patterns (every exponent). Even in length, for pack_e2m1."""
  bounds = np.array([0.25, 0.75, 1.0, 1.25, 1.75, 2.0, 2.5, 3.5, 4.0, 5.0, 6.0], np.float32)
  near = np.concatenate([bounds, np.nextafter(bounds, np.float32(0)), np.nextafter(bounds, np.float32(7))])
  rng = np.random.default_rng(0)
  uniform = rng.uniform(-8, 8, 200_000).astype(np.float32)
  patterns = rng.integers(0, 1 << 32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
  y = np.concatenate([every_bf16(), near, -near, uniform, patterns, [-np.nan, 1e-45, -1e-45]]).astype(np.float32)
  return y[: y.size // 2 * 2]
