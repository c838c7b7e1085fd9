# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""NVFP4 quantize/dequantize in pure JAX, equal bit for bit to TransformerEngine's quantizer.

The algorithm is docs/numerics.md (#quantize to #stochastic-rounding), in the kernels' own order of f32 operations:
a global amax gives the tensor scale S_enc = 2688 / amax; each 16-element block (or 16x16 tile) gets an E4M3 scale
s8 = e4m3(bamax * (S_enc * f32(1/6))); each element is multiplied once by enc = 1 / (f32(s8) / S_enc) and
rounded to E2M1. Reconstruction: x ~= e2m1 * f32(s8) * (amax / 2688).

Exactness: data, scale and amax equal TE's for every tensor whose amax is 0 or >= 1e-30, f32/bf16 subnormal
elements included. Below that (a whole tensor of magnitude < 1e-30, which training never produces) the
tensor-scale products are themselves f32 subnormals, which XLA:CPU flushes to zero and the GPU does not.
One more case of that flush: with rht=True, an RHT output below 2**-126 becomes 0 here, a bf16 subnormal in
TE, and so does every RHT term x_i * (+-1/4) below 2**-126 (inputs below 2**-124) before the f32 sum; with
amax >= 1e-30 such an element can only sit in a block whose scale is 0, so only the data bits of a block that
dequantizes to 0 can differ.

Special values (stated here because TE's kernels are not all alike on them, and ours never crash):
  * NaN: ignored by the global amax (the tensor scale comes from the finite values); a block holding a NaN
    gets the largest block scale (448, CUDA fminf semantics) and the NaN element itself becomes +6.
    That is `quantize`, TE's storage format. The GEMM's operand forms (MaxText.nvfp4.block_scaled)
    instead make every value of a block holding a NaN or Inf NaN, so the GEMM output is non-finite as a BF16 GEMM's
    would be, and their global amax leaves such a NaN block out whole (`block_amax`).
  * +-Inf: counts in the global amax, so S_enc = 2688 / inf = 0 falls back to 1 (as for an all-zero tensor);
    the Inf element saturates to +-6 in a block scaled by 448 and `dequantize` returns non-finite values
    for that tensor (amax is inf), which is what a loss-scaler or a NaN check upstream should see.
  * all-zero tensor: S_enc = 1, every block scale 0, every element 0.
"""

import dataclasses
import enum
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.nvfp4 import hadamard, rounding
from MaxText.nvfp4.arithmetic import FLT_MAX, UINT_OF_WIDTH, copysign, divide, fmin_flt_max, widen
from MaxText.nvfp4.e2m1 import e2m1_codes, pack_e2m1
from MaxText.nvfp4.formats import BLOCK_SIZE, ONE_SIXTH, TENSOR_SCALE_RANGE, to_e4m3_satfinite

_ACCEPTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


class Scaling(str, enum.Enum):
  """Shape of the region that shares one E4M3 block scale."""

  ONE_D = "1d"  # 1x16: 16 consecutive elements along the last axis (activations, gradients).
  TWO_D = "2d"  # 16x16 tiles over the last two axes (weights): the transpose sees the same scales.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Nvfp4Tensor:
  """An NVFP4-quantized tensor; a pytree whose leaves are data, scale and amax.

  Invariants: data.shape == x.shape; scale.shape == x.shape[:-1] + (x.shape[-1] // 16,) (for 2D scaling
  each row of a 16-row group repeats its tile's scale); amax is a float32 scalar, the global amax the
  tensor scale came from (of the RHT output when rht=True). Dequantization is
  data * scale * (amax / 2688), per 16-element block along the last axis, then the inverse RHT if rht.
  """

  data: jax.Array  # float4_e2m1fn, the input's shape.
  scale: jax.Array  # float8_e4m3fn, one per 16 elements along the last axis.
  amax: jax.Array  # float32 scalar.
  scaling: Scaling = dataclasses.field(default=Scaling.ONE_D, metadata={"static": True})
  rht: bool = dataclasses.field(default=False, metadata={"static": True})

  @property
  def shape(self) -> tuple[int, ...]:
    return self.data.shape


def check_input(
    x: jax.Array, scaling: Scaling, stochastic_rounding: bool, key: jax.Array | None, axis: int
) -> None:
  """Raises before tracing anything heavy, with the shape/dtype and what would work."""
  if jnp.dtype(x.dtype) not in _ACCEPTED_DTYPES:
    raise TypeError(
        f"quantize: x has dtype {x.dtype}; NVFP4 quantizes floating-point input: bfloat16, float16 or float32."
    )
  min_rank = 2 if scaling is Scaling.TWO_D else 1
  if x.ndim < min_rank:
    raise ValueError(f"quantize: scaling='{scaling.value}' needs an input of rank >= {min_rank}, got shape {x.shape}.")
  if scaling is Scaling.TWO_D and axis % x.ndim != x.ndim - 1:
    raise ValueError(f"quantize: scaling='2d' tiles the last two axes; axis={axis} applies to 1D blocks only.")
  blocked_axes = range(x.ndim - 2, x.ndim) if scaling is Scaling.TWO_D else (axis % x.ndim,)
  for a in blocked_axes:
    if x.shape[a] % BLOCK_SIZE:
      where = "the last two axes" if min_rank == 2 else ("the last axis" if a == x.ndim - 1 else f"axis {a}")
      raise ValueError(
          f"quantize: shape {x.shape}, axis {a} (size {x.shape[a]}) must be a multiple of {BLOCK_SIZE}: "
          f"scaling='{scaling.value}' blocks {where} in groups of {BLOCK_SIZE}. Pad that axis or leave this "
          "tensor unquantized."
      )
  if stochastic_rounding and key is None:
    raise ValueError("quantize: stochastic_rounding=True needs a PRNG key (key=jax.random.key(...)); got key=None.")


def _abs_bits(x: jax.Array) -> tuple[jax.Array, int]:
  """|x| as unsigned integers of the same width, and the bit pattern of +inf.

  For non-negative IEEE values the integer order is the float order and every NaN sorts above +inf, so
  max over these integers is max |x| with NaN propagating, without widening x to f32 (the reductions
  then read x once, in its own width, and XLA:CPU vectorizes them).
  """
  finfo = jnp.finfo(x.dtype)
  uint = UINT_OF_WIDTH[x.dtype.itemsize]
  sign_clear = (1 << (finfo.bits - 1)) - 1
  inf_bits = int(np.array(np.inf, x.dtype).view(uint))
  return jax.lax.bitcast_convert_type(x, uint) & uint(sign_clear), inf_bits


def _from_abs_bits(bits: jax.Array, dtype: jnp.dtype) -> jax.Array:
  return jax.lax.bitcast_convert_type(bits, dtype).astype(jnp.float32)


def block_amax(blocks: jax.Array, axes: tuple[int, ...], nan_blocks_out: bool = False) -> tuple[jax.Array, jax.Array]:
  """Per block, over its `axes` (kept as size-1 axes), float32: (max |x| with a NaN propagating, max |x| ignoring
  NaN). One read of the blocks gives both: the first makes the block scales (a NaN block's scale is 448, and the
  GEMM operand forms mark it non-finite), the second the global amax (`global_amax`). Why not a global max that
  branches on NaN (lax.cond): a data-dependent conditional is a fusion barrier and a host round trip on a GPU.

  `nan_blocks_out` (the GEMM operand forms, where every value of a block holding a NaN is NaN): the second maximum is 0
  for such a block instead of the max of its other elements, made from the first, so one reduction gives both. Why:
  XLA:GPU fuses one reduction into the kernel that produces the operand (the SwiGLU product, a gradient), a
  multi-output fusion, and two sibling reductions it does not: they read the operand once more, 2.25 of the 11 bytes
  an element that making and quantizing h = silu(g) * u moved, 8.9 fused (tests/te/compile_test.py holds the fusion)."""
  bits, inf_bits = _abs_bits(blocks)
  axes = tuple(sorted(a % blocks.ndim for a in axes))
  kept = tuple(1 if d in axes else n for d, n in enumerate(blocks.shape))
  zero = bits.dtype.type(0)
  finite = jnp.where(bits > inf_bits, bits & zero, bits)  # not zeros_like: arithmetic.anchored

  def variadic(bits: jax.Array, finite: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jax.lax.reduce((bits, finite), (zero, zero),
                          lambda a, b: (jnp.maximum(a[0], b[0]), jnp.maximum(a[1], b[1])), axes)

  def siblings(bits: jax.Array, finite: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jax.lax.reduce(bits, zero, jax.lax.max, axes), jax.lax.reduce(finite, zero, jax.lax.max, axes)

  # Both maxima in one pass over the blocks either way, written for each compiler: XLA:CPU runs two reductions as
  # two passes, so it gets one variadic reduction, and so do blocks along any other axis than the last. But XLA:GPU
  # gives a variadic reduction over 16-element rows (1x16 blocks along the last axis) a warp per row, 8x the threads
  # (a 1x16 quantize of 8192^2 bf16 on an H200 took 0.83 ms against 0.39 ms before), and fuses two sibling
  # reductions of those rows into one vectorized kernel; for blocks across rows the variadic one fuses better.
  def first_only(bits: jax.Array, finite: jax.Array) -> tuple[jax.Array, jax.Array]:
    del finite
    first = jax.lax.reduce(bits, zero, jax.lax.max, axes)
    return first, first

  # nan_blocks_out: the NaN-free maximum is the maximum, or 0 for a block holding a NaN. XLA:GPU needs the one
  # reduction for that (above); XLA:CPU runs a single max reduction over 16 elements 3x slower than the variadic one
  # (2.1 against 0.7 ms for 2048^2 bf16), so there the variadic one gives both (a block's NaN-free max is its max
  # when it holds no NaN).
  if nan_blocks_out:
    first, finite_max = jax.lax.platform_dependent(bits, finite, cpu=variadic, default=first_only)
    both = first, jnp.where(first > inf_bits, first & zero, finite_max)
  elif axes == (blocks.ndim - 1,):
    both = jax.lax.platform_dependent(bits, finite, cpu=variadic, default=siblings)
  else:
    both = variadic(bits, finite)
  return tuple(_from_abs_bits(m.reshape(kept), blocks.dtype) for m in both)


def global_amax(nan_free_block_amaxes: jax.Array) -> jax.Array:
  """max |x| over the whole tensor as float32, ignoring NaN (module docstring), from the NaN-free block amaxes
  (`block_amax`): 1/16 of the elements, and max is exact in any order. Global when x is sharded."""
  return jnp.max(nan_free_block_amaxes).astype(jnp.float32)


def tensor_scales(amax: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(S_enc, S_dec) from the global amax, in the kernels' order: true divisions, FLT_MAX clamp, 0 -> 1."""
  s_enc = jnp.minimum(divide(TENSOR_SCALE_RANGE, amax), FLT_MAX)
  s_enc = jnp.where((amax == 0) | (s_enc == 0), np.float32(1.0), s_enc)
  return s_enc, divide(np.float32(1.0), s_enc)


def blocked(x: jax.Array, scaling: Scaling, axis: int) -> tuple[jax.Array, tuple[int, ...]]:
  """Views x with explicit block axes, and those axes: 1D along `axis` splits it into (n/16, 16) in place
  (the 16 is the block axis); 2D gives (..., M/16, 16, N/16, 16) over the last two axes (block axes -3, -1)."""
  if scaling is Scaling.ONE_D:
    axis %= x.ndim
    n = x.shape[axis]
    return x.reshape(*x.shape[:axis], n // BLOCK_SIZE, BLOCK_SIZE, *x.shape[axis + 1:]), (axis + 1,)
  *lead, m, n = x.shape
  return x.reshape(*lead, m // BLOCK_SIZE, BLOCK_SIZE, n // BLOCK_SIZE, BLOCK_SIZE), (-3, -1)


def _scale_elements(x: jax.Array, enc: jax.Array) -> jax.Array:
  """x * enc in float32, exact for subnormal x too (one IEEE multiply, as on the GPU).

  On a GPU that is the plain product (XLA:GPU keeps float32 subnormals: its xla_gpu_ftz is off by default). XLA:CPU
  flushes float32 subnormals to zero, so x * enc would give 0 where TE's kernel gives, for example,
  1e-39 * FLT_MAX = 0.34 -> E2M1 0.5 (a block whose scale underflowed to 0 has enc = FLT_MAX). On the CPU those
  elements' products are rebuilt from the integer mantissa m (x = m * 2**-149):
  (f32(m) * (enc * 2**-64)) * 2**-85 rounds once and then scales exactly whenever the result is normal, and
  a result below the normal range is 0 in E2M1 either way. enc >= 2**-62 whenever that matters. Why not the rebuild
  everywhere: ten operations an element, in passes a GPU runs bound by their instructions (docs/prediction.md).
  """
  x32 = widen(x)
  return jax.lax.platform_dependent(x32, enc, cpu=_scale_rebuilding_subnormals, default=jnp.multiply)


def _scale_rebuilding_subnormals(x32: jax.Array, enc: jax.Array) -> jax.Array:
  bits = jax.lax.bitcast_convert_type(x32, jnp.uint32)
  mantissa = bits & np.uint32(0x007FFFFF)
  subnormal = (bits & np.uint32(0x7F800000)) == 0
  rebuilt = (mantissa.astype(jnp.float32) * (enc * np.float32(2.0**-64))) * np.float32(2.0**-85)
  return jnp.where(subnormal, copysign(rebuilt, x32), x32 * enc)


def quantize(
    x: jax.Array,
    scaling: Scaling | str = "1d",
    rht: bool = False,
    stochastic_rounding: bool = False,
    key: jax.Array | None = None,
) -> Nvfp4Tensor:
  """Quantizes x to NVFP4 exactly as TransformerEngine's kernels do.

  Args:
    x: bfloat16/float16/float32 array, rank >= 1 (>= 2 for 2D scaling). Blocks run along the last axis
      (and the second-to-last for 2D); leading axes are batch. Widened to float32 exactly.
    scaling: "1d" (1x16 blocks) or "2d" (16x16 tiles over the last two axes).
    rht: apply the Random Hadamard Transform to each 16-run along the last axis first (bf16 result, TE's
      wgrad path); data, scale and amax then describe the transformed tensor.
    stochastic_rounding: round elements stochastically (TE's rule, rounding.py) instead of to nearest-even.
    key: PRNG key for stochastic rounding; the result is a deterministic function of (x, key).

  Returns:
    Nvfp4Tensor with float4_e2m1fn data, float8_e4m3fn scales and the float32 global amax.

  Raises:
    TypeError: x is not bfloat16/float16/float32.
    ValueError: a blocked axis is not a multiple of 16, the rank is too small, scaling is unknown, or
      stochastic rounding was asked for without a key.
  """
  x = jnp.asarray(x)
  scaling = Scaling(scaling)
  check_input(x, scaling, stochastic_rounding, key, -1)
  y, s8, _, amax = encode(x, scaling, rht, -1)
  # E2M1 codes on the bits, packed and bitcast: XLA:CPU's float4 conversion runs one scalar at a time.
  codes = rounding.stochastic_e2m1_codes(y, rounding.random_bits(key, y.shape)) if stochastic_rounding else e2m1_codes(y)
  data = pack_e2m1(codes.reshape(x.shape))
  # 2D: every row of a tile's 16 rows repeats the tile's scale, so scales are stored 1D-style.
  scale = s8 if scaling is Scaling.ONE_D else jnp.broadcast_to(s8, s8.shape[:-3] + (BLOCK_SIZE,) + s8.shape[-2:])
  scale = scale.reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE)
  return Nvfp4Tensor(data=data, scale=scale, amax=amax, scaling=scaling, rht=rht)


def encode(
    x: jax.Array, scaling: Scaling, rht: bool, axis: int, *, rht_signs: np.ndarray = hadamard.RHT_SIGNS,
    to_e4m3: Callable[[jax.Array], jax.Array] = to_e4m3_satfinite, amax: jax.Array | None = None,
    nan_blocks_out: bool = False, rht_order: hadamard.Order = hadamard.Order.EXACT,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Everything of quantize before the element rounding: (y on the E2M1 scale, blocked; e4m3 scales, blocked;
  block amaxes, blocked; global amax). 1D blocks run along `axis` (normalized), in place.

  `rht_signs` and `to_e4m3` are TE's by default; the self-check's faulty quantizers (its proof that it can fail)
  swap one of them. `amax` replaces the tensor's amax (the in-training audit quantizes with the amax TE used, which
  TE takes per data shard: MaxText.nvfp4.audit); nothing else passes these. `nan_blocks_out`: the GEMM operand forms'
  global amax (`block_amax`). `rht_order`: how the RHT adds (hadamard.Order; the fused backend's is PLATFORM)."""
  if rht:
    # bf16, as TE's RHT kernel writes it; the amax is the post-RHT amax.
    x = hadamard.rht(x, axis, rht_signs, order=rht_order)
  blocks, block_axes = blocked(x, scaling, axis)
  bamax, nan_free_bamax = block_amax(blocks, block_axes, nan_blocks_out)  # a NaN block -> FLT_MAX -> scale 448
  amax = global_amax(nan_free_bamax) if amax is None else amax
  s_enc, s_dec = tensor_scales(amax)
  s8 = to_e4m3(fmin_flt_max(bamax * (s_enc * ONE_SIXTH)))
  enc = fmin_flt_max(divide(np.float32(1.0), s8.astype(jnp.float32) * s_dec))  # s8 == 0 -> FLT_MAX
  return _scale_elements(blocks, enc), s8, bamax, amax


def dequantize(t: Nvfp4Tensor, dtype: jnp.dtype = jnp.float32) -> jax.Array:
  """Reconstructs x from t: e2m1 * (f32(s8) * (amax / 2688)) per block, then the inverse RHT if t.rht.

  The result is computed in float32 and cast to `dtype` once at the end.
  """
  blocks, _ = blocked(t.data.astype(jnp.float32), Scaling.ONE_D, t.data.ndim - 1)
  y = (blocks * (t.scale.astype(jnp.float32) * divide(t.amax, TENSOR_SCALE_RANGE))[..., None]).reshape(t.shape)
  if t.rht:
    y = hadamard.inverse_rht(y)
  return y.astype(dtype)
