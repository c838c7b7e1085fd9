# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The self-check's test tensors: bf16 operands of a GEMM's shape with the distributions that stress a quantizer.

Why these: a quantizer bug shows where the arithmetic is at an edge (docs/numerics.md): outliers (one value sets the
tensor scale, most blocks get small scales), tiny blocks (block scales near E4M3's smallest, in its subnormal range),
all-zero blocks and rows (scale 0, S_enc's zero-amax rule), and a plain normal tensor. Deterministic per seed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from MaxText.nvfp4.formats import BLOCK_SIZE

__all__ = ["DISTRIBUTIONS", "tensor"]

DISTRIBUTIONS = ("normal", "outliers", "tiny_blocks", "zeros")


def tensor(shape: tuple[int, int], distribution: str, seed: int) -> jax.Array:
  """A bf16 (rows, cols) tensor of `distribution` (DISTRIBUTIONS); cols and rows multiples of 16."""
  k_values, k_where, k_scale = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(k_values, shape, jnp.float32)
  blocks = (shape[0], shape[1] // BLOCK_SIZE, 1)
  if distribution == "outliers":  # 0.1% of the elements 1e3 larger: the tensor scale follows them
    x = jnp.where(jax.random.uniform(k_where, shape) < 1e-3, x * 1e3, x)
  elif distribution == "tiny_blocks":  # 30% of the blocks 1e-6 smaller: scales in E4M3's subnormal range or 0
    tiny = jax.random.uniform(k_where, blocks) < 0.3
    x = (x.reshape(*blocks[:2], BLOCK_SIZE) * jnp.where(tiny, 10.0 ** jax.random.uniform(k_scale, blocks, minval=-8,
                                                                                               maxval=-5), 1.0))
    x = x.reshape(shape)
  elif distribution == "zeros":  # 20% of the blocks and every 7th row all zero
    zero = jax.random.uniform(k_where, blocks) < 0.2
    x = jnp.where(zero, 0.0, x.reshape(*blocks[:2], BLOCK_SIZE)).reshape(shape)
    x = x.at[::7].set(0.0)
  elif distribution != "normal":
    raise ValueError(f"unknown distribution {distribution!r}; one of {', '.join(DISTRIBUTIONS)}")
  return x.astype(jnp.bfloat16)
