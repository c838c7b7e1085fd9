# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The quantizer and GEMM under test, and the faults that prove the checks can fail.

A candidate quantizes a 2-D bf16 tensor as one GEMM operand (MaxText.nvfp4.operands.Operand) into (codes, scales,
amax) as bits in the operand's blocked orientation, and runs the three GEMMs of y = x W (fprop, dgrad, wgrad) with
stochastic rounding off. TransformerEngine's is the candidate on a Blackwell node (MaxText.backends.te_quantize); a run
on the fused backend checks the fused backend (our quantizer, and its block-scaled GEMM: TE's on Blackwell); the
emulator is the candidate anywhere else, where the checks then hold the emulator against itself and an independent
float64 reference, and the one `--with-fault` corrupts: a fault is a known bug in one step of one operand's
quantization, so the check must fail, naming that operand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.nvfp4 import audit, hadamard
from MaxText.nvfp4.e2m1 import e2m1_codes, e2m1_neighbours
from MaxText.nvfp4.formats import NVFP4, to_e4m3_satfinite
from MaxText.nvfp4.gemm import MATMUL_DIMS, BlockScaledGemm, GemmRecipe, nvfp4_dot_general
from MaxText.nvfp4.operands import Operand
from MaxText.nvfp4.rounding import random_bits, stochastic_e2m1_codes

__all__ = ["FAULTS", "VARIANTS", "Candidate", "Emulator", "Fault", "Fused", "OrderVariant", "TransformerEngine"]


class Candidate(Protocol):
  """What the checks hold against the bit-exact emulator."""

  name: str

  def quantize(self, tensor: jax.Array, operand: Operand, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(codes, scales, amax) of `tensor` as `operand`; `key` seeds a stochastic rounding draw."""

  def gemms(self, x: jax.Array, w: jax.Array, dy: jax.Array, recipe: GemmRecipe) -> tuple[jax.Array, ...]:
    """(y, dx, dW) of y = x W for the output gradient dy, the recipe's quantization with stochastic rounding off."""


@dataclasses.dataclass(frozen=True)
class Fault:
  """A known bug in one step of one operand's quantization."""

  name: str
  operand: str  # the GEMM operand it corrupts (MaxText.nvfp4.operands.GEMM_OPERANDS)
  what: str


def _e4m3_up(v: jax.Array) -> jax.Array:
  """E4M3 rounded up instead of to nearest-even (the scale-round fault)."""
  nearest = to_e4m3_satfinite(v)
  bits = jax.lax.bitcast_convert_type(nearest, jnp.uint8)
  up = jax.lax.bitcast_convert_type(bits + jnp.uint8(1), NVFP4.scale_dtype)
  return jnp.where((nearest.astype(jnp.float32) < v) & (nearest.astype(jnp.float32) < NVFP4.scale_max), up, nearest)


def _codes_toward_zero(y: jax.Array) -> jax.Array:
  """E2M1 codes rounded toward zero instead of to nearest-even (the code-round fault): the lower neighbour."""
  lower, _, _ = e2m1_neighbours(y)
  return e2m1_codes(jnp.copysign(lower, y))


#: The faults `--with-fault` can inject, each into one operand's quantization.
FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("scale-round", "fprop_w", "E4M3 block scales rounded up instead of to nearest-even"),
    Fault("code-round", "fprop_x", "E2M1 element codes rounded toward zero instead of to nearest-even"),
    Fault("rht-sign", "wgrad_x", "one sign of the random Hadamard transform flipped"),
    Fault("sr-bias", "dgrad_dy", "stochastic rounding's random bits shifted up by 1/16 of a grid step"),
    Fault("sr-bias-small", "dgrad_dy", "stochastic rounding's random bits shifted up by 1/64 of a grid step (the "
          "smallest bias the mean test claims, docs/blackwell.md)"),
    Fault("amax-ulp", "fprop_x", "the tensor amax one float32 ulp up (codes and scales quantized with it)"),
    Fault("shard-amax", "fprop_x", "the tensor amax taken over the first half of the rows only, as if per data shard "
          "(codes and scales quantized with it)"),
)}
_FLIPPED = hadamard.RHT_SIGNS * np.where(np.arange(len(hadamard.RHT_SIGNS)) == 5, -1, 1).astype(np.float32)
#: Each SR fault's shift of the 8 random bits, of 256: the bias in grid steps is shift / 256.
_SR_SHIFT = {"sr-bias": 16, "sr-bias-small": 4}


def _amax_one_ulp_up(tensor: jax.Array, operand: Operand) -> audit.Encoded:
  whole = audit.encode(tensor, operand).amax
  return audit.encode(tensor, operand, amax=jnp.nextafter(whole, jnp.float32(jnp.inf)))


def _amax_of_first_half(tensor: jax.Array, operand: Operand) -> audit.Encoded:
  shard = audit.encode(tensor[: tensor.shape[0] // 2], operand).amax
  return audit.encode(tensor, operand, amax=shard)


def _our_gemms(x: jax.Array, w: jax.Array, dy: jax.Array, recipe: GemmRecipe, block_gemm: BlockScaledGemm | None
               ) -> tuple[jax.Array, ...]:
  """(y, dx, dW) of the plugin's NVFP4 GEMM, stochastic rounding off: the emulator's (block_gemm None) or the fused
  backend's (its block-scaled GEMM)."""
  recipe = dataclasses.replace(recipe, stochastic_rounding=False)
  y, pullback = jax.vjp(lambda a, b: nvfp4_dot_general(a, b, MATMUL_DIMS, key=None, recipe=recipe,
                                                       block_gemm=block_gemm), x, w)
  return (y, *pullback(dy))


@dataclasses.dataclass(frozen=True)
class Emulator:
  """The bit-exact emulator (MaxText.nvfp4) as the candidate, with at most one fault."""

  fault: Fault | None = None

  @property
  def name(self) -> str:
    return "emulator" + (f" with fault {self.fault.name}" if self.fault else "")

  def quantize(self, tensor: jax.Array, operand: Operand, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    faulty = self.fault is not None and self.fault.operand == operand.name
    if not faulty:
      return audit.emulated(tensor, operand, key)
    steps: dict[str, Callable[..., Any]] = {"scale-round": lambda: audit.encode(tensor, operand, to_e4m3=_e4m3_up),
                                            "code-round": lambda: audit.encode(tensor, operand,
                                                                               codes=_codes_toward_zero),
                                            "rht-sign": lambda: audit.encode(tensor, operand, rht_signs=_FLIPPED),
                                            "amax-ulp": lambda: _amax_one_ulp_up(tensor, operand),
                                            "shard-amax": lambda: _amax_of_first_half(tensor, operand)}
    if self.fault.name in steps:
      encoded = steps[self.fault.name]()
      return encoded.codes, encoded.scales, encoded.amax
    encoded = audit.encode(tensor, operand)  # sr-bias, sr-bias-small
    shift = _SR_SHIFT[self.fault.name]
    bits = jnp.minimum(random_bits(key, encoded.scaled.shape).astype(jnp.int32) + shift, 255).astype(jnp.uint8)
    return stochastic_e2m1_codes(encoded.scaled, bits), encoded.scales, encoded.amax

  def gemms(self, x: jax.Array, w: jax.Array, dy: jax.Array, recipe: GemmRecipe) -> tuple[jax.Array, ...]:
    return _our_gemms(x, w, dy, recipe, None)


#: The benign variants `--with-variant` can run: a correct quantizer that is not ours bit for bit, which the checks
#: must pass (a check that fails a healthy node is worse than none).
VARIANTS = {"rht-order": "the RHT's 16 float32 products summed one by one from the last, not in the order of "
                         "XLA's dot (TE's tensor cores add in an order of their own)"}


def _rht_summed_from_the_last(t: jax.Array) -> jax.Array:
  """The RHT of `t` (runs along its last axis) with each output's 16 exact float32 products added one at a time,
  from the 16th to the first, then rounded to bf16: another correct summation order than `hadamard.rht`'s."""
  matrix = hadamard.rht_matrix()
  runs = t.astype(jnp.float32).reshape(*t.shape[:-1], t.shape[-1] // matrix.shape[0], matrix.shape[0])
  total = runs[..., -1:] * matrix[-1]
  for k in range(matrix.shape[0] - 2, -1, -1):
    total = total + runs[..., k:k + 1] * matrix[k]
  return total.reshape(t.shape).astype(jnp.bfloat16)


@dataclasses.dataclass(frozen=True)
class OrderVariant:
  """The emulator with its RHT summed in another float32 order (VARIANTS["rht-order"]): a correct quantizer whose RHT'd
  operands differ from ours where a block spans a wide range, as TE's on a healthy Blackwell node may."""

  name: str = "emulator with variant rht-order"

  def quantize(self, tensor: jax.Array, operand: Operand, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    if not operand.rht:
      return audit.emulated(tensor, operand, key)
    plain = dataclasses.replace(operand, rht=False, axis=-1)
    encoded = audit.encode(_rht_summed_from_the_last(audit.blocked(tensor, operand)), plain)
    codes = (stochastic_e2m1_codes(encoded.scaled, random_bits(key, encoded.scaled.shape)) if operand.stochastic
             else encoded.codes)
    return codes, encoded.scales, encoded.amax

  def gemms(self, x: jax.Array, w: jax.Array, dy: jax.Array, recipe: GemmRecipe) -> tuple[jax.Array, ...]:
    return _our_gemms(x, w, dy, recipe, None)


@dataclasses.dataclass(frozen=True)
class Fused:
  """The fused backend (nvfp4_backend=fused) as the candidate: our quantizer with the RHT in its GPU order
  (hadamard.Order.PLATFORM, so the quantization check holds its RHT'd operands order-aware, as it holds TE's, and
  the rest bit for bit; on CPU it is the emulator's), and its block-scaled GEMM on codes
  and scales, which the GEMM check holds against float64 products: TE's cuBLASLt NVFP4 GEMM where TE runs NVFP4
  (MaxText.backends.te_gemm), jax.nn.scaled_matmul elsewhere (MaxText.backends.te_gemm.fused_gemm picks it)."""

  block_gemm: BlockScaledGemm
  gemm_name: str

  @property
  def name(self) -> str:
    return f"fused backend (our quantizer, {self.gemm_name})"

  def quantize(self, tensor: jax.Array, operand: Operand, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    return audit.emulated(tensor, operand, key, rht_order=hadamard.Order.PLATFORM)

  def gemms(self, x: jax.Array, w: jax.Array, dy: jax.Array, recipe: GemmRecipe) -> tuple[jax.Array, ...]:
    return _our_gemms(x, w, dy, recipe, self.block_gemm)


@dataclasses.dataclass(frozen=True)
class TransformerEngine:
  """TransformerEngine's NVFP4 quantizers and dense GEMM as the candidate (MaxText.backends.te_quantize): runs on a
  GPU where TE runs NVFP4 (Blackwell), compiles for one anywhere (--compile-only)."""

  recipe: GemmRecipe
  name: str = "TransformerEngine"

  def quantize(self, tensor: jax.Array, operand: Operand, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    # pylint: disable-next=import-outside-toplevel  # TE's quantizers: only where this candidate is chosen
    from MaxText.backends import te_quantize

    return te_quantize.candidate(self.recipe)(tensor, operand, key)

  def gemms(self, x: jax.Array, w: jax.Array, dy: jax.Array, recipe: GemmRecipe) -> tuple[jax.Array, ...]:
    # pylint: disable-next=import-outside-toplevel  # TE's quantizers: only where this candidate is chosen
    from MaxText.backends import te_quantize

    quantizers = te_quantize.quantizer_set(dataclasses.replace(recipe, stochastic_rounding=False), None)
    y, pullback = jax.vjp(lambda a, b: te_quantize.dense(a, b, quantizers), x, w)
    return (y, *pullback(dy))
