# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What the audit holds another quantizer's operands to: a stochastically rounded code must be one of the two E2M1
neighbours of its scaled input, with its sign; and a tensor amax taken per shard is honest when it is at most the
whole tensor's, where codes and scales are checked against ours quantized with that amax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.nvfp4 import audit, operands
from MaxText.nvfp4.formats import e2m1_codes
from MaxText.nvfp4.gemm import GemmRecipe

_OPERANDS = {o.name: o for o in operands.gemm_operands(GemmRecipe())}


def _codes(values: list[float]) -> jax.Array:
  return e2m1_codes(jnp.asarray(values, jnp.float32))


@pytest.mark.parametrize(("scaled", "code", "neighbour"), [
    (2.3, 2.0, True), (2.3, 3.0, True),  # the two neighbours
    (2.3, 4.0, False), (2.3, 1.5, False), (2.3, 6.0, False),  # the right sign, another grid value
    (2.3, -2.0, False), (-2.3, -3.0, True), (-2.3, 3.0, False),  # the sign must be the input's
    (0.2, 0.0, True), (0.2, 0.5, True), (0.2, 1.0, False),  # below the smallest subnormal step
    (3.0, 3.0, True), (3.0, 4.0, False),  # on the grid: only itself
    (7.5, 6.0, True), (7.5, 4.0, False),  # beyond the largest value: 6
])
def test_a_code_is_accepted_only_as_a_neighbour_of_its_scaled_input(scaled, code, neighbour):
  assert bool(audit.neighbours(_codes([code]), jnp.asarray([scaled], jnp.float32))[0]) is neighbour


#: The audit's two functions compiled once per operand (op by op, each of their operations compiles on its own).
_encode = jax.jit(audit.encode, static_argnums=1)
_audited = jax.jit(audit.audited, static_argnums=1)


def _x(seed: int = 0) -> jax.Array:
  """A 64 x 32 bf16 tensor whose second half of rows is twice as large: its first half's amax is below the whole's."""
  x = jax.random.normal(jax.random.key(seed), (64, 32), jnp.float32)
  return (x * jnp.where(jnp.arange(64)[:, None] < 32, 1.0, 2.0)).astype(jnp.bfloat16)


@pytest.mark.parametrize("name", ["fprop_x", "wgrad_x", "dgrad_dy"])
def test_an_honest_shard_amax_passes_and_an_amax_above_the_whole_is_flagged(name):
  """The audit's amax rule on one device: a shard's amax (first half of the rows, its codes and scales quantized with
  it) is no mismatch; an amax one ulp above the whole tensor's is one, and only the amax column counts it."""
  operand = _OPERANDS[name]
  x = _x()
  shard = _encode(x[:32], operand).amax
  whole = _encode(x, operand).amax
  assert float(shard) < float(whole)
  honest = _encode(x, operand, amax=shard)
  assert _audited(x, operand, honest.codes, honest.scales, shard).tolist() == [0.0, 0.0, 0.0]
  above = jnp.nextafter(whole, jnp.float32(jnp.inf))
  dishonest = _encode(x, operand, amax=above)
  assert _audited(x, operand, dishonest.codes, dishonest.scales, above).tolist() == [0.0, 0.0, 1.0]


def test_a_non_finite_amax_is_flagged_where_ours_is_finite():
  operand = _OPERANDS["fprop_x"]
  x = _x(1)
  ours = _encode(x, operand)
  counts = _audited(x, operand, ours.codes, ours.scales, jnp.float32(np.nan))
  assert float(counts[2]) == 1.0
