# Copyright 2026 The NVFP4-for-MaxText Authors. Licensed under the Apache License, Version 2.0.
"""The NVFP4 GEMM: a dot_general with a custom VJP that follows NVFP4_SPEC.md §6 operand by operand.

For y = x W (x: M x K, W: K x N):
  fprop  y  = x  . W      x 1D along K, nearest;            W 2D 16x16 (or 1D along K), nearest
  dgrad  dx = dY . W^T    dY 1D along N, stochastic;        W the same 2D tiles (or 1D along N), nearest
  wgrad  dW = x^T . dY    x^T 1D along M, RHT, nearest;     dY^T 1D along M, RHT, stochastic
Each product is the f32 dot of the block-scaled operands (e2m1 * e4m3 scale, exact in f32) times
alpha = (amax_a / 2688) * (amax_b / 2688), as TE's GEMM computes it; outputs take the dtype of the operand
they are the gradient of (y: x's dtype). The residuals saved for the backward pass are the quantized
wgrad/dgrad operands, named "quantization" (checkpoint_name) for maxtext's remat policies.

The four parts, as in qwix's dot_general_qt: `nvfp4_dot_general` (public, any dimension numbers without
batch dims) -> `_matmul` (2D, custom_vjp) = `_matmul_fwd` + `_matmul_bwd`.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from MaxText.nvfp4.formats import BLOCK_SIZE, TENSOR_SCALE_RANGE
from MaxText.nvfp4.quantize import Scaling, quantize_block_scaled

#: checkpoint_name of every quantized tensor the backward pass keeps (maxtext's remat policies save it).
QUANTIZATION_NAME = "quantization"

DimensionNumbers = tuple[tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmRecipe:
  """The switches of NVIDIA's recipe that a run may ablate; the defaults are the recipe (te_nvfp4)."""

  rht: bool = True  # Random Hadamard Transform on the wgrad operands (te_nvfp4); False: te_nvfp4_no_rht.
  stochastic_rounding: bool = True  # SR on the output gradient dY (both copies); False: nearest-even.
  weight_2d: bool = True  # 16x16 weight tiles shared by fprop and dgrad; False: 1D blocks per GEMM.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BlockScaled:
  """A GEMM operand after quantization: e2m1 * e4m3 block scale (exact in f32), blocked along the last axis.

  The tensor scale is kept apart as amax, as TE's GEMM applies it once, in alpha.
  """

  values: jax.Array  # float32 (rows, C): the contracting axis C last
  amax: jax.Array  # float32 scalar


def _quantized(x: jax.Array, scaling: Scaling, rht: bool = False, key: jax.Array | None = None) -> BlockScaled:
  values, amax = quantize_block_scaled(x, scaling, rht=rht, stochastic_rounding=key is not None, key=key)
  return BlockScaled(values, amax)


def _nt_product(a: BlockScaled, b: BlockScaled) -> jax.Array:
  """a (P x C) times b (Q x C)^T, both blocked along C: f32 dot times alpha = amax_a/2688 * amax_b/2688."""
  dot = jax.lax.dot_general(a.values, b.values, (((1,), (1,)), ((), ())),
                            precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  return dot * ((a.amax / TENSOR_SCALE_RANGE) * (b.amax / TENSOR_SCALE_RANGE))


_Residuals = tuple[BlockScaled, BlockScaled, jax.Array | None]


def _matmul_fwd(
    x: jax.Array, w: jax.Array, key: jax.Array | None, recipe: GemmRecipe, w_dtype: jnp.dtype
) -> tuple[jax.Array, _Residuals]:
  """fprop, and the quantized operands the backward pass needs (x^T along M with RHT; W along N)."""
  del w_dtype  # static; the backward pass casts dW to it
  xq = _quantized(x, Scaling.ONE_D)  # (M, K) along K
  if recipe.weight_2d:
    wq_dgrad = _quantized(w, Scaling.TWO_D)  # (K, N): tiles shared by both orientations
    wq_fprop = BlockScaled(wq_dgrad.values.T, wq_dgrad.amax)  # (N, K): the forward sees the same weight
  else:
    wq_fprop = _quantized(w.T, Scaling.ONE_D)  # (N, K) along K
    wq_dgrad = _quantized(w, Scaling.ONE_D)  # (K, N) along N
  y = _nt_product(xq, wq_fprop).astype(x.dtype)
  xq_wgrad = _quantized(x.T, Scaling.ONE_D, rht=recipe.rht)  # (K, M) along M
  return y, (checkpoint_name(xq_wgrad, QUANTIZATION_NAME), checkpoint_name(wq_dgrad, QUANTIZATION_NAME), key)


def _matmul_bwd(
    recipe: GemmRecipe, w_dtype: jnp.dtype, residuals: _Residuals, dy: jax.Array
) -> tuple[jax.Array, jax.Array, None]:
  """dgrad dY . W^T and wgrad x^T . dY; dY is quantized twice (along N; along M with RHT), both with SR.

  dY has y's dtype, which is x's, so dx takes dy.dtype; dW takes the kernel's dtype (f32 master weights).
  """
  xq_wgrad, wq_dgrad, key = residuals
  key_dgrad, key_wgrad = jax.random.split(key) if recipe.stochastic_rounding else (None, None)
  dyq = _quantized(dy, Scaling.ONE_D, key=key_dgrad)  # (M, N) along N
  dx = _nt_product(dyq, wq_dgrad).astype(dy.dtype)  # (M, N) . (K, N)^T
  dyq_t = _quantized(dy.T, Scaling.ONE_D, rht=recipe.rht, key=key_wgrad)  # (N, M) along M
  dw = _nt_product(xq_wgrad, dyq_t).astype(w_dtype)  # (K, M) . (N, M)^T
  return dx, dw, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _matmul(x: jax.Array, w: jax.Array, key: jax.Array | None, recipe: GemmRecipe, w_dtype: jnp.dtype) -> jax.Array:
  return _matmul_fwd(x, w, key, recipe, w_dtype)[0]


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def _check_dims(
    lhs: jax.Array, rhs: jax.Array, dimension_numbers: DimensionNumbers
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
  """Normalized contracting dims and K, after checking M, K and N are multiples of the block."""
  (lhs_c, rhs_c), (lhs_b, rhs_b) = dimension_numbers
  if lhs_b or rhs_b:
    raise NotImplementedError(
        f"nvfp4_dot_general: batch dimensions {dimension_numbers[1]} are not supported (DenseGeneral passes none); "
        "leave this GEMM unquantized."
    )
  lhs_c = tuple(d % lhs.ndim for d in lhs_c)
  rhs_c = tuple(d % rhs.ndim for d in rhs_c)
  k = int(np.prod([lhs.shape[d] for d in lhs_c]))
  m = lhs.size // max(k, 1)
  n = rhs.size // max(k, 1)
  for name, size in (("M (tokens: lhs free dims)", m), ("K (contracting)", k), ("N (rhs free dims)", n)):
    if size % BLOCK_SIZE:
      raise ValueError(
          f"nvfp4_dot_general: lhs {lhs.shape} x rhs {rhs.shape} with contracting dims {lhs_c}/{rhs_c} gives "
          f"{name} = {size}, not a multiple of {BLOCK_SIZE}: NVFP4 blocks every GEMM axis by {BLOCK_SIZE}."
      )
  return lhs_c, rhs_c, k


def nvfp4_dot_general(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers: DimensionNumbers,
    *,
    key: jax.Array | None,
    recipe: GemmRecipe = GemmRecipe(),
) -> jax.Array:
  """`jax.lax.dot_general` for y = lhs . rhs with NVFP4 operands in fprop, dgrad and wgrad.

  Args:
    lhs: activations, e.g. (batch, seq, embed); any float dtype; the output takes its dtype.
    rhs: the kernel, e.g. (embed, mlp) or fused (embed, num_activations, mlp); its gradient takes its dtype.
    dimension_numbers: ((lhs_contracting, rhs_contracting), ((), ())), as DenseGeneral passes.
    key: PRNG key for the stochastic rounding of this call's output gradient (None only without SR).
    recipe: the recipe switches.

  Returns:
    lhs free dims + rhs free dims, as jax.lax.dot_general orders them.

  Raises:
    NotImplementedError: batch dimensions.
    ValueError: M (product of lhs free dims), K or N not a multiple of 16.
  """
  lhs_c, rhs_c, k = _check_dims(lhs, rhs, dimension_numbers)
  if recipe.stochastic_rounding and key is None:
    raise ValueError("nvfp4_dot_general: recipe.stochastic_rounding=True needs a PRNG key; got key=None.")
  lhs_free = [d for d in range(lhs.ndim) if d not in lhs_c]
  rhs_free = [d for d in range(rhs.ndim) if d not in rhs_c]
  out_shape = tuple(lhs.shape[d] for d in lhs_free) + tuple(rhs.shape[d] for d in rhs_free)
  x = jnp.transpose(lhs, lhs_free + list(lhs_c)).reshape(-1, k)
  w = jnp.transpose(rhs, list(rhs_c) + rhs_free).reshape(k, -1)
  return _matmul(x, w, key, recipe, jnp.dtype(rhs.dtype)).reshape(out_shape)
