# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The cross-cutting stages around a backend's GEMM, each defined once (pure JAX; MaxText.backends.pipeline orders
them).

Every stage wraps a GEMM `gemm(x, w, extra) -> y` (differentiable in x and w; `extra` carries the backend's
per-call state, e.g. the stochastic-rounding key or TE's quantizer set) and returns one of the same form:
  select_bf16     a BF16 layer or a step past nvfp4_bf16_from_step: `lax.cond` between the unquantized GEMM and it;
  forward_switch  past nvfp4_bf16_forward_from_step: the forward output is the unquantized GEMM's, the gradients
                  stay the NVFP4 GEMM's (a `Core`'s three VJP parts);
  tap             every N steps, a measurement of the operands the GEMM quantizes (forward: x, W; backward: dY),
                  leaving as the cotangent of a sink variable (the per-GEMM statistics; the audit);
  gradient_tap    every N steps, a measurement of the GEMM's weight gradient dW (the statistics' zero shares), the
                  same way; `measured_weight` is its identity on W alone, which BF16 GEMMs use too;
  guard           a non-finite operand poisons the outputs that read it (TE's quantizer can hide a NaN).
Why `tap` and `guard` are identities around the GEMM rather than a custom VJP wrapping it: the GEMM (and any
conditional around it) is then differentiated by jax as it is, with its own residuals, saved or rematerialized by
maxtext's remat policy as without the stage. A custom VJP that calls `jax.vjp` of the GEMM keeps a second set of
the GEMM's residuals (the pre-flight measured +0.08 of TE's bytes per step for the paper recipe's Llama 3 8B).
Their backward halves meet through a probe: a value the operand identity outputs and the output identity consumes,
whose cotangent carries what only the backward pass knows (dY's statistics, dY's max|.|) to the operands' backward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from MaxText.nvfp4.gemm import QUANTIZATION_NAME
from MaxText.precision.measures import Measure

__all__ = ["GUARD_SCOPE", "TAP_SCOPE", "Core", "Gemm", "forward_switch", "gradient_tap", "guard", "measured_weight",
           "select_bf16", "tap"]

#: The named scopes (jax.named_scope) the guard's and the taps' own operations run under, the GEMM they wrap outside
#: them: metadata in the compiled program's name stacks, by which the pre-flight attributes their kernels
#: (MaxText.preflight.origins); a name scope changes no computation.
GUARD_SCOPE = "nvfp4_guard"
TAP_SCOPE = "nvfp4_tap"

#: A GEMM as the stages see it: (x, w, extra) -> y.
Gemm = Callable[[jax.Array, jax.Array, Any], jax.Array]


def select_bf16(flag: jax.Array | None, bf16: Callable[..., Any], nvfp4: Callable[..., Any], *operands: Any) -> Any:
  """`nvfp4(*operands)`, or `bf16(*operands)` where the traced bool `flag` is true.

  The one form of every BF16 fallback (BF16 layers, the late switch, on every backend, dense and experts):
  `jax.lax.cond`, not a select, so only one branch runs per step while both are compiled once into one program;
  `flag=None` (no switch applies) traces no conditional at all.
  """
  if flag is None:
    return nvfp4(*operands)
  return jax.lax.cond(flag, bf16, nvfp4, *operands)


@dataclasses.dataclass(frozen=True)
class Core:
  """A backend's GEMM as the stages compose it.

  call(x, w, extra): the GEMM, differentiable in x and w: what runs when no forward-only switch applies.
  residuals(x, w, extra), fprop(x, w, residuals), backward(residuals, dy) -> (dx, dw): its VJP in three parts, for
    the forward-only switch. The emulated backend's come from MaxText.nvfp4.gemm.Nvfp4Matmul, so after the switch
    it runs only the BF16 forward GEMM (its quantized operands for the backward are computed either way). TE's dense
    computes its FP4 GEMM and the quantized operands together (TE 2.20.2 has no quantize-only forward): `from_vjp`
    builds the parts from `jax.vjp`, and from the switch step its forward runs the BF16 GEMM and, unused, TE's.
  """

  call: Gemm
  residuals: Callable[[jax.Array, jax.Array, Any], Any]
  fprop: Callable[[jax.Array, jax.Array, Any], jax.Array]
  backward: Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]

  @classmethod
  def from_vjp(cls, call: Gemm) -> Core:
    """A Core for a GEMM known only as a differentiable function (TE's dense)."""
    return cls(call=call, residuals=lambda x, w, extra: jax.vjp(lambda a, b: call(a, b, extra), x, w),
               fprop=lambda x, w, residuals: residuals[0], backward=lambda residuals, dy: residuals[1](dy))


def forward_switch(core: Core, bf16: Callable[[jax.Array, jax.Array], jax.Array], flag: jax.Array | None) -> Gemm:
  """`core.call`, whose forward output is `bf16(x, w)` where the traced bool `flag` is true; the gradients are the
  core's own either way (dgrad and wgrad on its quantized operands): nvfp4_bf16_forward_from_step. One program: the
  forward output is picked by `lax.cond`; `flag=None` (no switch set) is the core itself."""
  if flag is None:
    return core.call

  @jax.custom_vjp
  def switched(x, w, extra, flag):  # nothing differentiated: the core's own output, without its residuals
    return jax.lax.cond(flag, lambda: bf16(x, w), lambda: core.call(x, w, extra))

  def fwd(x, w, extra, flag):
    residuals = core.residuals(x, w, extra)
    return jax.lax.cond(flag, lambda: bf16(x, w), lambda: core.fprop(x, w, residuals)), residuals

  def bwd(residuals, dy):
    return (*core.backward(residuals, dy), None, None)

  switched.defvjp(fwd, bwd)
  return lambda x, w, extra: switched(x, w, extra, flag)


def tap(gemm: Gemm, measure: Measure, matrices: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]],
        sink: jax.Array, flag: jax.Array) -> Gemm:
  """`gemm`, with the same outputs and gradients, whose operands are measured where the traced bool `flag` is true,
  the measurement leaving as the cotangent of `sink` (the GEMM's previous array, `measure.empty()`'s shape).

  Why a cotangent: dY exists only inside the backward pass, and a gradient is the only way out of it. The caller keeps
  `sink` in a variable that maxtext's train step overwrites with its gradient (the `_overwrite_with_gradient`
  collection), so after a step it holds the latest measurement; on other steps the cotangent is `sink` itself and
  nothing is measured (`lax.cond`). `matrices(lhs, rhs)` gives the GEMM's x (M x K) and W (K x N).
  """
  forward_rows, backward_rows = np.asarray(measure.forward_rows), np.asarray(measure.backward_rows)

  @jax.custom_vjp
  def operands(lhs, rhs, sink, flag):
    return lhs, rhs, jnp.zeros((len(backward_rows), sink.shape[-1]), sink.dtype)

  def operands_fwd(lhs, rhs, sink, flag):
    rows = jax.lax.cond(flag, lambda: measure.forward(*matrices(lhs, rhs)), lambda: sink[forward_rows])
    return operands(lhs, rhs, sink, flag), rows

  def operands_bwd(rows, cotangents):
    dlhs, drhs, backward = cotangents  # the probe's cotangent: the backward rows (`output`'s backward)
    measured = jnp.zeros(measure.empty().shape, rows.dtype).at[forward_rows].set(rows).at[backward_rows].set(backward)
    return dlhs, drhs, measured, None

  operands.defvjp(operands_fwd, operands_bwd)

  def tapped(lhs, rhs, extra):
    n = jax.eval_shape(matrices, lhs, rhs)[1].shape[1]  # dY is measured as (M, N), whatever y's layout

    @jax.custom_vjp
    def output(y, probe, previous, flag):
      del probe, previous, flag
      return y

    def output_fwd(y, probe, previous, flag):
      del probe
      return y, (previous, flag)

    def output_bwd(residuals, dy):
      previous, flag = residuals
      return dy, jax.lax.cond(flag, lambda: measure.backward(dy.reshape(-1, n)), lambda: previous), None, None

    output.defvjp(output_fwd, output_bwd)
    with jax.named_scope(TAP_SCOPE):  # metadata only: the pre-flight attributes the tap's kernels by it
      lhs, rhs, probe = operands(lhs, rhs, sink, flag)
    y = gemm(lhs, rhs, extra)
    with jax.named_scope(TAP_SCOPE):
      return output(y, probe, sink[backward_rows], flag)

  return tapped


def measured_weight(w: jax.Array, measure: Callable[[jax.Array], jax.Array], sink: jax.Array,
                    flag: jax.Array) -> jax.Array:
  """`w` itself, whose cotangent dW is measured where the traced bool `flag` is true: `measure(dW)` (`sink`'s shape)
  leaves as the cotangent of `sink`, as `tap`'s rows do; on other steps the cotangent is `sink` itself and nothing is
  measured (`lax.cond`). dW passes unchanged: whatever multiplies `w` (an NVFP4 core, lax.dot_general, maxtext's
  ragged_dot) computes the same gradients with or without it."""

  @jax.custom_vjp
  def weight(w, sink, flag):
    del sink, flag
    return w

  def weight_fwd(w, sink, flag):
    return w, (sink, flag)

  def weight_bwd(residuals, dw):
    previous, flag = residuals
    return dw, jax.lax.cond(flag, lambda: measure(dw).astype(previous.dtype), lambda: previous), None

  weight.defvjp(weight_fwd, weight_bwd)
  with jax.named_scope(TAP_SCOPE):  # metadata only, as `tap`'s
    return weight(w, sink, flag)


def gradient_tap(gemm: Gemm, measure: Callable[[jax.Array], jax.Array], sink: jax.Array, flag: jax.Array) -> Gemm:
  """`gemm`, with the same outputs and gradients, whose weight gradient dW (in rhs's layout) is measured on the
  steps `flag` says (`measured_weight`)."""
  return lambda lhs, rhs, extra: gemm(lhs, measured_weight(rhs, measure, sink, flag), extra)


def _all_finite(a: jax.Array) -> jax.Array:
  """True when every element of `a` is finite: max|a| is NaN if any element is NaN, inf if any is +-inf."""
  return jnp.isfinite(jnp.max(jnp.abs(a)))


def _poison(out: jax.Array, ok: jax.Array) -> jax.Array:
  """`out`, or NaN everywhere when `ok` is False: `out` times a scalar 1 or NaN (exact: x * 1 == x, signed zeros
  included). A product with a scalar fuses into `out`'s consumer; a select against a NaN tensor made XLA hoist
  the NaN broadcast out of the layer loop and read it back (MaxText.preflight measured it)."""
  return out * jnp.where(ok, 1.0, jnp.nan).astype(out.dtype)


@jax.custom_vjp
def _guard_operands(x, w, x_ok, w_ok):
  """Identity on (x, w), plus a probe scalar whose cotangent is max|dY| (finite exactly when dY is)."""
  del x_ok, w_ok
  return x, w, jnp.zeros((), jnp.float32)


def _guard_operands_fwd(x, w, x_ok, w_ok):
  return _guard_operands(x, w, x_ok, w_ok), (x_ok, w_ok)


def _guard_operands_bwd(verdicts, cotangents):
  x_ok, w_ok = verdicts
  dx, dw, dy_amax = cotangents  # the probe's cotangent: max|dY| (_guard_output_bwd)
  dy_ok = jnp.isfinite(dy_amax)
  return _poison(dx, dy_ok & w_ok), _poison(dw, x_ok & dy_ok), None, None


_guard_operands.defvjp(_guard_operands_fwd, _guard_operands_bwd)


@jax.custom_vjp
def _guard_output(y, probe, ok):
  """y poisoned where an operand was not finite; in the backward, the probe's cotangent is max|dY|."""
  del probe
  return _poison(y, ok)


def _guard_output_fwd(y, probe, ok):
  return _guard_output(y, probe, ok), ok


def _guard_output_bwd(ok, dy):
  del ok  # dY itself passes unchanged: the GEMM's own backward reads it as it is
  return dy, jnp.max(jnp.abs(dy)).astype(jnp.float32), None


_guard_output.defvjp(_guard_output_fwd, _guard_output_bwd)


def guard(gemm: Gemm) -> Gemm:
  """`gemm` with a non-finite operand poisoning its outputs (the TE backend's nvfp4_nonfinite_check).

  Forward: y is NaN when x or w holds a NaN/inf. Backward: dx = dgrad(dY, W) is NaN when dY or W does, and
  dW = wgrad(x, dY) when x or dY does. Built to cost little beside TE's kernels (scripts/audit_overhead.py): each
  check is a max|.| reduction XLA fuses into the operand's producer where it can; each poison is a product with a
  scalar (1 or NaN) that fuses into the output's consumer; x's and W's verdicts are saved for the backward under the
  name TE's quantized operands carry ("quantization"), so maxtext's remat policy keeps two bools instead of reading
  x and W again.
  """

  def guarded(x, w, extra):
    with jax.named_scope(GUARD_SCOPE):  # metadata only (no HLO computation changes): the pre-flight's attribution
      x_ok = checkpoint_name(_all_finite(x), QUANTIZATION_NAME)
      w_ok = checkpoint_name(_all_finite(w), QUANTIZATION_NAME)
      x, w, probe = _guard_operands(x, w, x_ok, w_ok)
    y = gemm(x, w, extra)
    with jax.named_scope(GUARD_SCOPE):
      return _guard_output(y, probe, x_ok & w_ok)

  return guarded
