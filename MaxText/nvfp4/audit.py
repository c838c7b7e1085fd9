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
from MaxText.nvfp4.formats import (
  BLOCK_SIZE,
  E2M1_MAX,
  e2m1_codes,
  e2m1_grid_inverse_step,
  e2m1_magnitudes,
  e2m1_neighbours,
  to_e4m3_satfinite,
)
from MaxText.nvfp4.operands import Operand
from MaxText.nvfp4.quantize import Scaling
from MaxText.nvfp4.quantize import encode as encode_blocks
from MaxText.nvfp4.rounding import RANDOM_BITS, random_bits, stochastic_e2m1_codes

# Operand and gemm_operands are the operand table's (MaxText.nvfp4.operands), named here too for the callers that
# take them with the audit (MaxText.backends.pipeline, MaxText.selfcheck.run).
__all__ = ["COLUMNS", "Encoded", "audited", "compare", "emulated", "encode", "neighbours", "sr_moments"]

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
           codes: Callable[[jax.Array], jax.Array] = e2m1_codes, amax: jax.Array | None = None) -> Encoded:
  """Our quantization of the 2-D tensor `a` as `operand` (nearest-rounded codes), as bits.

  The keyword arguments are TE's steps by default (the RHT signs, the E4M3 rounding of block scales, the E2M1
  rounding of elements); the self-check's faulty candidates swap one to prove the comparison can fail. `amax`, when
  given, is the tensor amax to quantize with instead of the tensor's own (`audited`).
  """
  t = blocked(a, operand)
  y, s8, _, amax = encode_blocks(t, operand.scaling, operand.rht, -1, rht_signs=rht_signs, to_e4m3=to_e4m3, amax=amax)
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


def audited(tensor: jax.Array, operand: Operand, codes: jax.Array, scales: jax.Array, amax: jax.Array) -> jax.Array:
  """COLUMNS counts of another quantizer's (codes, scales, amax) of `tensor` as `operand`, as the in-training audit
  holds them: codes and scales against ours quantized with THEIR tensor amax, so the check is exact on every device
  whatever amax scope they use (TE takes x's and dY's amax per data shard, where the tensor is global to GSPMD); the
  amax itself is a mismatch when it exceeds ours over the whole tensor (a shard's amax never can) or is not finite
  where ours is. The self-check, on unsharded tensors, compares the amax bit for bit (`compare`)."""
  ours = encode(tensor, operand, amax=jnp.asarray(amax, jnp.float32).reshape(()))
  counts = compare(ours, codes, scales, ours.amax, operand.stochastic)
  whole = encode(tensor, operand).amax
  amax = jnp.asarray(amax, jnp.float32).reshape(())
  bad_amax = (amax > whole) | (~jnp.isfinite(amax) & jnp.isfinite(whole))
  return counts.at[2].set(bad_amax.astype(jnp.float32))


def emulated(tensor: jax.Array, operand: Operand, key: jax.Array | None = None) -> tuple[jax.Array, jax.Array,
                                                                                        jax.Array]:
  """This quantizer as a candidate (the emulated backend's, and the self-check's where TE cannot run): (codes,
  scales, amax) of `tensor` as `operand`, the codes of a stochastically rounded operand drawn with `key` (a fixed
  key by default: the audit's draws never touch training)."""
  encoded = encode(tensor, operand)
  if not operand.stochastic:
    return encoded.codes, encoded.scales, encoded.amax
  bits = random_bits(jax.random.key(0) if key is None else key, encoded.scaled.shape)
  return stochastic_e2m1_codes(encoded.scaled, bits), encoded.scales, encoded.amax
