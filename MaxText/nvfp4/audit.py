# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Another quantizer's NVFP4 operands held against ours, bit by bit: what the self-check and the in-training audit
compare (MaxText.selfcheck, nvfp4_audit_interval).

Ours equals TransformerEngine's quantizer bit for bit (docs/numerics.md), so on a Blackwell node any difference in
the codes, the E4M3 block scales or the tensor amax of a nearest-rounded operand is TE's kernel (or its build)
computing something else. Stochastic rounding cannot match bit for bit (TE draws its own random bits), so for the
output gradient dY what is checked is what defines it (docs/numerics.md#stochastic-rounding): every code is one of
the two E2M1 neighbours of the scaled input, and over many draws the mean is that of TE's rule with 8 random bits
(`sr_moments`), which the caller tests at 99.9%.

Everything here describes an operand in its blocked orientation: the 2-D operand transposed first when its 1D blocks
run along axis 0 (x^T and dY^T of the weight-gradient GEMM), so the blocks always run along the last axis, as TE
stores its column-wise copies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.nvfp4 import hadamard
from MaxText.nvfp4.e2m1 import e2m1_codes, e2m1_grid_inverse_step, e2m1_magnitudes, e2m1_neighbours, e2m1_values
from MaxText.nvfp4.formats import BLOCK_SIZE, E2M1_MAX, NVFP4, to_e4m3_satfinite
from MaxText.nvfp4.operands import Operand
from MaxText.nvfp4.quantize import Scaling
from MaxText.nvfp4.quantize import encode as encode_blocks
from MaxText.nvfp4.rounding import RANDOM_BITS, random_bits, stochastic_e2m1_codes

# Operand and gemm_operands are the operand table's (MaxText.nvfp4.operands), named here too for the callers that
# take them with the audit (MaxText.backends.pipeline, MaxText.selfcheck.run).
__all__ = ["COLUMNS", "ORDER_BOUND", "ORDER_COLUMNS", "Encoded", "audited", "compare", "emulated", "encode",
           "neighbours", "OrderAware", "order_aware", "rht_interval", "sr_moments"]

#: What `compare` counts, in order: mismatching codes (for a stochastically rounded operand: codes that are not one of
#: the two E2M1 neighbours of the scaled input), mismatching block scales, a mismatching tensor amax (0 or 1).
COLUMNS = ("codes", "scales", "amax")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Encoded:
  """A quantized operand as bits, in its blocked orientation (blocks along the last axis).

  codes: uint8 E2M1 bit patterns (sign in bit 3), the operand's shape. scales: uint8 E4M3 bit patterns, one per
  16-element block (2D: each row of a 16-row tile repeats the tile's scale, as TE stores them). amax: the float32
  tensor amax the tensor scale comes from. scaled: float32, each element times its block's encode scale, the value
  the element rounding starts from (what stochastic rounding is checked against).
  """

  codes: jax.Array
  scales: jax.Array
  amax: jax.Array
  scaled: jax.Array


def blocked(a: jax.Array, operand: Operand) -> jax.Array:
  """The 2-D tensor in the operand's blocked orientation (transposed when its blocks run along axis 0)."""
  return a.T if operand.axis == 0 else a


def encode(a: jax.Array, operand: Operand, *, rht_signs: np.ndarray = hadamard.RHT_SIGNS,
           to_e4m3: Callable[[jax.Array], jax.Array] = to_e4m3_satfinite,
           codes: Callable[[jax.Array], jax.Array] = e2m1_codes, amax: jax.Array | None = None,
           rht_order: hadamard.Order = hadamard.Order.EXACT) -> Encoded:
  """Our quantization of the 2-D tensor `a` as `operand` (nearest-rounded codes), as bits.

  The keyword arguments are TE's steps by default (the RHT signs, the E4M3 rounding of block scales, the E2M1
  rounding of elements); the self-check's faulty candidates swap one to prove the comparison can fail. `amax`, when
  given, is the tensor amax to quantize with instead of the tensor's own (`audited`). `rht_order`: the fused
  backend's quantizer takes hadamard.Order.PLATFORM.
  """
  t = blocked(a, operand)
  y, s8, _, amax = encode_blocks(t, operand.scaling, operand.rht, -1, rht_signs=rht_signs, to_e4m3=to_e4m3, amax=amax,
                                 rht_order=rht_order)
  scales = s8 if operand.scaling is Scaling.ONE_D else jnp.broadcast_to(s8, (s8.shape[0], BLOCK_SIZE, *s8.shape[2:]))
  scales = jax.lax.bitcast_convert_type(scales.reshape(t.shape[0], t.shape[1] // BLOCK_SIZE), jnp.uint8)
  scaled = y.reshape(t.shape)
  return Encoded(codes=codes(scaled), scales=scales, amax=amax, scaled=scaled)


def neighbours(codes: jax.Array, scaled: jax.Array) -> jax.Array:
  """Where each code is one of the two E2M1 neighbours of its scaled input, with the input's sign (0 either sign);
  NaN inputs count as fine (their rounding is the quantizer's documented NaN rule, not stochastic rounding)."""
  lower, upper, _ = e2m1_neighbours(scaled)
  magnitude = e2m1_magnitudes(codes)
  negative = (codes >> 3) & 1
  sign_ok = (magnitude == 0) | (negative.astype(bool) == jnp.signbit(scaled))
  return jnp.isnan(scaled) | (((magnitude == lower) | (magnitude == upper)) & sign_ok)


def sr_moments(scaled: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(mean, variance) of TE's stochastic rounding of each scaled input: up with probability floor(256 f) / 256, f
  the input's fraction of the grid step it sits in (8 random bits: the rule is unbiased up to 1/256 of a step)."""
  lower, upper, _ = e2m1_neighbours(scaled)  # the step's exact inverse multiplies below: no division
  a = jnp.minimum(jnp.abs(scaled), E2M1_MAX)
  fraction = jnp.where(upper > lower, (a - lower) * e2m1_grid_inverse_step(a), 0.0)
  p_up = jnp.floor(fraction * (1 << RANDOM_BITS)) * np.float32(1.0 / (1 << RANDOM_BITS))
  mean = jnp.where(jnp.signbit(scaled), -1.0, 1.0) * (lower + p_up * (upper - lower))
  return mean, jnp.square(upper - lower) * p_up * (1.0 - p_up)


def compare(ours: Encoded, codes: jax.Array, scales: jax.Array, amax: jax.Array, stochastic: bool) -> jax.Array:
  """Counts of COLUMNS (float32, jit-able): `codes`, `scales` and `amax` of another quantizer, in `ours`' layout,
  against ours; for a stochastically rounded operand the codes are checked with `neighbours`."""
  code_mismatch = ~neighbours(codes, ours.scaled) if stochastic else codes != ours.codes
  amax_bits = jax.lax.bitcast_convert_type(jnp.asarray(amax, jnp.float32), jnp.uint32)
  ours_bits = jax.lax.bitcast_convert_type(ours.amax, jnp.uint32)
  return jnp.stack([jnp.sum(code_mismatch, dtype=jnp.float32), jnp.sum(scales != ours.scales, dtype=jnp.float32),
                    (amax_bits != ours_bits).astype(jnp.float32)])


#: How far any float32 summation order of one RHT output's 16 exact products can lie from the exact sum, as a share
#: of the sum of their magnitudes: gamma_15 = 15u / (1 - 15u), u = 2**-24 (Higham, (3.5)). The interval around our
#: own float32 sum (itself one order) that holds every order's is twice that; doubled again for the rounding of the
#: bound's own float32 arithmetic, which is far smaller. Wider only widens the interval a value may take; a candidate
#: still has to land inside it.
ORDER_BOUND = 4 * 15 * 2.0**-24 / (1 - 15 * 2.0**-24)

#: What `order_aware` counts: COLUMNS' mismatches, then the differences it accepted as summation order's.
ORDER_COLUMNS = (*COLUMNS, "accepted_codes", "accepted_scales", "accepted_amax")


def _runs(a: jax.Array) -> jax.Array:
  return a.reshape(*a.shape[:-1], a.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)


def rht_interval(t: jax.Array, signs: np.ndarray = hadamard.RHT_SIGNS) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(ours, low, high): the bf16 RHT of `t` (runs along its last axis) as we compute it, and the least and greatest
  bf16 value any float32 summation order of each element's 16 products can round to (both ours where every order
  gives ours).

  Why: the products are exact (bf16 times +-1/4) but their float32 sum rounds when a run's values span more than about
  2**12 in magnitude (docs/numerics.md#random-hadamard-transform), and the bf16 rounding of that sum then depends on
  the order of the additions: tensor cores (TE's RHT), XLA:GPU's dot and XLA:CPU's each add in their own. Every
  partial sum is a multiple of the smallest term's ulp and at most the sum of magnitudes M, so when M is below 2**24
  of those ulps every order is exact and the same. Otherwise every order's sum lies within ORDER_BOUND x M of ours,
  and so its bf16 rounding between those of the interval's ends."""
  ours = hadamard.rht(t, -1, signs)
  sums = hadamard.rht_sums(t, -1, signs)
  magnitude = jnp.sum(jnp.abs(_runs(t.astype(jnp.float32))), axis=-1, keepdims=True) * np.float32(0.25)
  bits = jax.lax.bitcast_convert_type(t.astype(jnp.bfloat16), jnp.uint16)
  exponent, nonzero = (bits >> 7) & 0xFF, (bits & 0x7FFF) != 0
  smallest = jnp.min(_runs(jnp.where(nonzero, jnp.maximum(exponent, 1), 255).astype(jnp.int32)), axis=-1,
                     keepdims=True)  # a product's ulp is 2**(smallest - 136): bf16's 2**(e - 134), times 1/4
  exact = jnp.frexp(magnitude)[1] <= smallest - 112  # M < 2**24 * 2**(smallest - 136)
  reach = jnp.broadcast_to(jnp.where(exact, 0.0, magnitude * np.float32(ORDER_BOUND)), _runs(sums).shape)
  reach = reach.reshape(sums.shape)
  low, high = (sums - reach).astype(jnp.bfloat16), (sums + reach).astype(jnp.bfloat16)
  finite = jnp.isfinite(sums) & jnp.isfinite(reach)
  return ours, jnp.where(finite, jnp.minimum(low, ours), ours), jnp.where(finite, jnp.maximum(high, ours), ours)


def _bits(a: jax.Array) -> jax.Array:
  return jax.lax.bitcast_convert_type(jnp.asarray(a, jnp.float32).reshape(()), jnp.uint32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class OrderAware:
  """`order_aware`'s verdict per element, block and tensor: where the other quantizer's value is one a correct RHT
  can give (`*_ok`), and where it differs from ours (`*_differ`): an accepted difference is both."""

  codes_ok: jax.Array
  scales_ok: jax.Array
  amax_ok: jax.Array
  codes_differ: jax.Array
  scales_differ: jax.Array
  amax_differs: jax.Array
  greatest_amax: jax.Array  # the tensor amax with every RHT output at its greatest magnitude: the most any order gives

  def counts(self) -> jax.Array:
    """ORDER_COLUMNS, float32."""

    def count(mask: jax.Array) -> jax.Array:
      return jnp.sum(mask, dtype=jnp.float32)

    return jnp.stack([count(~self.codes_ok), count(~self.scales_ok), count(~self.amax_ok),
                      count(self.codes_differ & self.codes_ok), count(self.scales_differ & self.scales_ok),
                      count(self.amax_differs & self.amax_ok)])


def order_aware(tensor: jax.Array, operand: Operand, codes: jax.Array, scales: jax.Array, amax: jax.Array,
                amax_given: bool = False) -> OrderAware:
  """Another quantizer's (codes, scales, amax) of the RHT'd operand
  `tensor`, held against every operand a correct RHT can give (`rht_interval`; jit-able, counts by
  `OrderAware.counts`): a difference from ours is accepted
  where it is what ours would be with each element anywhere in its interval, and counted as a mismatch everywhere
  else (E2M1, E4M3 and the amax are all monotone in what they round).

  The amax may be any between the maximum of each element's least and of its greatest magnitude; each block scale,
  under that amax, any between those of its block's least and greatest magnitudes; each code, under that block scale,
  any between the codes of its element's interval ends (for a stochastically rounded operand also either E2M1
  neighbour of either end). `amax_given`: the in-training audit's rule, where the other quantizer's amax may be a
  shard's: it is taken as given (the caller checks it against the whole tensor's) and codes and scales are held
  under it.
  """
  if operand.scaling is not Scaling.ONE_D or not operand.rht:
    raise ValueError(f"{operand.name}: the order-aware comparison is for 1D RHT'd operands")
  plain = dataclasses.replace(operand, rht=False, axis=-1)
  ours, low, high = rht_interval(blocked(tensor, operand))
  f32 = (low.astype(jnp.float32), high.astype(jnp.float32))
  least = jnp.where((f32[0] <= 0) & (f32[1] >= 0), 0.0, jnp.minimum(jnp.abs(f32[0]), jnp.abs(f32[1])))
  most = jnp.maximum(jnp.abs(f32[0]), jnp.abs(f32[1]))
  strict = encode(ours, plain)
  greatest = encode(most, plain).amax
  theirs_amax = jnp.asarray(amax, jnp.float32).reshape(())
  if amax_given:
    amax_ok, used = jnp.asarray(True), theirs_amax
  else:
    amax_ok = ((_bits(amax) == _bits(strict.amax)) | ((theirs_amax >= encode(least, plain).amax)
                                                      & (theirs_amax <= greatest)))
    used = jnp.where(amax_ok, theirs_amax, strict.amax)
  under = encode(ours, plain, amax=used)
  scales_ok = (scales == under.scales) | ((scales >= encode(least, plain, amax=used).scales)
                                          & (scales <= encode(most, plain, amax=used).scales))
  e4m3 = jax.lax.bitcast_convert_type(jnp.where(scales_ok, scales, under.scales), NVFP4.scale_dtype)

  def with_their_scales(v: jax.Array) -> Encoded:
    return encode(v, plain, amax=used, to_e4m3=lambda blocked_scales: e4m3.reshape(blocked_scales.shape))

  bottom, top = with_their_scales(low), with_their_scales(high)
  value = e2m1_values(codes)
  codes_ok = (value >= e2m1_values(bottom.codes)) & (value <= e2m1_values(top.codes))
  if operand.stochastic:
    codes_ok |= neighbours(codes, bottom.scaled) | neighbours(codes, top.scaled)
    differs = ~neighbours(codes, strict.scaled)
  else:
    differs = codes != strict.codes

  return OrderAware(codes_ok=codes_ok, scales_ok=scales_ok, amax_ok=amax_ok, codes_differ=differs,
                    scales_differ=scales != strict.scales,
                    amax_differs=(_bits(amax) != _bits(strict.amax)) & ~jnp.asarray(amax_given),
                    greatest_amax=greatest)


def audited(tensor: jax.Array, operand: Operand, codes: jax.Array, scales: jax.Array, amax: jax.Array) -> jax.Array:
  """COLUMNS counts of another quantizer's (codes, scales, amax) of `tensor` as `operand`, as the in-training audit
  holds them: codes and scales against ours quantized with THEIR tensor amax, so the check is exact on every device
  whatever amax scope they use (TE takes x's and dY's amax per data shard, where the tensor is global to GSPMD); the
  amax itself is a mismatch when it exceeds ours over the whole tensor (a shard's amax never can) or is not finite
  where ours is. The self-check, on unsharded tensors, compares the amax bit for bit (`compare`). An RHT'd operand is
  held order-aware (`order_aware`): a difference another float32 summation order of the transform explains is no
  mismatch, and the whole tensor's amax is the largest any order gives."""
  amax = jnp.asarray(amax, jnp.float32).reshape(())
  if operand.rht and operand.scaling is Scaling.ONE_D:
    verdict = order_aware(tensor, operand, codes, scales, amax, amax_given=True)
    counts, whole = verdict.counts()[:len(COLUMNS)], verdict.greatest_amax
  else:
    ours = encode(tensor, operand, amax=amax)
    counts = compare(ours, codes, scales, ours.amax, operand.stochastic)
    whole = encode(tensor, operand).amax
  bad_amax = (amax > whole) | (~jnp.isfinite(amax) & jnp.isfinite(whole))
  return counts.at[2].set(bad_amax.astype(jnp.float32))


def emulated(tensor: jax.Array, operand: Operand, key: jax.Array | None = None,
             rht_order: hadamard.Order = hadamard.Order.EXACT) -> tuple[jax.Array, jax.Array, jax.Array]:
  """This quantizer as a candidate (the emulated backend's, and the self-check's where TE cannot run; the fused
  backend's with `rht_order=hadamard.Order.PLATFORM`): (codes, scales, amax) of `tensor` as `operand`, the codes of a
  stochastically rounded operand drawn with `key` (a fixed key by default: the audit's draws never touch training)."""
  encoded = encode(tensor, operand, rht_order=rht_order)
  if not operand.stochastic:
    return encoded.codes, encoded.scales, encoded.amax
  bits = random_bits(jax.random.key(0) if key is None else key, encoded.scaled.shape)
  return stochastic_e2m1_codes(encoded.scaled, bits), encoded.scales, encoded.amax
