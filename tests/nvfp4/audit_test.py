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
from MaxText.nvfp4.e2m1 import e2m1_codes
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


# The RHT'd operands up to the order of the transform's float32 sums (audit.rht_interval, audit.order_aware).
_order_aware = jax.jit(audit.order_aware, static_argnums=(1, 5))


@pytest.fixture(scope="module")
def reordered() -> dict:
  """wgrad_x of the self-check's tiny_blocks tensor (1024 x 512), ours and the benign variant's (its RHT summed from
  the last product, MaxText.selfcheck.candidates.OrderVariant): the two differ where a 16-token run mixes blocks 1e-8
  to 1e-5 small with normal ones."""
  from MaxText.selfcheck import tensors  # pylint: disable=import-outside-toplevel  # this fixture's alone
  from MaxText.selfcheck.candidates import OrderVariant  # pylint: disable=import-outside-toplevel

  operand = _OPERANDS["wgrad_x"]
  x = tensors.tensor((1024, 512), "tiny_blocks", 3)
  theirs = tuple(np.asarray(a) for a in jax.jit(OrderVariant().quantize, static_argnums=1)(x, operand,
                                                                                           jax.random.key(0)))
  return {"x": x, "operand": operand, "theirs": theirs, "ours": jax.tree.map(np.asarray, _encode(x, operand))}


def test_another_summation_order_differs_bit_for_bit_and_every_difference_is_accepted(reordered):
  ours, (codes, scales, amax) = reordered["ours"], reordered["theirs"]
  strict = np.asarray(audit.compare(ours, codes, scales, amax, False))
  assert strict[0] > 0, strict  # the strict comparison fails a correct RHT
  counts = np.asarray(_order_aware(reordered["x"], reordered["operand"], codes, scales, amax, False).counts())
  assert counts[:3].tolist() == [0, 0, 0] and counts[3] == strict[0] and counts[4] == strict[1], counts
  assert np.asarray(_audited(reordered["x"], reordered["operand"], codes, scales, amax)).tolist() == [0, 0, 0]


def test_a_code_outside_every_orders_interval_still_fails(reordered):
  """One accepted element's code given the other sign, and the RHT with one of its signs flipped: mismatches."""
  ours, (codes, scales, amax) = reordered["ours"], reordered["theirs"]
  at = tuple(np.argwhere((codes != ours.codes) & ((codes & 7) >= 2))[0])  # a magnitude of 1.0 or more
  moved = codes.copy()
  moved[at] = codes[at] ^ 8  # bit 3: E2M1's sign
  counts = np.asarray(_order_aware(reordered["x"], reordered["operand"], moved, scales, amax, False).counts())
  assert counts[0] == 1, counts
  flipped = audit.encode(reordered["x"], reordered["operand"],
                         rht_signs=audit.hadamard.RHT_SIGNS * np.where(np.arange(16) == 5, -1, 1))
  counts = np.asarray(_order_aware(reordered["x"], reordered["operand"], flipped.codes, flipped.scales, flipped.amax,
                                   False).counts())
  assert counts[0] > 1000 and counts[1] > 0, counts


def test_every_order_gives_the_same_bf16_where_a_runs_sum_is_exact():
  """A run whose values span less than 2**12 sums exactly in float32 in any order: its interval is ours alone. On
  the normal tensor none of 512k RHT outputs is left ambiguous beyond the runs that reach below that span."""
  x = jnp.asarray(np.random.default_rng(0).uniform(1, 2**11, (64, 256)) * np.random.default_rng(1).choice([-1, 1],
                                                                                                          (64, 256)),
                  jnp.bfloat16)
  ours, low, high = jax.jit(audit.rht_interval)(x)
  assert np.array_equal(np.asarray(low), np.asarray(ours)) and np.array_equal(np.asarray(high), np.asarray(ours))
  tiny = x.at[:, ::16].multiply(2.0**-20)  # a value 2**20 smaller in every run: the sums may round
  _, low, high = jax.jit(audit.rht_interval)(tiny)
  assert np.any(np.asarray(low) != np.asarray(high))


def _exact_runs() -> jax.Array:
  """64 x 64 bf16 values of magnitude 1 to 2**11, random signs: every 16-value run sums exactly in float32 in any
  order, so each RHT output's interval is ours alone and its least magnitude is our own."""
  rng = np.random.default_rng(2)
  return jnp.asarray(rng.uniform(1, 2**11, (64, 64)) * rng.choice([-1, 1], (64, 64)), jnp.bfloat16)


@pytest.mark.parametrize("wrong", ["halved_amax", "scale_one_binade_down"])
@pytest.mark.parametrize("name", ["wgrad_x", "wgrad_dy"])
def test_an_amax_or_a_block_scale_below_every_orders_is_one_mismatch_and_no_accepted_difference(name, wrong):
  """The interval's lower ends hold too: a tensor amax halved, or (separately) the largest block scale one E4M3
  binade too small (its exponent field less one: 8 in the bit pattern), lies below what any summation order gives,
  since here every order gives ours. Each is exactly one mismatch in its column, and nothing is counted as an
  accepted order-dependent difference. Why: where each element's least magnitude is computed too small (down to 0),
  a value below every order's is 'explained' by the order and a wrong quantizer passes the audit."""
  operand = _OPERANDS[name]
  x = _exact_runs()
  ours = _encode(x, operand)
  _, low, high = jax.jit(audit.rht_interval)(audit.blocked(x, operand))
  assert np.array_equal(np.asarray(low), np.asarray(high))  # the premise: one value per element
  same = np.asarray(_order_aware(x, operand, ours.codes, ours.scales, ours.amax, False).counts())
  assert same.tolist() == [0, 0, 0, 0, 0, 0], same
  if wrong == "halved_amax":
    counts = np.asarray(_order_aware(x, operand, ours.codes, ours.scales, ours.amax / 2, False).counts())
    assert counts.tolist() == [0, 0, 1, 0, 0, 0], counts
    return
  scales = np.asarray(ours.scales).copy()
  at = np.unravel_index(np.argmax(scales), scales.shape)
  assert (scales[at] >> 3) & 0xF >= 2, scales[at]  # one binade down stays a normal E4M3 value
  scales[at] -= 8
  counts = np.asarray(_order_aware(x, operand, ours.codes, scales, ours.amax, False).counts())
  assert counts.tolist() == [0, 1, 0, 0, 0, 0], counts

def test_a_run_just_past_the_exactness_limit_gets_an_interval_that_holds_the_left_to_right_sum():
  """One RHT output whose 16 products are [2**24, 2**16, -384, 129, 129, 129, 0 x 10] x 2**-40: the sum of their
  magnitudes is 2**24 + 66307 ulps of the smallest (129's, 2**-40), just past the 2**24 below which every order is
  exact. Left to right in float32, each + 129 lands on a float32 tie and rounds to even, ending at 2**24 + 2**16:
  a bf16 midpoint, which rounds down to 2**24; the exact sum, 3 more, rounds up to ours, 2**24 + 2**17 (all x 2**-40).
  So the interval must reach below ours and hold the left-to-right value. Why: an exactness limit one binade too
  loose (2**25) collapses the interval to ours for such runs, and a correct RHT that sums in another order fails."""
  products = np.zeros(16, np.float64)
  products[:6] = [2.0**24, 2.0**16, -384, 129, 129, 129]
  products *= 2.0**-40
  r = audit.hadamard.rht_matrix()
  x = np.float32(products / r[:, 0])  # output 0's products: x_i R[i, 0], R[i, 0] = +-1/4
  assert np.array_equal(np.float64(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32)) * r[:, 0], products)
  left_to_right = np.float32(0)
  for p in np.float32(products):
    left_to_right = np.float32(left_to_right + p)
  assert float(left_to_right) == (2.0**24 + 2.0**16) * 2.0**-40
  theirs = float(jnp.asarray(left_to_right).astype(jnp.bfloat16))
  ours, low, high = (float(a[0, 0]) for a in jax.jit(audit.rht_interval)(jnp.asarray(x[None], jnp.bfloat16)))
  assert ours == (2.0**24 + 2.0**17) * 2.0**-40 and theirs == 2.0**-16  # the two orders round apart
  assert low < ours <= high, (low, ours, high)
  assert low <= theirs <= high, (low, theirs, high)
