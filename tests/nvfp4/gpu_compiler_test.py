# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The emulation's numbers do not depend on the liberties XLA's GPU compiler takes (docs/numerics.md#on-a-gpu).

On a GPU, XLA (1) removes a narrowing cast followed by the widening one (xla_allow_excess_precision, on by default),
so `x.astype(e4m3).astype(f32)` rounds nothing, and (2) divides with a fast division that can be an ulp off. XLA:CPU
does neither, so every other test here passes on CPU whatever the code relies on; on an H200 the quantizer's bit-exact
tests failed by the dozen until the rounding and the divisions were made explicit. (3) Every platform's dot sums in
its own order, and a float32 sum of terms spanning a wide range rounds differently in each.

This file runs each function through a jaxpr interpreter that takes these liberties on the CPU: it drops every
narrowing-then-widening cast pair (also across reshapes, broadcasts and transposes, and into nested jits), moves
every float division's result one ulp up or down (by element parity), and, for the quantized operands (which are
exact, where GEMM outputs are not), sums every dot in the reverse order. The outputs must equal the same op-by-op run
without them, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.extend  # noqa: F401  (jax.extend.core.Literal: the jaxpr literals)
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.nvfp4 import arithmetic, audit, hadamard, stats
from MaxText.nvfp4.block_scaled import quantize_block_scaled, quantize_codes
from MaxText.nvfp4.gemm import MATMUL_DIMS, GemmRecipe, nvfp4_dot_general, scaled_matmul_gemm
from MaxText.nvfp4.grouped import grouped_matmul
from MaxText.nvfp4.operands import gemm_operands
from MaxText.nvfp4.quantize import quantize


@pytest.fixture(autouse=True)
def _on_cpu_only() -> None:
  """The reference side is XLA:CPU's own arithmetic (exact casts, exact division); on a GPU it is not, and the
  quantizer's bit-exact tests there say directly what this file says on the CPU."""
  if jax.default_backend() != "cpu":
    pytest.skip("compares against XLA:CPU's exact arithmetic; on a GPU the bit-exact tests run as they are")


#: Ops a narrowed value passes through with its float32 original still at hand, as XLA moves casts across them.
_LAYOUT = {"reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims"}


def _narrowing(old: Any, new: Any) -> bool:
  return (jnp.issubdtype(old, jnp.floating) and jnp.issubdtype(new, jnp.floating)
          and jnp.dtype(new).itemsize < jnp.dtype(old).itemsize)


def _off_by_an_ulp(q: jax.Array) -> jax.Array:
  """q one ulp up at even flat positions and down at odd ones, where q is finite and not zero."""
  if q.dtype != jnp.float32:
    return q
  parity = (jnp.arange(q.size).reshape(q.shape) % 2) == 0
  moved = jnp.where(parity, jnp.nextafter(q, np.float32(np.inf)), jnp.nextafter(q, np.float32(-np.inf)))
  return jnp.where(jnp.isfinite(q) & (q != 0), moved, q)


def _reversed_contraction(values: list[Any], params: dict[str, Any]) -> list[Any]:
  """dot_general's operands with their contracting axes reversed: the same product, summed in the reverse order."""
  (lhs_axes, rhs_axes), _ = params["dimension_numbers"]
  return [jax.lax.rev(values[0], tuple(lhs_axes)), jax.lax.rev(values[1], tuple(rhs_axes)), *values[2:]]


def _eval(jaxpr: Any, consts: list[Any], args: list[tuple[Any, Any]], gpu: bool,
          reorder_dots: bool = False) -> list[tuple[Any, Any]]:
  """Evaluates `jaxpr` op by op on (value, wide original or None) pairs; with `gpu`, taking the GPU compiler's
  liberties and its branch of lax.platform_dependent, and with `reorder_dots` summing every dot in reverse. Returns
  the outputs as pairs."""
  env: dict[Any, tuple[Any, Any]] = {}

  def read(v: Any) -> tuple[Any, Any]:
    return (v.val, None) if isinstance(v, jax.extend.core.Literal) else env[v]

  for var, const in zip(jaxpr.constvars, consts):
    env[var] = (const, None)
  for var, arg in zip(jaxpr.invars, args):
    env[var] = arg
  for eqn in jaxpr.eqns:
    pairs = [read(v) for v in eqn.invars]
    values = [p[0] for p in pairs]
    name, params = eqn.primitive.name, eqn.params
    wides: list[Any] = [None] * len(eqn.outvars)
    if name in ("pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call", "custom_vjp_call"):
      sub = params.get("jaxpr", params.get("call_jaxpr"))
      sub_jaxpr, sub_consts = (sub.jaxpr, sub.consts) if hasattr(sub, "consts") else (sub, [])
      out = _eval(sub_jaxpr, sub_consts, pairs[:len(sub_jaxpr.invars)], gpu, reorder_dots)
      for var, pair in zip(eqn.outvars, out):
        env[var] = pair
      continue
    if name == "platform_index":  # lax.platform_dependent: take the branch a GPU takes (cuda's, else the default)
      platforms = params["platforms"]
      index = next((i for i, p in enumerate(platforms) if p is not None and ("cuda" if gpu else "cpu") in p),
                   next(i for i, p in enumerate(platforms) if p is None))
      env[eqn.outvars[0]] = (jnp.int32(index), None)
      continue
    if name == "cond":
      branch = params["branches"][int(values[0])]
      out = _eval(branch.jaxpr, branch.consts, pairs[1:], gpu, reorder_dots)
      for var, pair in zip(eqn.outvars, out):
        env[var] = pair
      continue
    if reorder_dots and name == "dot_general":
      values = _reversed_contraction(values, params)
    outs = eqn.primitive.bind(*values, **params)
    outs = list(outs) if eqn.primitive.multiple_results else [outs]
    if gpu and name == "convert_element_type":
      (value, wide), new = pairs[0], params["new_dtype"]
      if _narrowing(value.dtype, new) and value.dtype == jnp.float32:
        wides = [value]  # the float32 value the GPU may keep instead of the narrow one
      elif wide is not None and jnp.dtype(new) == jnp.float32:
        outs = [wide]  # narrowing then widening: the pair is gone
    elif gpu and name in _LAYOUT and pairs[0][1] is not None:
      wides = [eqn.primitive.bind(pairs[0][1], *values[1:], **params)]
    elif gpu and name == "div" and jnp.issubdtype(outs[0].dtype, jnp.floating):
      outs = [_off_by_an_ulp(outs[0])]
    for var, out, wide in zip(eqn.outvars, outs, wides):
      env[var] = (out, wide)
  return [read(v) for v in jaxpr.outvars]


def op_by_op(f: Callable[..., Any], gpu: bool = True, reorder_dots: bool = False) -> Callable[..., Any]:
  """f evaluated one op at a time on the CPU; with `gpu`, as XLA's GPU compiler may: cast pairs dropped, divisions
  an ulp off; with `reorder_dots`, every dot summed in reverse. Both sides of a comparison run op by op, so that the
  CPU's own fusion choices do not count as a difference."""

  def run(*args: Any) -> Any:
    closed, shape = jax.make_jaxpr(f, return_shape=True)(*args)
    flat = jax.tree.leaves(args)
    out = _eval(closed.jaxpr, closed.consts, [(jnp.asarray(a), None) for a in flat], gpu, reorder_dots)
    return jax.tree.unflatten(jax.tree.structure(shape), [o[0] for o in out])

  return run


def gpu_like(f: Callable[..., Any]) -> Callable[..., Any]:
  return op_by_op(f, gpu=True)


def gpu_like_reordered(f: Callable[..., Any]) -> Callable[..., Any]:
  """gpu_like with the third liberty: every dot summed in another order (for quantized operands, which must not
  depend on it)."""
  return op_by_op(f, gpu=True, reorder_dots=True)


def cpu(f: Callable[..., Any]) -> Callable[..., Any]:
  return op_by_op(f, gpu=False)


def _assert_same(got: Any, want: Any) -> None:
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    g, w = np.asarray(g), np.asarray(w)
    assert g.dtype == w.dtype and g.shape == w.shape
    bits = f"u{g.dtype.itemsize}"
    differ = np.flatnonzero(g.view(bits) != w.view(bits))
    assert differ.size == 0, f"{differ.size} of {g.size} values differ, first {g.flat[differ[0]]} vs {w.flat[differ[0]]}"


def _activations(seed: int, shape: tuple[int, ...]) -> jax.Array:
  """float32 values of mixed magnitudes, many of them on ties once in bf16 (short mantissas)."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(shape) * 10.0 ** rng.integers(-4, 3, (shape[0], 1))
  x[::3] = np.round(x[::3] * 8) / 8
  return jnp.asarray(x, jnp.float32)


def test_the_interpreter_takes_both_liberties():
  """The check can fail: a plain cast pair rounds nothing under it, and a division moves."""
  v = jnp.asarray([1.0 + 2.0**-10, 3.0], jnp.float32)
  pair = gpu_like(lambda v: v.astype(jnp.float8_e4m3fn).astype(jnp.float32))(v)
  np.testing.assert_array_equal(pair, v)
  q = gpu_like(lambda a, b: a / b)(jnp.float32(1.0), jnp.float32(3.0))
  assert q != np.float32(1.0) / np.float32(3.0)
  np.testing.assert_array_equal(gpu_like(arithmetic.divide)(jnp.float32(1.0), jnp.float32(3.0)), np.float32(1 / 3))


def _wide_runs(seed: int, shape: tuple[int, ...]) -> jax.Array:
  """bf16 values where half are 1e-8..1e-5 beside values near 1 (the self-check's tiny_blocks): 16-element runs whose
  f32 sums round, each order to its own bf16 value on some outputs."""
  rng = np.random.default_rng(seed)
  tiny = np.where(rng.uniform(size=shape) < 0.5, 10.0 ** rng.uniform(-8, -5, shape), 1.0)
  return jnp.asarray(rng.standard_normal(shape) * tiny, jnp.bfloat16)


def test_the_interpreter_reorders_a_dots_sum():
  """The third liberty bites: an RHT written as a dot (what ours was) over wide runs gives other bf16 outputs summed
  in reverse; ours (hadamard.rht) does not."""
  x = _wide_runs(0, (64, 128))
  matrix = jnp.asarray(hadamard.rht_matrix(), jnp.bfloat16)

  def as_a_dot(x):
    runs = x.reshape(4, 16, 128)
    return jnp.einsum("bij,bjq->biq", jnp.broadcast_to(matrix.T, (4, 16, 16)), runs,
                      preferred_element_type=jnp.float32).astype(jnp.bfloat16)

  differ = np.asarray(gpu_like_reordered(as_a_dot)(x)).view(np.uint16) != np.asarray(cpu(as_a_dot)(x)).view(np.uint16)
  assert differ.any()
  _assert_same(gpu_like_reordered(lambda x: hadamard.rht(x, 0))(x), cpu(lambda x: hadamard.rht(x, 0))(x))


@pytest.mark.parametrize("scaling,rht", [("1d", False), ("2d", False), ("1d", True)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_quantize_is_the_same_under_the_gpu_compiler(scaling, rht, dtype):
  """quantize of a tensor produced in float32 and cast to its dtype (as maxtext's layers hand over activations
  and kernels): codes, scales and amax unchanged."""
  x = _activations(0, (64, 128))

  def f(x32):
    t = quantize(x32.astype(dtype), scaling, rht=rht)
    return t.data, t.scale, t.amax

  _assert_same(gpu_like_reordered(f)(x), cpu(f)(x))


@pytest.mark.parametrize("axis", [0, 1])
def test_rht_operands_of_wide_runs_are_the_same(axis):
  """The RHT'd operand of runs whose f32 sums round (nearest rounding, along M as in wgrad, and along the last axis):
  codes, scales and amax do not depend on any dot's summation order."""
  x = _wide_runs(7, (128, 64))

  def f(x):
    q = quantize_codes(x, "1d", rht=True, axis=axis)
    return q.codes.astype(jnp.float32), q.scales, q.amax

  _assert_same(gpu_like_reordered(f)(x), cpu(f)(x))


def test_block_scaled_operands_with_stochastic_rounding_are_the_same():
  """The wgrad operand (blocks along M, RHT, stochastic rounding), what the emulated GEMM multiplies."""
  x, key = _activations(1, (128, 64)), jax.random.key(3)

  def f(x32, key):
    return quantize_block_scaled(x32.astype(jnp.bfloat16), "1d", rht=True, stochastic_rounding=True, key=key,
                                 axis=0)

  _assert_same(gpu_like_reordered(f)(x, key), cpu(f)(x, key))


def _gemm_operands() -> dict[str, jax.Array]:
  """x, W and dY of the GEMM tests (one set of shapes: the interpreter compiles each op once per shape)."""
  return {"x": _activations(2, (64, 128)), "w": _activations(3, (128, 96)) * 0.1, "dy": _activations(4, (64, 96))}


def _gemm(x32: jax.Array, w32: jax.Array, dy32: jax.Array, key: jax.Array) -> tuple[jax.Array, ...]:
  """nvfp4_dot_general's y, dx and dW of bf16 operands (the recipe: 2D weights, RHT and stochastic rounding in
  wgrad)."""

  def gemm(x, w):
    return nvfp4_dot_general(x, w, MATMUL_DIMS, key=key, recipe=GemmRecipe())

  y, vjp = jax.vjp(gemm, x32.astype(jnp.bfloat16), w32.astype(jnp.bfloat16))
  return y, *vjp(dy32.astype(jnp.bfloat16))


def test_the_gemm_forward_and_backward_are_the_same():
  """nvfp4_dot_general's y, dx and dW."""
  ops, key = _gemm_operands(), jax.random.key(0)
  _assert_same(gpu_like(_gemm)(ops["x"], ops["w"], ops["dy"], key), cpu(_gemm)(ops["x"], ops["w"], ops["dy"], key))


#: Which of (y, dx, dW) each operand feeds: y = x W, dx = dY W^T, dW = x^T dY.
_FEEDS = {"x": (True, False, True), "w": (True, True, False), "dy": (False, True, True)}


def test_a_nonfinite_operand_stays_nonfinite_under_the_gpu_compiler():
  """One NaN, +inf or -inf in x, W or dY: y, dx and dW as XLA:CPU computes them, NaNs where they are, in exactly
  the outputs the operand feeds. Why: the exact division (arithmetic.divide) runs on a GPU only; were its guard for a
  non-finite numerator gone, inf / b or NaN / b would come out a huge finite number there (its exponent field read
  as 255), so a non-finite operand would turn into finite garbage instead of the NaN the run's checks look for."""
  a = jnp.asarray([np.nan, np.inf, -np.inf, np.nan], jnp.float32)
  b = jnp.asarray([4.0, 1e30, 3.0, -2.0**100], jnp.float32)  # quotients whose exponent field would fit
  quotient = np.asarray(gpu_like(arithmetic.divide)(a, b))
  np.testing.assert_array_equal(quotient, np.asarray(a) / np.asarray(b))  # NaN, inf, -inf, NaN
  key = jax.random.key(0)
  for bad in ("x", "w", "dy"):
    for value in (np.nan, np.inf, -np.inf):
      ops = _gemm_operands()
      ops[bad] = ops[bad].at[5, 7].set(value)
      got = gpu_like(_gemm)(ops["x"], ops["w"], ops["dy"], key)
      want = cpu(_gemm)(ops["x"], ops["w"], ops["dy"], key)
      for name, g, w, fed in zip(("y", "dx", "dW"), got, want, _FEEDS[bad], strict=True):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        case = f"{value} in {bad}: {name}"
        assert np.isnan(g).any() == fed and np.isfinite(w).all() != fed, case
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=case)
        _assert_same(np.where(np.isnan(g), 0, g), np.where(np.isnan(w), 0, w))


def test_the_fused_backends_codes_and_scales_are_the_same():
  """quantize_codes (what the fused backend hands NVIDIA's block-scaled GEMM): fprop's x along K (nearest, on the
  ties of the activations), the wgrad operand with RHT and SR along M, and a weight's 16x16 tiles."""
  x, w, key = _activations(5, (128, 64)), _activations(6, (64, 96)) * 0.1, jax.random.key(4)

  def f(x32, w32, key):
    x_k = quantize_codes(x32.astype(jnp.bfloat16), "1d")
    dy_t = quantize_codes(x32.astype(jnp.bfloat16), "1d", rht=True, stochastic_rounding=True, key=key, axis=0)
    tiles = quantize_codes(w32.astype(jnp.bfloat16), "2d")
    return [(q.codes.astype(jnp.float32), q.scales, q.amax) for q in (x_k, dy_t, tiles)]

  _assert_same(gpu_like_reordered(f)(x, w, key), cpu(f)(x, w, key))


def test_the_fused_backends_rht_takes_the_gpus_order_within_every_orders_interval():
  """hadamard.Order.PLATFORM, the fused backend's RHT (docs/numerics.md#the-fused-backends-rht): on CPU the exact
  path, bit for bit; on a GPU the butterflies in one pairwise order, whose order shows on wide runs (some RHT outputs
  and codes differ from the exact path's) and whose every difference in the operand the order-aware comparison
  accepts."""
  x, operand = _wide_runs(1, (256, 256)), gemm_operands(GemmRecipe())[3]  # wgrad_x: 1D blocks along M, RHT

  def platform_rht(x):
    return hadamard.rht(x, 0, order=hadamard.Order.PLATFORM)

  def platform(x):
    return audit.emulated(x, operand, rht_order=hadamard.Order.PLATFORM)

  def exact(x):
    return audit.emulated(x, operand)

  want = cpu(exact)(x)
  _assert_same(cpu(platform)(x), want)
  _assert_same(cpu(platform_rht)(x), cpu(lambda x: hadamard.rht(x, 0))(x))
  outputs = np.asarray(gpu_like_reordered(platform_rht)(x)).view(np.uint16)
  assert np.sum(outputs != np.asarray(hadamard.rht(x, 0)).view(np.uint16)) > 0  # the order shows in the bf16 sums
  got = gpu_like_reordered(platform)(x)
  counts = np.asarray(audit.order_aware(x, operand, *got).counts())
  assert counts[:3].sum() == 0 and counts[3:].sum() > 0, counts  # no mismatch; some codes differ, all accepted


def test_the_fused_gemm_forward_and_backward_are_the_same():
  """nvfp4_dot_general with the block-scaled GEMM (jax.nn.scaled_matmul): y, dx and dW."""
  ops, key = _gemm_operands(), jax.random.key(1)

  def fused(x32, w32, dy32, key):
    y, vjp = jax.vjp(lambda x, w: nvfp4_dot_general(x, w, MATMUL_DIMS, key=key, recipe=GemmRecipe(),
                                                    block_gemm=scaled_matmul_gemm),
                     x32.astype(jnp.bfloat16), w32.astype(jnp.bfloat16))
    return y, *vjp(dy32.astype(jnp.bfloat16))

  _assert_same(gpu_like(fused)(ops["x"], ops["w"], ops["dy"], key), cpu(fused)(ops["x"], ops["w"], ops["dy"], key))


def test_the_expert_gemms_are_the_same():
  """grouped_matmul (maxtext's sparse MoE path): each expert's y, dx and dW with its own amaxes."""
  ops, key = _gemm_operands(), jax.random.key(2)
  sizes = jnp.array([20, 0, 36], jnp.int32)
  w = jnp.stack([ops["w"], -ops["w"], 2 * ops["w"]])

  def experts(x32, w32, dy32, key):
    y, vjp = jax.vjp(lambda x, w: grouped_matmul(x, w, sizes, key=key), x32.astype(jnp.bfloat16),
                     w32.astype(jnp.bfloat16))
    return y, *vjp(dy32.astype(jnp.bfloat16))

  _assert_same(gpu_like(experts)(ops["x"], w, ops["dy"], key), cpu(experts)(ops["x"], w, ops["dy"], key))


def test_the_statistics_and_the_audit_are_the_same():
  """quantization_stats (the statistics tap) and the audit's encoding and comparison of every operand of the
  recipe, each against a candidate that is our own quantizer."""
  ops = _gemm_operands()

  def f(x32, w32, dy32):
    tensors = {"x": x32.astype(jnp.bfloat16), "w": w32.astype(jnp.bfloat16), "dy": dy32.astype(jnp.bfloat16)}
    out = [stats.quantization_stats(tensors["x"], rht=True, axis=0), stats.quantization_stats(tensors["w"], scaling="2d")]
    for operand in gemm_operands(GemmRecipe()):
      tensor = tensors[operand.source]
      codes, scales, amax = audit.emulated(tensor, operand)
      out.append(audit.audited(tensor, operand, codes, scales, amax))
    return out

  _assert_same(gpu_like_reordered(f)(ops["x"], ops["w"], ops["dy"]), cpu(f)(ops["x"], ops["w"], ops["dy"]))
