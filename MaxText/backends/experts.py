# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""NVFP4 routed-expert GEMMs (MoE): the implementation per backend and the state of one RoutedMoE call.

maxtext 0.2.5 (layers/moe.py) runs the expert GEMMs (wi_0, wi_1 or the fused wi, wo) in one of two ways:
  sparse_matmul=true   grouped matmuls over expert-sorted tokens: `mblx.gmm(...)` (megablox=true or
                       use_tokamax_gmm=true) or `jax.lax.ragged_dot(...)` (megablox=false). The quant object is only
                       read for `quant_dg` / `quantize_dtype` (megablox's own int8/fp8 quantization); ours has
                       neither, so megablox never quantizes on its own.
  sparse_matmul=false  einsums from `quant.einsum(mesh_axes=kernel_axes)`, applied through
                       `quantizations.apply_einsum_in_nnx` ("BSM,EMH -> BSEH" dropless, "EBCM,EMH -> EBCH" with
                       capacity); the same hook serves the dispatch/combine einsums, which stay unquantized.
This module holds what runs there: `ExpertCall` (implementation, recipe, stochastic-rounding key and BF16 switches
of the RoutedMoE call being traced, made current by `expert_call` from the integration layer's RoutedMoE hook),
`grouped_gemm` (what the grouped matmuls become) and `expert_einsum` (what `quant.einsum` returns). The
integration layer (MaxText.integration.moe) routes maxtext's calls here; nothing in this module patches anything.
The router (GateLogit, a dot_general with axes ("embed", None)) and shared experts (DenseGenerals with MLP axes)
go through the dense policy: router unquantized, shared experts by the MLP rule.

TransformerEngine: TE 2.20.2's JAX grouped GEMM supports BF16, FP8 and MXFP8 only, so `te_expert_gemms()` is None
and the config validator requires nvfp4_moe_experts=bf16 with the TE backend. A TE release with an NVFP4 grouped
GEMM is adopted by returning its implementation from `te_expert_gemms` (MaxText.backends.table maps each backend to
its expert GEMMs; nothing else changes). The fused backend runs NVFP4 experts on Blackwell without one: TE's dense
NVFP4 GEMM once per expert (`fused_expert_gemms`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from MaxText.backends import emulated, pipeline
from MaxText.backends.emulated import unquantized
from MaxText.backends.sr import sr_key
from MaxText.backends.stages import Core
from MaxText.backends.te_gemm import fused_gemm
from MaxText.nvfp4 import audit, grouped
from MaxText.nvfp4.gemm import MATMUL_DIMS as EXPERT_DIMS  # one expert's GEMM x_e (rows, K) . w_e (K, N): the plain one
from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.precision.settings import Settings

__all__ = ["EMULATED", "EXPERT_GEMMS", "ExpertCall", "ExpertGemms", "ExpertState", "JAX_RAGGED_DOT", "TE_MISSING",
           "active_call", "expert_call", "expert_einsum", "fused_expert_gemms", "grouped_gemm", "is_expert_kernel",
           "measured_einsum", "te_expert_gemms"]

#: `quant.einsum(mesh_axes=...)` serves two kinds of right-hand sides in RoutedMoE.dense_matmul: expert kernels,
#: always 3-D (E, K, N) with axes such as ("exp", "embed_moe", "mlp_moe"), ("exp", None, "mlp") (capacity path),
#: ("embed_moe", None, "mlp_moe") (fsdp), ("expert_only", "embed_moe", None) (batch split), and the dispatch/combine
#: masks, 4-D or 5-D with "activation_*" axes.
_MASK_AXIS_PREFIX = "activation"
#: jax's own ragged_dot, for the unquantized branch: while an NVFP4 RoutedMoE call is traced the integration layer
#: routes `jax.lax.ragged_dot` here, so the BF16 branch must not look the attribute up again.
JAX_RAGGED_DOT = jax.lax.ragged_dot
#: Expert GEMMs of one RoutedMoE call with statistics slots, in call order: wi_0, wi_1, wo.
EXPERT_GEMMS = ("wi_0", "wi_1", "wo")


@dataclasses.dataclass(frozen=True)
class ExpertGemms:
  """One backend's expert GEMMs: grouped (ragged_dot layout) and batched (einsum layout), each mapping one expert's
  GEMM (the pipeline around `core`) over the experts; see nvfp4/grouped.py."""

  name: str
  grouped: Callable[..., jax.Array]  # (x, w, group_sizes, *, key, recipe, gemm, extra) -> y
  batched: Callable[..., jax.Array]  # (x, w, *, key, recipe, gemm, extra) -> y[e]
  core: Callable[..., Core]  # (x_e, w_e, dimension_numbers, recipe) -> one expert's core GEMM


EMULATED = ExpertGemms("MaxText.nvfp4.grouped emulation (per-expert amax)", grouped.grouped_matmul,
                        grouped.batched_expert_matmul, emulated.core)
#: Why the TE backend has no NVFP4 expert GEMMs (docs/numerics.md#transformerengine-shape-and-hardware-rules).
TE_MISSING = ("TransformerEngine 2.20.2's JAX grouped GEMM supports BF16, FP8 and MXFP8 only (no NVFP4), and "
              "maxtext's te_moe_block accepts te_mxfp8 or te_no_quant only")


def te_expert_gemms() -> ExpertGemms | None:
  """TE's NVFP4 grouped GEMMs, the one place to adopt them: None while TE has none (TE_MISSING)."""
  return None


def fused_expert_gemms() -> ExpertGemms:
  """The fused backend's expert GEMMs: the emulation's per-expert slabs (the same quantizer, the same per-expert
  amaxes), each expert's GEMM on codes and scales, mapped over the experts (jax.vmap): one jax.nn.scaled_matmul
  batched over them, or on Blackwell one TE NVFP4 GEMM per expert (MaxText.backends.te_gemm.fused_gemm)."""
  gemm, name = fused_gemm()
  return ExpertGemms(f"MaxText.nvfp4 quantizer per expert + {name} mapped over the experts (fused)",
                     grouped.grouped_matmul, grouped.batched_expert_matmul,
                     functools.partial(emulated.core, block_gemm=gemm))


# ---------------------------------------------------------------------------------------------------------------
# The expert GEMMs of one RoutedMoE call.


@dataclasses.dataclass
class ExpertCall:
  """What the expert GEMMs of the RoutedMoE call being traced need: implementation, recipe, stochastic-rounding key,
  the pipeline's per-call state with the layer's statistics sinks (ExpertState), and a call counter.

  gemms None: BF16 experts whose weight gradients the statistics measure (Settings.bf16_mlp_taps); maxtext's own
  GEMMs run, each on its weight stack from `measured_weight`.
  """

  gemms: ExpertGemms | None
  recipe: GemmRecipe
  key: jax.Array | None
  state: pipeline.Stages
  sinks: tuple[jax.Array, ...] = ()  # each (len(EXPERT_GEMMS), E, ...): one slot per expert GEMM of the layer
  calls: Any = dataclasses.field(default_factory=itertools.count)
  gemms_run: int = 0  # expert GEMMs that went through the hooks in this call

  def next_key(self) -> jax.Array | None:
    """A distinct key per expert GEMM of the layer (wi_0, wi_1, wo, in call order)."""
    return None if self.key is None else jax.random.fold_in(self.key, next(self.calls))

  def run(self, layout: Callable[..., jax.Array], bf16: Callable[..., jax.Array], *operands: jax.Array) -> jax.Array:
    """One expert GEMM of the layer through the pipeline: counted, keyed, each expert's GEMM in NVFP4 with the
    inner stages (per expert), all of them or (BF16 layer / past nvfp4_bf16_from_step) the unquantized `bf16`.

    `layout(*operands, key=, recipe=, gemm=, extra=)` maps one expert's GEMM over the experts
    (MaxText.nvfp4.grouped), `bf16(*operands)` is the unquantized GEMM of all experts.
    """
    index = self._slot()
    key = self.next_key()
    sinks = tuple(sink[index] for sink in self.sinks)  # (E, ...) each: one expert's slice per vmapped GEMM

    def over_experts(one_expert: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
      def nvfp4(*ops_and_extra):
        *ops, extra = ops_and_extra
        return layout(*ops, key=key, recipe=self.recipe, extra=extra,
                      gemm=lambda x_e, w_e, key_e, sinks_e: one_expert(x_e, w_e, (key_e, sinks_e)))

      return nvfp4

    gemm = pipeline.assembled(self.state, lambda x_e, w_e: self.gemms.core(x_e, w_e, EXPERT_DIMS, self.recipe),
                              unquantized(EXPERT_DIMS), EXPERT_DIMS, over_experts=over_experts, bf16_all=bf16)
    return gemm(*operands, sinks)

  def measured_weight(self, rhs: jax.Array, transposed: bool = False) -> jax.Array:
    """One BF16 expert GEMM of the layer (gemms None): its weight stack (E, K, N), or (E, N, K) `transposed`, with
    each expert's weight gradient measured into this GEMM's slot (pipeline.measured_weight); counted as `run`
    counts. maxtext's own GEMM then multiplies it: the same outputs and gradients."""
    index = self._slot()
    sinks = tuple(sink[index] for sink in self.sinks)
    if sinks and rhs.shape[0] != sinks[0].shape[0]:
      raise NotImplementedError(f"expert statistics: a GEMM over {rhs.shape[0]} of {sinks[0].shape[0]} experts "
                                "(expert parallelism); set nvfp4_stats_interval=0 for this model.")
    return pipeline.measured_weight(self.state, sinks, rhs, (1,) if transposed else (0,), experts=True)

  def _slot(self) -> int:
    """The next expert GEMM's index among the layer's (wi_0, wi_1, wo: its slot in the statistics sinks)."""
    index = self.gemms_run
    self.gemms_run += 1
    if self.sinks and index >= self.sinks[0].shape[0]:
      raise NotImplementedError(f"expert statistics: this RoutedMoE call runs more than {self.sinks[0].shape[0]} "
                                "expert GEMMs (wi_0, wi_1, wo); set nvfp4_stats_interval=0 for this model.")
    return index


_ACTIVE: contextvars.ContextVar[ExpertCall | None] = contextvars.ContextVar("nvfp4_expert_call", default=None)


def active_call() -> ExpertCall | None:
  """The NVFP4 RoutedMoE call being traced in this context, or None outside one."""
  return _ACTIVE.get()


@contextlib.contextmanager
def expert_call(call: ExpertCall) -> Iterator[ExpertCall]:
  """Makes `call` current while one RoutedMoE call is traced (synchronously; thread-safe, nothing global)."""
  token = _ACTIVE.set(call)
  try:
    yield call
  finally:
    _ACTIVE.reset(token)


class ExpertState(nn.Module):
  """A RoutedMoE layer's NVFP4 expert state, bridged into NNX by the integration layer: the stochastic-rounding
  key (sr.sr_key: rng stream plus a checkpointed call counter) and the pipeline's per-call state (pipeline.stages_of:
  this layer's decoder index and the training step for the BF16 switches; one statistics slot per expert GEMM and
  expert), as (key or None, Stages, sinks). `quantized=False`: BF16 experts whose weight gradients the statistics
  measure (Settings.bf16_mlp_taps): no key, no switch, those sinks only."""

  settings: Settings
  num_experts: int
  quantized: bool = True

  @nn.compact
  def __call__(self) -> tuple[jax.Array | None, pipeline.Stages, tuple[jax.Array, ...]]:
    key = sr_key(self) if self.quantized and self.settings.recipe.stochastic_rounding else None
    state, sinks = pipeline.stages_of(self, self.settings, guard=False, candidate=audit.emulated,
                                      sink_shape=(len(EXPERT_GEMMS), self.num_experts), quantized=self.quantized)
    return key, state, sinks


def grouped_gemm(call: ExpertCall, lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array,
                 preferred_element_type: Any) -> jax.Array:
  """`ragged_dot(lhs, rhs, group_sizes)` as the NVFP4 expert GEMMs of `call` (or unquantized where it says)."""

  def bf16(lhs, rhs, group_sizes):
    return JAX_RAGGED_DOT(lhs, rhs, group_sizes, preferred_element_type=lhs.dtype)

  return call.run(call.gemms.grouped, bf16, lhs, rhs, group_sizes).astype(preferred_element_type or lhs.dtype)


def is_expert_kernel(mesh_axes: tuple[str | None, ...]) -> bool:
  """Whether `quant.einsum(mesh_axes=...)` is asked for an expert-weight einsum (not a dispatch/combine mask)."""
  return len(mesh_axes) == 3 and not any(str(a).startswith(_MASK_AXIS_PREFIX) for a in mesh_axes if a)


def expert_einsum(mesh_axes: tuple[str | None, ...]) -> Callable[..., jax.Array]:
  """What `Nvfp4Quantization.einsum(mesh_axes=...)` returns: NVFP4 for expert kernels, jnp.einsum otherwise."""
  return _einsum if is_expert_kernel(mesh_axes) else _routing_einsum


def measured_einsum(mesh_axes: tuple[str | None, ...]) -> Callable[..., jax.Array]:
  """What `quant.einsum(mesh_axes=...)` returns for BF16 experts whose weight gradients the statistics measure:
  jnp.einsum, an expert kernel's stack passed through the layer's ExpertCall.measured_weight first."""
  return _measured_einsum if is_expert_kernel(mesh_axes) else jnp.einsum


def _measured_einsum(equation: str, lhs: jax.Array, rhs: jax.Array, **kwargs: Any) -> jax.Array:
  """maxtext's expert einsum "<lhs>,<e k n> -> <out>" as it is (jnp.einsum, its kwargs), on the measured stack."""
  call = active_call()
  if call is None:
    raise NotImplementedError(f"expert statistics: expert einsum {equation!r} outside a RoutedMoE call.")
  inputs, out = equation.replace(" ", "").split("->")
  lhs_labels, rhs_labels = inputs.split(",")
  contracted = [i for i, c in enumerate(rhs_labels) if c in lhs_labels and c not in out]
  if len(rhs_labels) != 3 or rhs_labels[0] not in out or contracted not in ([1], [2]):
    raise NotImplementedError(f"expert statistics: expert einsum {equation!r}: expected '<tokens..>k,ekn-><..>'; "
                              "set nvfp4_stats_interval=0 for this model.")
  return jnp.einsum(equation, lhs, call.measured_weight(rhs, transposed=contracted == [2]), **kwargs)


def _routing_einsum(equation: str, lhs: jax.Array, rhs: jax.Array, **kwargs: Any) -> jax.Array:
  """Dispatch/combine (routing masks, not weights) stay unquantized; a 3-D right-hand side here would be an expert
  weight that `is_expert_kernel` missed, which must fail rather than train unquantized."""
  if rhs.ndim == 3:
    raise NotImplementedError(f"NVFP4 experts: einsum {equation!r} with a 3-D right-hand side {rhs.shape} came with "
                              "mask axes; an expert weight would run unquantized. Set nvfp4_moe_experts=bf16.")
  return jnp.einsum(equation, lhs, rhs, **kwargs)


def _einsum(equation: str, lhs: jax.Array, rhs: jax.Array, **kwargs: Any) -> jax.Array:
  """An expert einsum "<lhs>,<e k n> -> <out>" (maxtext's: BSM,EMH->BSEH; EBCM,EMH->EBCH; EBNCH,EHM->EBNCM ...).

  lhs carries the contracting label k and either the expert label e (tokens per expert) or not (the same tokens
  for every expert); every other lhs label is a token axis, flattened into the GEMM's rows.
  """
  del kwargs  # precision: NVFP4 fixes it
  call = active_call()
  if call is None:
    raise NotImplementedError(f"NVFP4 expert einsum {equation!r} outside a RoutedMoE call.")
  inputs, out = equation.replace(" ", "").split("->")
  lhs_labels, rhs_labels = inputs.split(",")
  e, k, n = rhs_labels
  if k not in lhs_labels or n in lhs_labels or e not in out or n not in out:
    raise NotImplementedError(f"NVFP4 expert einsum {equation!r}: expected '<tokens..>k,ekn-><..>'.")
  tokens = "".join(c for c in lhs_labels if c not in (e, k))
  lead = e if e in lhs_labels else ""
  x = jnp.einsum(f"{lhs_labels}->{lead}{tokens}{k}", lhs)
  token_shape = x.shape[len(lead):-1]
  x = x.reshape(*x.shape[:len(lead)], -1, x.shape[-1])

  def bf16(x, rhs):
    return jnp.einsum(f"{'e' if lead else ''}tk,ekn->etn", x, rhs).astype(x.dtype)

  y = call.run(call.gemms.batched, bf16, x, rhs)  # (E, T, N)
  y = y.reshape(y.shape[0], *token_shape, y.shape[-1])
  return jnp.einsum(f"{e}{tokens}{n}->{out}", y)
