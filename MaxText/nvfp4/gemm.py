# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The NVFP4 GEMM: a dot_general with a custom VJP that follows docs/numerics.md#which-operand-gets-what operand by operand.

For y = x W (x: M x K, W: K x N):
  fprop  y  = x  . W      x 1D along K, nearest;            W 2D 16x16 (or 1D along K), nearest
  dgrad  dx = dY . W^T    dY 1D along N, stochastic;        W the same 2D tiles (or 1D along N), nearest
  wgrad  dW = x^T . dY    x^T 1D along M, RHT, nearest;     dY^T 1D along M, RHT, stochastic
Each product is the f32-accumulated dot of the block-scaled operands (e2m1 * e4m3 scale, exact in bf16) times
alpha = (amax_a / 2688) * (amax_b / 2688), as TE's GEMM computes it; outputs take the dtype of the operand
they are the gradient of (y: x's dtype). No operand is transposed to be quantized: x^T and dY^T are x and dY
blocked along axis 0 (M), and W's 2D tiles serve fprop and dgrad in W's own layout. A block of any operand that
holds a NaN or Inf enters its GEMM as NaN, so a non-finite input gives a non-finite output (quantize.py).
The residuals saved for the backward pass are the quantized wgrad/dgrad operands, named "quantization"
(checkpoint_name) for maxtext's remat policies.

The four parts, as in qwix's dot_general_qt: `nvfp4_dot_general` (public, any dimension numbers without
batch dims) -> `_matmul` (custom_vjp on lhs and rhs as given) = `_matmul_fwd` + `_matmul_bwd`, both built from
`Nvfp4Matmul`: one GEMM's layout (`_Layout` maps lhs and rhs onto the 2D x . W and the gradients back) and recipe,
with its three parts public: `residuals` (the quantized operands the backward keeps), `fprop` and `backward`, and
`forward`, the output alone, which the custom VJP's primal runs where nothing is differentiated. A
caller composing its own VJP around the GEMM (the training pipeline's forward-only switch, MaxText.backends) uses
those parts; the numerics hold no training policy of their own.
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from MaxText.nvfp4 import hadamard
from MaxText.nvfp4.arithmetic import divide
from MaxText.nvfp4.block_scaled import BlockCodes, quantize_block_scaled, quantize_codes
from MaxText.nvfp4.formats import BLOCK_SIZE, NVFP4, BlockFormat
from MaxText.nvfp4.quantize import Scaling

#: checkpoint_name of every quantized tensor the backward pass keeps (maxtext's remat policies save it).
QUANTIZATION_NAME = "quantization"

DimensionNumbers = tuple[tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]]

#: The plain GEMM x (rows, K) . w (K, N): x's last axis contracted with w's first, no batch dims. Every caller that
#: multiplies two matrices (one expert's GEMM, the self-check's) passes these.
MATMUL_DIMS: DimensionNumbers = (((1,), (0,)), ((), ()))


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmRecipe:
  """The block format and the switches of NVIDIA's recipe that a run may ablate; the defaults are the recipe
  (te_nvfp4)."""

  rht: bool = True  # Random Hadamard Transform on the wgrad operands (te_nvfp4); False: te_nvfp4_no_rht.
  stochastic_rounding: bool = True  # SR on the output gradient dY (both copies); False: nearest-even.
  weight_2d: bool = True  # 16x16 weight tiles shared by fprop and dgrad; False: 1D blocks per GEMM.
  format: BlockFormat = NVFP4  # the block format every operand is quantized to

  def __post_init__(self) -> None:
    # The quantizer's element rounding and scale rule are NVFP4's (quantize.py reads the NVFP4 object), so another
    # format would be quantized as NVFP4 while the GEMM scaled it as itself: refused until the quantizer takes it.
    if self.format != NVFP4:
      raise NotImplementedError(f"GemmRecipe: format {self.format.name!r}: the quantizer implements {NVFP4.name} only.")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BlockScaled:
  """A GEMM operand after quantization: e2m1 * e4m3 block scale (exact in bf16), in the operand's own layout.

  The tensor scale is kept apart as amax, as TE's GEMM applies it once, in alpha. The blocks run along the
  GEMM's contracting axis, which need not be the last: x^T and dY^T of the wgrad GEMM are x and dY blocked
  along axis 0 (M), so neither is ever transposed.
  """

  values: jax.Array  # bfloat16, 2D
  amax: jax.Array  # float32 scalar


Quantized = BlockScaled | BlockCodes

#: A block-scaled GEMM: (a, the axis of a it contracts, b, the axis of b it contracts, the output dtype) -> the product
#: with the tensor scales applied (alpha), accumulated in f32 and rounded once to the output dtype, a's free axis
#: first. The GEMM writes that dtype itself (a bf16 output is never an f32 array cast afterwards).
#: `scaled_matmul_gemm` is jax's; a backend may bring another (TransformerEngine's cuBLASLt NVFP4 GEMM,
#: MaxText.backends.te_gemm) on the same operands.
BlockScaledGemm = Callable[[BlockCodes, int, BlockCodes, int, jnp.dtype], jax.Array]


def scaled_matmul_gemm(a: BlockCodes, a_axis: int, b: BlockCodes, b_axis: int, out_dtype: jnp.dtype) -> jax.Array:
  """`jax.nn.scaled_matmul` on the codes and scales laid out K-last, times alpha = amax_a/2688 * amax_b/2688."""
  (a_codes, a_scales), (b_codes, b_scales) = a.contracting(a_axis), b.contracting(b_axis)
  dot = jax.nn.scaled_matmul(a_codes[None], b_codes[None], a_scales[None], b_scales[None],
                             preferred_element_type=jnp.float32)[0]
  return (dot * _alpha(a.amax, b.amax, NVFP4)).astype(out_dtype)


def _alpha(a_amax: jax.Array, b_amax: jax.Array, fmt: BlockFormat) -> jax.Array:
  """The product's tensor scale, alpha = amax_a / range * amax_b / range (range = 2688 for NVFP4), as TE's GEMM
  computes it: each factor a correctly rounded division (arithmetic.divide)."""
  return divide(a_amax, fmt.tensor_scale_range) * divide(b_amax, fmt.tensor_scale_range)


def _quantized(
    x: jax.Array, scaling: Scaling, rht: bool = False, key: jax.Array | None = None, axis: int = -1,
    block_gemm: BlockScaledGemm | None = None,
) -> Quantized:
  """x quantized as the GEMM that multiplies it takes it: codes and scales for a block-scaled GEMM, else bf16 values
  (e2m1 * e4m3 scale, exact) for the dot on dequantized operands. The same quantization either way, bit for bit, but
  for the RHT: the block-scaled GEMM's (the fused backend's) takes it in a fixed pairwise order on a GPU, as TE's
  takes it in its tensor cores' (hadamard.Order.PLATFORM; exact on CPU), docs/numerics.md#the-fused-backends-rht."""
  if block_gemm is not None:
    return quantize_codes(x, scaling, rht=rht, stochastic_rounding=key is not None, key=key, axis=axis,
                          rht_order=hadamard.Order.PLATFORM)
  values, amax = quantize_block_scaled(x, scaling, rht=rht, stochastic_rounding=key is not None, key=key,
                                       axis=axis)
  return BlockScaled(values, amax)


def _product(a: Quantized, b: Quantized, contracting: tuple[int, int], fmt: BlockFormat, out_dtype: jnp.dtype,
             block_gemm: BlockScaledGemm | None) -> jax.Array:
  """a . b contracting axis contracting[0] of a with contracting[1] of b: f32 dot times alpha, as `out_dtype`.

  alpha = amax_a/2688 * amax_b/2688. The operands are bf16 and exact, their products exact in f32, and the dot
  accumulates in f32 (preferred_element_type), as the FP4 tensor-core GEMM does: the same numbers as an f32
  dot of the same values at Precision.HIGHEST, at bf16 matmul speed. Codes and scales (`BlockCodes`) go to a
  block-scaled GEMM instead (`block_gemm`: a's free axis first, then b's, as dot_general orders them).
  """
  if block_gemm is not None:
    return block_gemm(a, contracting[0], b, contracting[1], out_dtype)
  alpha = _alpha(a.amax, b.amax, fmt)
  a_values, a_axis = (a.values, contracting[0]) if contracting[0] == 1 else (_transposed(a.values), 1)
  dot = jax.lax.dot_general(a_values, b.values, (((a_axis,), (contracting[1],)), ((), ())),
                            preferred_element_type=jnp.float32)
  return (dot * alpha).astype(out_dtype)


def _transposed(a: jax.Array) -> jax.Array:
  """a^T (2D), written out on the CPU. Why: XLA:CPU runs a bf16 dot in its fast library kernel (YNNPACK) only when
  the lhs contracts its last axis in memory; given x^T . dY (the wgrad GEMM, both contracting axis 0) it converts
  both operands to f32 and runs another dot, twice as slow. A plain transpose becomes a layout change, which takes
  the same slow dot; a transpose by way of a 3D reshape is a real copy, then the fast dot (scripts/bench_gemm.py,
  te_nvfp4 at 2048^3: 1.12x -> 0.91x of bf16). The same sums in another order: the products are exact and accumulate
  in f32 either way. Elsewhere (a GPU's dot takes either layout) the plain transpose."""
  rows, cols = a.shape  # rows: M, a multiple of the block (_check_dims)
  def written_out(v: jax.Array) -> jax.Array:
    return jnp.transpose(v.reshape(rows // BLOCK_SIZE, BLOCK_SIZE, cols), (2, 0, 1)).reshape(cols, rows)
  return jax.lax.platform_dependent(a, cpu=written_out, default=jnp.transpose)


@dataclasses.dataclass(frozen=True)
class _Layout:
  """How lhs and rhs map onto the 2D GEMM x (M x K) . w (K x N) and back; static (hashable) for custom_vjp."""

  dimension_numbers: DimensionNumbers
  lhs_shape: tuple[int, ...]
  rhs_shape: tuple[int, ...]
  lhs_perm: tuple[int, ...]  # lhs free dims, then its contracting dims
  rhs_perm: tuple[int, ...]  # rhs contracting dims, then its free dims
  k: int
  w_dtype: jnp.dtype  # dW takes the kernel's dtype (f32 master weights)

  @property
  def n(self) -> int:
    """N: the product of rhs's free dims."""
    return int(np.prod(self.rhs_shape)) // self.k

  @property
  def out_shape(self) -> tuple[int, ...]:
    """lhs free dims + rhs free dims, as jax.lax.dot_general orders them."""
    n_contracting = len(self.dimension_numbers[0][0])
    return (tuple(self.lhs_shape[d] for d in self.lhs_perm[:len(self.lhs_shape) - n_contracting])
            + tuple(self.rhs_shape[d] for d in self.rhs_perm[n_contracting:]))

  def matrices(self, lhs: jax.Array, rhs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(x, w) = lhs as (M, K), rhs as (K, N)."""
    return (jnp.transpose(lhs, self.lhs_perm).reshape(-1, self.k),
            jnp.transpose(rhs, self.rhs_perm).reshape(self.k, -1))

  def unmatrices(self, dx: jax.Array, dw: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The inverse of `matrices` (exact: a reshape and a transpose), for the gradients."""
    dx = jnp.transpose(dx.reshape([self.lhs_shape[d] for d in self.lhs_perm]), np.argsort(self.lhs_perm))
    dw = jnp.transpose(dw.reshape([self.rhs_shape[d] for d in self.rhs_perm]), np.argsort(self.rhs_perm))
    return dx, dw


_Residuals = tuple[Quantized, Quantized, jax.Array | None]


def _fprop_nvfp4(x: jax.Array, wq_dgrad: Quantized | None, w: jax.Array, recipe: GemmRecipe,
                 block_gemm: BlockScaledGemm | None) -> jax.Array:
  """y = x . W on NVFP4 operands: x 1D along K; W the dgrad copy's 2D tiles (quantized here when `wq_dgrad` is
  None), or 1D along K."""
  xq = _quantized(x, Scaling.ONE_D, block_gemm=block_gemm)  # (M, K) along K
  # 2D: the tiles serve both orientations, so the forward sees the same weight as dgrad.
  if recipe.weight_2d:
    wq_fprop = _quantized(w, Scaling.TWO_D, block_gemm=block_gemm) if wq_dgrad is None else wq_dgrad
  else:
    wq_fprop = _quantized(w, Scaling.ONE_D, axis=0, block_gemm=block_gemm)  # (K, N) along K
  return _product(xq, wq_fprop, (1, 0), recipe.format, x.dtype, block_gemm)


@dataclasses.dataclass(frozen=True)
class Nvfp4Matmul:
  """One NVFP4 GEMM y = lhs . rhs (a layout and a recipe; static, hashable) as its three VJP parts.

  residuals(lhs, rhs, key): the quantized operands the backward needs: x^T along M (RHT where the recipe applies it)
    and W along N (the 2D tiles fprop shares), with the stochastic-rounding key; named "quantization" for remat.
  fprop(lhs, rhs, residuals): the forward GEMM; x is quantized along K here, W comes from the residuals (2D).
  backward(residuals, dy): (dlhs, drhs); dY is quantized twice (along N; along M with RHT), both with SR.
  """

  layout: _Layout
  recipe: GemmRecipe
  # None: the emulated backend's f32-accumulated dot on dequantized bf16 operands (any hardware); a block-scaled GEMM
  # (BlockScaledGemm: jax.nn.scaled_matmul, TE's): the fused backend's, on codes and scales. The same quantization.
  block_gemm: BlockScaledGemm | None = None

  def residuals(self, lhs: jax.Array, rhs: jax.Array, key: jax.Array | None) -> _Residuals:
    x, w = self.layout.matrices(lhs, rhs)
    wq_dgrad = _quantized(w, Scaling.TWO_D if self.recipe.weight_2d else Scaling.ONE_D,
                          block_gemm=self.block_gemm)  # (K, N): along N
    xq_wgrad = _quantized(x, Scaling.ONE_D, rht=self.recipe.rht, axis=0,
                          block_gemm=self.block_gemm)  # x^T along M: (M, K) blocked along 0
    return checkpoint_name(xq_wgrad, QUANTIZATION_NAME), checkpoint_name(wq_dgrad, QUANTIZATION_NAME), key

  def fprop(self, lhs: jax.Array, rhs: jax.Array, residuals: _Residuals) -> jax.Array:
    x, w = self.layout.matrices(lhs, rhs)
    return _fprop_nvfp4(x, residuals[1], w, self.recipe, self.block_gemm).reshape(self.layout.out_shape)

  def forward(self, lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    """fprop where no backward follows (a model's initialization, evaluation, the primal of the custom VJP): the
    same output, without quantizing what only the backward reads (x^T with RHT; W's dgrad copy where the forward
    does not share it). Why: every operation traced costs trace and compile time; maxtext builds a model several
    times before it trains (abstract shapes, initialization), each build calling every GEMM once."""
    x, w = self.layout.matrices(lhs, rhs)
    return _fprop_nvfp4(x, None, w, self.recipe, self.block_gemm).reshape(self.layout.out_shape)

  def backward(self, residuals: _Residuals, dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    """dY has y's dtype, which is lhs's, so dx takes dy.dtype; dW takes the kernel's dtype (f32 master weights)."""
    xq_wgrad, wq_dgrad, key = residuals
    dy = dy.reshape(-1, self.layout.n)  # (M, N)
    key_dgrad, key_wgrad = jax.random.split(key) if self.recipe.stochastic_rounding else (None, None)
    dyq = _quantized(dy, Scaling.ONE_D, key=key_dgrad, block_gemm=self.block_gemm)  # (M, N) along N
    dx = _product(dyq, wq_dgrad, (1, 1), self.recipe.format, dy.dtype, self.block_gemm)  # (M, N) . (K, N)^T
    dyq_t = _quantized(dy, Scaling.ONE_D, rht=self.recipe.rht, key=key_wgrad, axis=0,
                       block_gemm=self.block_gemm)  # dY^T along M, in place
    # (M, K)^T . (M, N)
    dw = _product(xq_wgrad, dyq_t, (0, 0), self.recipe.format, self.layout.w_dtype, self.block_gemm)
    return self.layout.unmatrices(dx, dw)


def _matmul_fwd(lhs: jax.Array, rhs: jax.Array, key: jax.Array | None,
                gemm: Nvfp4Matmul) -> tuple[jax.Array, _Residuals]:
  residuals = gemm.residuals(lhs, rhs, key)
  return gemm.fprop(lhs, rhs, residuals), residuals


def _matmul_bwd(gemm: Nvfp4Matmul, residuals: _Residuals, dy: jax.Array) -> tuple[jax.Array, jax.Array, None]:
  return (*gemm.backward(residuals, dy), None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _matmul(lhs: jax.Array, rhs: jax.Array, key: jax.Array | None, gemm: Nvfp4Matmul) -> jax.Array:
  del key  # only the backward rounds stochastically
  return gemm.forward(lhs, rhs)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def _check_dims(
    lhs: jax.Array, rhs: jax.Array, dimension_numbers: DimensionNumbers, block: int
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
    if size % block:
      raise ValueError(
          f"nvfp4_dot_general: lhs {lhs.shape} x rhs {rhs.shape} with contracting dims {lhs_c}/{rhs_c} gives "
          f"{name} = {size}, not a multiple of {block}: NVFP4 blocks every GEMM axis by {block}."
      )
  return lhs_c, rhs_c, k


def as_matrices(lhs: jax.Array, rhs: jax.Array, dimension_numbers: DimensionNumbers,
                fmt: BlockFormat = NVFP4) -> tuple[jax.Array, jax.Array]:
  """(x, w): lhs as the (M, K) and rhs as the (K, N) matrix that nvfp4_dot_general quantizes (after its checks)."""
  lhs_c, rhs_c, k = _check_dims(lhs, rhs, dimension_numbers, fmt.block_size)
  lhs_perm = tuple(d for d in range(lhs.ndim) if d not in lhs_c) + lhs_c
  rhs_perm = rhs_c + tuple(d for d in range(rhs.ndim) if d not in rhs_c)
  return jnp.transpose(lhs, lhs_perm).reshape(-1, k), jnp.transpose(rhs, rhs_perm).reshape(k, -1)


def nvfp4_matmul(lhs: jax.Array, rhs: jax.Array, dimension_numbers: DimensionNumbers,
                 recipe: GemmRecipe = GemmRecipe(), block_gemm: BlockScaledGemm | None = None) -> Nvfp4Matmul:
  """The NVFP4 GEMM of lhs . rhs as its VJP parts, after checking the dims (see nvfp4_dot_general)."""
  lhs_c, rhs_c, k = _check_dims(lhs, rhs, dimension_numbers, recipe.format.block_size)
  lhs_free = tuple(d for d in range(lhs.ndim) if d not in lhs_c)
  rhs_free = tuple(d for d in range(rhs.ndim) if d not in rhs_c)
  layout = _Layout(dimension_numbers=((lhs_c, rhs_c), ((), ())), lhs_shape=tuple(lhs.shape),
                   rhs_shape=tuple(rhs.shape), lhs_perm=lhs_free + lhs_c, rhs_perm=rhs_c + rhs_free, k=k,
                   w_dtype=jnp.dtype(rhs.dtype))
  return Nvfp4Matmul(layout, recipe, block_gemm)


def nvfp4_dot_general(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers: DimensionNumbers,
    *,
    key: jax.Array | None,
    recipe: GemmRecipe = GemmRecipe(),
    block_gemm: BlockScaledGemm | None = None,
) -> jax.Array:
  """`jax.lax.dot_general` for y = lhs . rhs with NVFP4 operands in fprop, dgrad and wgrad.

  Args:
    lhs: activations, e.g. (batch, seq, embed); any float dtype; the output takes its dtype.
    rhs: the kernel, e.g. (embed, mlp) or fused (embed, num_activations, mlp); its gradient takes its dtype.
    dimension_numbers: ((lhs_contracting, rhs_contracting), ((), ())), as DenseGeneral passes.
    key: PRNG key for the stochastic rounding of this call's output gradient (None only without SR).
    recipe: the recipe switches.
    block_gemm: how the quantized operands are multiplied (the quantization is the same): None for an f32 dot of
      their dequantized bf16 values (the emulated backend), or a block-scaled GEMM on codes and scales
      (`BlockScaledGemm`: `scaled_matmul_gemm`, TE's; the fused backend).

  Returns:
    lhs free dims + rhs free dims, as jax.lax.dot_general orders them.

  Raises:
    NotImplementedError: batch dimensions.
    ValueError: M (product of lhs free dims), K or N not a multiple of 16; stochastic rounding without a key.
  """
  gemm = nvfp4_matmul(lhs, rhs, dimension_numbers, recipe, block_gemm)
  if recipe.stochastic_rounding and key is None:
    raise ValueError("nvfp4_dot_general: recipe.stochastic_rounding=True needs a PRNG key; got key=None.")
  return _matmul(lhs, rhs, key, gemm)
