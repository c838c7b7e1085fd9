# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The block format as data: `BlockFormat`, its NVFP4 entry and the facts read off it by name, and the E4M3 scale
rounding every quantizer path shares. The exact float32 arithmetic it rounds with is MaxText.nvfp4.arithmetic; the
E2M1 element codec is MaxText.nvfp4.e2m1.

Every number here is a fact of the format or of TransformerEngine's kernels (docs/numerics.md#the-format, #quantize),
written once: the NVFP4 object holds the format's (element type, block size, scale type and rule), its element grid
and largest scale are read off the dtypes' bits, the module names below read them off it, and no other
module of MaxText writes one of them as a literal.
"""

import dataclasses
import enum
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.nvfp4.arithmetic import round_to


@functools.cache
def _magnitudes(dtype: Any) -> tuple[float, ...]:
  """BlockFormat.element_magnitudes of an element dtype of at most 8 bits: its codes with the sign bit clear, as
  values, the non-finite ones (a NaN or infinity code) left out."""
  bits = jnp.finfo(dtype).bits
  values = np.arange(2 ** (bits - 1), dtype=np.uint8).view(dtype).astype(np.float64)
  return tuple(float(v) for v in values if np.isfinite(v))


class ScaleRule(str, enum.Enum):
  """How a block's scale is made from the block's amax, the one step where block formats differ most.

  RN_SATFINITE (NVFP4, TE's kernels): s = cvt.rn.satfinite(min(bamax * (S_enc * f32(1 / element_max)), FLT_MAX)) in
  the scale dtype, round-to-nearest-even, saturating at scale_max, subnormals kept. A power-of-two rule (MX formats'
  E8M0 scales, floor or ceil of log2) would be another member, with its own branch in `BlockFormat.round_scale`.
  """

  RN_SATFINITE = "rn.satfinite"


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockFormat:
  """A block-scaled format: element grid, block size, block-scale type and rule, and the FP32 tensor scale.

  Why one object: these numbers are one fact each, and the recipe (MaxText.nvfp4.gemm.GemmRecipe) carries the
  format it quantizes to, so a new format or scaling variant is a new instance, not a parallel package. Frozen and
  hashable (no arrays in its fields): it rides in the recipe, a static argument of jit and custom_vjp.
  """

  name: str
  element_dtype: Any  # the storage dtype of an element (jnp.float4_e2m1fn); its values are read off its bits
  block_size: int  # elements per block along the block axis (1D: 1 x block_size; 2D: block_size x block_size tiles)
  scale_dtype: Any  # the storage dtype of a block scale (jnp.float8_e4m3fn)
  scale_rule: ScaleRule
  tensor_scale_dtype: Any = np.float32  # the per-tensor scale S_enc = tensor_scale_range / amax

  @property
  def element_magnitudes(self) -> tuple[float, ...]:
    """The non-negative finite element values in code order (sign bit clear), ascending: every code of the element
    type's exponent and mantissa bits, decoded by its dtype, not a table written for the format. For
    E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6."""
    return _magnitudes(self.element_dtype)

  @property
  def scale_max(self) -> np.floating:
    """The largest block scale (the scale dtype's largest finite value), in the tensor scale's dtype; the rule
    saturates there."""
    return self.tensor_scale_dtype(jnp.finfo(self.scale_dtype).max)

  @property
  def element_max(self) -> np.floating:
    """The largest element magnitude, in the tensor scale's dtype."""
    return self.tensor_scale_dtype(self.element_magnitudes[-1])

  @property
  def tensor_scale_range(self) -> np.floating:
    """element_max * scale_max: the tensor scale maps the global amax onto the largest value a block scale times an
    element can reach, so S_enc = range / amax and dequantization multiplies by amax / range."""
    return self.tensor_scale_dtype(self.element_max * self.scale_max)

  @property
  def one_over_element_max(self) -> np.floating:
    """1 / element_max rounded to the tensor scale's dtype. The kernels multiply by this constant instead of
    dividing by element_max; (bamax / 6) * S_enc differs from bamax * (S_enc * f32(1/6)) in about 0.2% of blocks."""
    return self.tensor_scale_dtype(1.0) / self.element_max

  @property
  def scale_min_normal(self) -> np.floating:
    """The smallest normal block scale: a scale below it (or 0) has lost precision to the subnormal range."""
    return self.tensor_scale_dtype(jnp.finfo(self.scale_dtype).smallest_normal)

  def round_scale(self, v: jax.Array) -> jax.Array:
    """float32 -> the scale dtype by `scale_rule` (callers pass non-negative, non-NaN values)."""
    if self.scale_rule is ScaleRule.RN_SATFINITE:
      # The clamp comes first because XLA's and ml_dtypes' conversion maps values above the format's largest
      # rounding boundary to NaN (464 for E4M3; the kernels' cvt.rn.satfinite saturates). The rounding is
      # explicit (round_to): consumers widen the scale again, and XLA's GPU compiler drops a narrow-and-widen pair.
      return round_to(jnp.minimum(v, self.scale_max), self.scale_dtype).astype(self.scale_dtype)
    raise NotImplementedError(f"{self.name}: scale rule {self.scale_rule} has no implementation")


#: NVFP4 (docs/numerics.md#the-format): E2M1 elements {0, 0.5, 1, 1.5, 2, 3, 4, 6} (6 = 0b0111 = 1.5 * 2**2), 16
#: per block, one E4M3 (fn: no inf) scale per block, at most 448 (0b0_1111_110 = 1.75 * 2**8; 0b0_1111_111 is NaN),
#: and an FP32 tensor scale S_enc = 6 * 448 / amax = 2688 / amax.
NVFP4 = BlockFormat(name="nvfp4", element_dtype=jnp.float4_e2m1fn, block_size=16, scale_dtype=jnp.float8_e4m3fn,
                    scale_rule=ScaleRule.RN_SATFINITE)

# The default format's facts by name, for the code that takes no recipe: the quantizer's kernels below are NVFP4's
# (E2M1 elements, E4M3 scales). Each is read off NVFP4, never written again.

#: Elements per scaling block, along the block axis (1D: 1x16; 2D: 16x16 tiles).
BLOCK_SIZE = NVFP4.block_size

#: Largest FP4 E2M1 magnitude (6).
E2M1_MAX = NVFP4.element_max

#: Largest FP8 E4M3 magnitude (448).
E4M3_MAX = NVFP4.scale_max

#: E2M1_MAX * E4M3_MAX = 2688 (BlockFormat.tensor_scale_range).
TENSOR_SCALE_RANGE = NVFP4.tensor_scale_range

#: 1/6 rounded to float32 (0x3E2AAAAB; BlockFormat.one_over_element_max).
ONE_SIXTH = NVFP4.one_over_element_max


#: The eight E2M1 magnitudes, {0, 0.5, 1, 1.5, 2, 3, 4, 6}, indexed by code (sign bit clear).
E2M1_MAGNITUDES = np.array(NVFP4.element_magnitudes, np.float32)

#: Storage dtypes.
E2M1 = NVFP4.element_dtype
E4M3 = NVFP4.scale_dtype


def next_multiple(value: int, multiple: int = BLOCK_SIZE) -> int:
  """The smallest multiple of `multiple` (default: the NVFP4 block) that is >= value: padding to whole blocks, and
  the nearest fitting size an error message suggests."""
  return -(-value // multiple) * multiple


def to_e4m3_satfinite(v: jnp.ndarray) -> jnp.ndarray:
  """float32 -> float8_e4m3fn, round-to-nearest-even, saturating at 448, subnormals kept: NVFP4's scale rule
  (BlockFormat.round_scale). Callers pass non-negative, non-NaN values."""
  return NVFP4.round_scale(v)
