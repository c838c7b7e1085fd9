# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What the numerics' tests share (jax): the dequantizing reference of a GEMM operand, compiled. The plain-NumPy oracle
of TE's quantizer is tests/nvfp4/reference.py."""

from __future__ import annotations

import functools

import jax

from MaxText.nvfp4 import dequantize, quantize

__all__ = ["dequantized"]


@functools.partial(jax.jit, static_argnames=("scaling", "rht", "stochastic_rounding"))
def dequantized(x, scaling="1d", rht=False, stochastic_rounding=False, key=None):
  """quantize then dequantize: the values a GEMM on NVFP4 operands multiplies (in float32), compiled once per shape
  and switches (op by op, each of the quantizer's hundred or so operations would compile a program of its own)."""
  return dequantize(quantize(x, scaling=scaling, rht=rht, stochastic_rounding=stochastic_rounding, key=key))
