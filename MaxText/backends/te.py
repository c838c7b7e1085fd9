# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The TransformerEngine backend: TE's NVFP4 (and FP8 current scaling) dense GEMMs as DenseGeneral modules.

Real code for TE 2.20.2 (transformer_engine.jax): `transformer_engine.jax.dense.dense` with a quantizer set
built from `NVFP4BlockScaling(disable_rht=..., disable_stochastic_rounding=..., disable_2d_quantization=...)`
or `Float8CurrentScaling()`, as TE's own `make_dot_general_cls` does, plus what maxtext's TE wrapper leaves
out: inputs cast to bf16 (TE's RHT kernel takes bf16 only) and a per-step stochastic-rounding key.
Two things TE 2.20.2 does not do on its own, added here:
  - 1D-scaled weights (nvfp4_2d_weight_scaling=false) with RHT: TE's quantize config turns RHT on for every
    1D-scaled NVFP4 operand it quantizes column-wise, the kernel included, and its GEMM then refuses the mix. The
    recipe applies RHT to the weight-gradient operands only (x and dY), so the kernel quantizer's RHT is turned off.
  - Non-finite operands: TE's NVFP4 amax ignores NaN (fmaxf), so a NaN in x, W or dY can vanish into a finite
    FP4 value. With `nonfinite_check`, each GEMM's output (y, dx, dW) is made NaN when one of its operands has a
    non-finite max|.|: a reduction per operand (fused into its producer where XLA can) and a product with a scalar.
It runs on Blackwell GPUs only; without one, the TE test group (tests/te, `make test-te`) traces and lowers it to
CUDA StableHLO on CPU. transformer_engine is imported when a TE module class is first built, never at import time.
"""

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from MaxText.backends.emulated import unquantized
from MaxText.backends.flags import gemm_flags
from MaxText.backends.sr import sr_key
from MaxText.backends.telemetry import with_stats
from MaxText.nvfp4.gemm import QUANTIZATION_NAME, GemmRecipe, select_bf16
from MaxText.precision.policy import Precision
from MaxText.precision.switches import Switches

#: maxtext's collection for TE quantizer metadata (NVFP4 and current scaling create none in it).
_TE_META_COLLECTION = "_overwrite_with_gradient"


def nvfp4_recipe_kwargs(recipe: GemmRecipe) -> dict[str, bool]:
  """Constructor arguments of TE's NVFP4BlockScaling for our recipe switches.

  Passed explicitly because constructor arguments win over TE's NVTE_NVFP4_* environment variables, which
  TE reads once at import.
  """
  return {
      "disable_rht": not recipe.rht,
      "disable_stochastic_rounding": not recipe.stochastic_rounding,
      "disable_2d_quantization": not recipe.weight_2d,
  }


def implementation_name(precision: Precision) -> str:
  if precision is Precision.NVFP4:
    return "TransformerEngine NVFP4BlockScaling dense"
  return "TransformerEngine Float8CurrentScaling dense"


def _te_recipe(precision: Precision, recipe: GemmRecipe) -> Any:
  # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, only where a TE module is built
  from transformer_engine.common import recipe as te_recipe

  if precision is Precision.NVFP4:
    return te_recipe.NVFP4BlockScaling(**nvfp4_recipe_kwargs(recipe))
  if precision is Precision.FP8:
    return te_recipe.Float8CurrentScaling()
  raise ValueError(f"te_backend: no TE recipe for precision {precision.value!r} (bf16 GEMMs are not quantized).")


def _all_finite(a: jax.Array) -> jax.Array:
  """True when every element of `a` is finite: max|a| is NaN if any element is NaN, inf if any is +-inf."""
  return jnp.isfinite(jnp.max(jnp.abs(a)))


def _poison(out: jax.Array, ok: jax.Array) -> jax.Array:
  """`out`, or NaN everywhere when `ok` is False: `out` times a scalar 1 or NaN (exact: x * 1 == x, signed zeros
  included). A product with a scalar fuses into `out`'s consumer; a select against a NaN tensor made XLA hoist
  the NaN broadcast out of the layer loop and read it back (MaxText.preflight measured it)."""
  return out * jnp.where(ok, 1.0, jnp.nan).astype(out.dtype)


def nonfinite_guard(gemm: Any) -> Any:
  """Wraps `gemm(x, w, extra) -> y` (differentiable in x and w) so that a non-finite operand poisons its outputs.

  Forward: y is NaN when x or w holds a NaN/inf. Backward: dx = dgrad(dY, W) is NaN when dY or W does, and
  dW = wgrad(x, dY) when x or dY does. The wrapped GEMM's own backward (TE's, with its saved quantized operands)
  runs unchanged. Built to cost little beside TE's kernels (scripts/audit_overhead.py: 3.4% of their bytes in the
  Llama 3 8B step): each check is a max|.| reduction XLA fuses into the operand's producer where it can (W's into
  its f32 -> bf16 cast, dY's into the activation's backward); each poison is a product with a scalar (1 or NaN)
  that fuses into the output's consumer; x's and W's verdicts are saved for the backward under the name TE's
  quantized operands carry ("quantization"), so maxtext's remat policy keeps two bools instead of reading x and W
  again. (The first form, a select against a NaN tensor and verdicts left to remat, added 67% of TE's bytes.)
  """

  @jax.custom_vjp
  def guarded(x, w, extra):
    return gemm(x, w, extra)

  def fwd(x, w, extra):
    y, pullback = jax.vjp(gemm, x, w, extra)
    x_ok = checkpoint_name(_all_finite(x), QUANTIZATION_NAME)
    w_ok = checkpoint_name(_all_finite(w), QUANTIZATION_NAME)
    return _poison(y, x_ok & w_ok), (pullback, x_ok, w_ok)

  def bwd(res, dy):
    pullback, x_ok, w_ok = res
    dy_ok = _all_finite(dy)
    dx, dw, dextra = pullback(dy)
    return _poison(dx, dy_ok & w_ok), _poison(dw, x_ok & dy_ok), dextra

  guarded.defvjp(fwd, bwd)
  return guarded


def forward_switched(nvfp4: Any, bf16: Any, flag: jax.Array) -> Any:
  """`nvfp4(x, w, extra) -> y` whose forward output is `bf16(x, w)` where the traced bool `flag` is true, while its
  gradients stay nvfp4's (TE's dgrad and wgrad on TE's own quantized operands): nvfp4_bf16_forward_from_step.

  One program: the outputs are picked by `lax.cond`, the backward is always nvfp4's pullback. Trade-off: TE's dense
  forward rule computes its FP4 GEMM together with the quantized operands the backward needs (TE 2.20.2 has no
  quantize-only forward), so from the switch step the forward runs the BF16 GEMM and, unused, the FP4 one.
  """

  @jax.custom_vjp
  def switched(x, w, extra, flag):
    return jax.lax.cond(flag, lambda: bf16(x, w), lambda: nvfp4(x, w, extra))

  def fwd(x, w, extra, flag):
    y, pullback = jax.vjp(nvfp4, x, w, extra)
    return jax.lax.cond(flag, lambda: bf16(x, w), lambda: y), pullback

  def bwd(pullback, dy):
    return (*pullback(dy), None)

  switched.defvjp(fwd, bwd)
  return lambda x, w, extra: switched(x, w, extra, flag)


def _kernel_without_rht(quantizer_set: Any) -> Any:
  """The quantizer set with RHT off for the kernel (TE turns it on for a 1D-scaled kernel; see module doc)."""
  kernel = quantizer_set.kernel
  if kernel is None or not getattr(kernel, "use_rht", False):
    return quantizer_set
  return dataclasses.replace(quantizer_set, kernel=dataclasses.replace(kernel, use_rht=False))


@functools.cache
def dot_general_cls(precision: Precision, recipe: GemmRecipe, nonfinite_check: bool = True,
                    switches: Switches = Switches(), stats_interval: int = 0) -> type:
  """A Linen module class running one DenseGeneral's GEMM through TE's dense with the given precision.

  `switches` (NVFP4 only): BF16 decoder layers and nvfp4_bf16_from_step run the unquantized GEMM instead of TE's
  under `lax.cond` (one compiled program); nvfp4_bf16_forward_from_step switches only the forward output to the
  unquantized GEMM (`forward_switched`), dgrad and wgrad stay TE's.

  `nonfinite_check` (NVFP4 only; config key nvfp4_nonfinite_check) adds `nonfinite_guard` around TE's dense.
  `stats_interval` (NVFP4 only; nvfp4_stats_interval): every N steps, our bit-exact quantizer's statistics of the
  bf16 operands TE quantizes (MaxText.backends.telemetry); other steps run TE's dense alone.
  """
  # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, only where a TE module is built
  from transformer_engine.jax import dense as te_dense
  # pylint: disable-next=import-outside-toplevel  # optional heavy dependency: TE, as above
  from transformer_engine.jax.flax.module import TransformerEngineBase

  te_recipe = _te_recipe(precision, recipe)
  is_nvfp4 = precision is Precision.NVFP4  # (the module's __call__ has a `precision` argument of its own)
  guard = nonfinite_check and is_nvfp4

  class TeDotGeneral(TransformerEngineBase):
    """TE dense for DenseGeneral: contracting dims trailing on x and leading on the kernel, no batch dims."""

    def make_rng(self, name: str = "params") -> jax.Array:
      # TE draws its stochastic-rounding state from make_rng("sr_rng"), which maxtext never provides (flax would
      # fall back to "params", constant across steps under scan_layers). Serve it our per-layer, per-step key.
      # TE asks once per forward (for the output-gradient quantizer), so the call counter advances once per call.
      return sr_key(self) if name == "sr_rng" else super().make_rng(name)

    def generate_quantizer_set(self, postfix: str = "", variable_collection: str | None = None,
                               quantization_checkpoint_name: str | None = None, fp8_recipe: Any = None,
                               n_groups: int | None = None) -> Any:
      del variable_collection, quantization_checkpoint_name, fp8_recipe
      return super().generate_quantizer_set(
          postfix=postfix, variable_collection=_TE_META_COLLECTION,
          quantization_checkpoint_name=QUANTIZATION_NAME, fp8_recipe=te_recipe, n_groups=n_groups)

    @nn.compact
    def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
      del precision, preferred_element_type
      contracting_dims, batch_dims = dimension_numbers
      if batch_dims != ((), ()):
        raise NotImplementedError(f"TE dense has no batch dimensions; got {batch_dims}.")
      out_dtype = lhs.dtype
      quantizer_set = self.generate_quantizer_set()
      if is_nvfp4:
        quantizer_set = _kernel_without_rht(quantizer_set)

      def gemm(x, w, qs):
        return te_dense.dense(x, w, contracting_dims=contracting_dims, quantizer_set=qs)

      all_bf16, forward_bf16 = gemm_flags(self, switches) if is_nvfp4 else (None, None)
      bf16 = unquantized(dimension_numbers, out_dtype)

      def te_path(l, r, qs):
        return gemm(l.astype(jnp.bfloat16), r.astype(jnp.bfloat16), qs).astype(out_dtype)

      if forward_bf16 is not None:  # nvfp4_bf16_forward_from_step: BF16 forward, TE's NVFP4 gradients
        te_path = forward_switched(te_path, bf16, forward_bf16)
      te_gemm, extra = with_stats(self, te_path, quantizer_set, dimension_numbers, recipe,
                                  stats_interval if is_nvfp4 else 0)

      def selected(l, r, e):  # BF16 layers and nvfp4_bf16_from_step: lax.cond between BF16 and TE
        return select_bf16(all_bf16, bf16, lambda a, b: te_gemm(a, b, e), l, r)

      # The guard goes around everything, outside the conditionals, where XLA can fuse its checks into the
      # operands' producers and its poison into the outputs' consumers (inside a branch it cannot: +68% of TE's
      # bytes for the paper recipe's Llama 3 8B layer, measured with MaxText.preflight).
      return (nonfinite_guard(selected) if guard else selected)(lhs, rhs, extra)

  TeDotGeneral.__name__ = f"TeDotGeneral_{precision.value}"
  return TeDotGeneral
