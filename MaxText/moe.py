# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""NVFP4 routed-expert GEMMs inside maxtext's RoutedMoE, on both MoE paths, without editing maxtext.

maxtext 0.2.5 (layers/moe.py) runs the expert GEMMs (wi_0, wi_1 or the fused wi, wo) in one of two ways:
  sparse_matmul=true   grouped matmuls over expert-sorted tokens: `mblx.gmm(...)` (megablox=true or
                       use_tokamax_gmm=true) or `jax.lax.ragged_dot(...)` (megablox=false). The quant object is only
                       read for `quant_dg` / `quantize_dtype` (megablox's own int8/fp8 quantization); ours has
                       neither, so megablox never quantizes on its own.
  sparse_matmul=false  einsums from `quant.einsum(mesh_axes=kernel_axes)`, applied through
                       `quantizations.apply_einsum_in_nnx` ("BSM,EMH -> BSEH" dropless, "EBCM,EMH -> EBCH" with
                       capacity); the same hook serves the dispatch/combine einsums, which stay unquantized.
How this module hooks in, as the plugin does elsewhere (attributes looked up at call time, wrapped once):
  * `RoutedMoE.__init__` gives each MoE layer whose quant object runs NVFP4 experts a small bridged Linen
    module (_ExpertState) serving its stochastic-rounding key (sr.sr_key: per layer, per step, checkpointed
    counter) and the BF16 switches (switches.gemm_flags: BF16 layers by decoder index, late switch by step).
  * `RoutedMoE.__call__` reads that state and marks, in a context variable, that this layer's expert GEMMs are
    NVFP4 while it runs (synchronously, during tracing; thread-safe, nothing global is swapped).
  * `mblx.gmm` and `jax.lax.ragged_dot` run `expert_gemms(backend).grouped` while that mark is set and are
    maxtext's/jax's own otherwise; `Nvfp4Quantization.einsum` returns `expert_einsum` for expert kernels.
The router (GateLogit, a dot_general with axes ("embed", None)) and shared experts (DenseGenerals with MLP axes)
go through the dense policy: router unquantized, shared experts by the MLP rule.

TransformerEngine: TE 2.20.2's JAX grouped GEMM supports BF16, FP8 and MXFP8 only, so `expert_gemms(Backend.TE)`
is None and the config validator requires nvfp4_moe_experts=bf16 with the TE backend. A TE release with an NVFP4
grouped GEMM is adopted by returning its implementation from `_te_expert_gemms` (nothing else changes).
"""

import contextvars
import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from MaxText.backend import Backend, Environment, resolve_backend
from MaxText.nvfp4 import grouped
from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.policy import Precision
from MaxText.sr import sr_key
from MaxText.switches import Switches, gemm_flags

__all__ = ["ExpertGemms", "config_error", "expert_einsum", "expert_gemms", "expert_plan", "experts_precision",
           "install", "is_expert_kernel", "with_experts"]

#: `quant.einsum(mesh_axes=...)` serves two kinds of right-hand sides in RoutedMoE.dense_matmul: expert kernels,
#: always 3-D (E, K, N) with axes such as ("exp", "embed_moe", "mlp_moe"), ("exp", None, "mlp") (capacity path),
#: ("embed_moe", None, "mlp_moe") (fsdp), ("expert_only", "embed_moe", None) (batch split), and the dispatch/combine
#: masks, 4-D or 5-D with "activation_*" axes.
_MASK_AXIS_PREFIX = "activation"
_STATE_ATTR = "nvfp4_experts"  # the RoutedMoE attribute holding _ExpertState (no leading "_": NNX state)
_unquantized_ragged_dot = jax.lax.ragged_dot  # jax's own, before install() wraps the attribute
_MARK = "_nvfp4_moe_wrapper"


@dataclasses.dataclass(frozen=True)
class ExpertGemms:
  """One backend's expert GEMMs: grouped (ragged_dot layout) and batched (einsum layout); see nvfp4/grouped.py."""

  name: str
  grouped: Callable[..., jax.Array]  # (x, w, group_sizes, *, key, recipe) -> y
  batched: Callable[..., jax.Array]  # (x, w, *, key, recipe) -> y[e]


_EMULATED = ExpertGemms("MaxText.nvfp4.grouped emulation (per-expert amax)", grouped.grouped_matmul,
                        grouped.batched_expert_matmul)
#: Why the TE backend has no NVFP4 expert GEMMs (NVFP4_SPEC.md §8).
TE_MISSING = ("TransformerEngine 2.20.2's JAX grouped GEMM supports BF16, FP8 and MXFP8 only (no NVFP4), and "
              "maxtext's te_moe_block accepts te_mxfp8 or te_no_quant only")


def _te_expert_gemms() -> ExpertGemms | None:
  """TE's NVFP4 grouped GEMMs, the one place to adopt them: None while TE has none (TE_MISSING)."""
  return None


def expert_gemms(backend: Backend) -> ExpertGemms | None:
  """The expert GEMM implementation of a backend, or None where the backend has no NVFP4 grouped GEMM."""
  return _EMULATED if backend is Backend.EMULATED else _te_expert_gemms()


def _value(setting: Any) -> str:
  return str(getattr(setting, "value", setting))


def experts_precision(config: Any, mlp: Precision) -> Precision:
  """Routed experts are MLPs: NVFP4 when the MLP GEMMs are and nvfp4_moe_experts=nvfp4, else BF16."""
  wanted = _value(getattr(config, "nvfp4_moe_experts", "nvfp4"))
  return Precision.NVFP4 if mlp is Precision.NVFP4 and wanted == "nvfp4" else Precision.BF16


def expert_plan(precision: Precision, backend: Backend) -> tuple[Precision, str]:
  """(precision, implementation) of the routed-expert GEMMs, for the precision plan."""
  if precision is not Precision.NVFP4:
    return Precision.BF16, "maxtext RoutedMoE matmuls (unquantized, nvfp4_moe_experts=bf16 or MLP bf16)"
  gemms = expert_gemms(backend)
  return precision, (gemms.name if gemms else f"none: {TE_MISSING}")


def config_error(config: Any, mode: str, env: Environment | None = None) -> str | None:
  """Why this config cannot run NVFP4 routed experts (one line naming keys, values and what works), or None.

  Checked when the config loads: routed experts (num_experts > 1) whose MLP precision asks for NVFP4. `env`
  describes TE and the GPUs (probed when None) for resolving nvfp4_backend=te/auto.
  """
  num_experts = int(getattr(config, "num_experts", 1) or 1)
  if num_experts <= 1 or experts_precision(config, Precision(_value(config.nvfp4_mlp_precision))) is Precision.BF16:
    return None
  where = f"quantization={mode} with num_experts={num_experts}"
  backend = _value(config.nvfp4_backend)
  if backend != "emulated":
    resolved = resolve_backend(backend, env)  # "te" where TE cannot run raises its own one-line error
    if expert_gemms(resolved) is None:
      return (f"{where} and nvfp4_backend={backend} (-> {resolved.value}): no NVFP4 expert GEMMs on this backend "
              f"({TE_MISSING}). Set nvfp4_moe_experts=bf16 (experts BF16, dense GEMMs NVFP4) or "
              "nvfp4_backend=emulated.")
  unsupported = [(key, getattr(config, key, None), why) for key, why in (
      ("ici_expert_parallelism", "expert parallelism"), ("dcn_expert_parallelism", "expert parallelism"),
      ("num_moe_emb_chunks", "chunked expert GEMMs"), ("use_ring_of_experts", "ring of experts"),
      ("te_moe_block", "TE's MoE block")) if (getattr(config, key, 0) or 0) not in (0, 1, False)]
  if unsupported:
    key, value, why = unsupported[0]
    return (f"{where}: {key}={value} ({why}) is not supported with NVFP4 experts. Unset it, or set "
            "nvfp4_moe_experts=bf16.")
  for key in ("emb_dim", "moe_mlp_dim"):
    size = int(getattr(config, key, 0) or 0)
    if size % 16:
      return (f"{where}: {key}={size} is not a multiple of 16 (NVFP4 blocks every expert GEMM dim by 16). Use a "
              "multiple of 16, or nvfp4_moe_experts=bf16.")
  return None


# ---------------------------------------------------------------------------------------------------------------
# The expert GEMMs of one RoutedMoE call.


@dataclasses.dataclass
class _ExpertCall:
  """What the GEMMs of the RoutedMoE call being traced need: implementation, recipe, key, the BF16 switches
  (traced bools or None, switches.gemm_flags) and a call counter."""

  gemms: ExpertGemms
  recipe: GemmRecipe
  key: jax.Array | None
  all_bf16: jax.Array | None
  forward_bf16: jax.Array | None
  calls: Any = dataclasses.field(default_factory=itertools.count)
  gemms_run: int = 0  # expert GEMMs that went through the hooks in this call

  def run(self, nvfp4: Callable[..., jax.Array], bf16: Callable[..., jax.Array], *operands: jax.Array) -> jax.Array:
    """The NVFP4 GEMM, or (BF16 layer / past nvfp4_bf16_from_step) the unquantized one, picked by lax.cond."""
    if self.all_bf16 is None:
      return nvfp4(*operands)
    return jax.lax.cond(self.all_bf16, bf16, nvfp4, *operands)

  def next_key(self) -> jax.Array | None:
    """A distinct key per expert GEMM of the layer (wi_0, wi_1, wo, in call order)."""
    return None if self.key is None else jax.random.fold_in(self.key, next(self.calls))


_ACTIVE: contextvars.ContextVar[_ExpertCall | None] = contextvars.ContextVar("nvfp4_expert_call", default=None)


class _ExpertState(nn.Module):
  """A RoutedMoE layer's NVFP4 expert state, bridged into NNX: the stochastic-rounding key (sr.sr_key: rng stream
  plus a checkpointed call counter) and the BF16 switches (switches.gemm_flags: this layer's decoder index, written
  after model build, and the training step), returned as (key or None, all_bf16, forward_bf16)."""

  stochastic_rounding: bool
  switches: Switches

  @nn.compact
  def __call__(self) -> tuple[jax.Array | None, jax.Array | None, jax.Array | None]:
    key = sr_key(self) if self.stochastic_rounding else None
    return (key, *gemm_flags(self, self.switches))


def _nvfp4_experts(module: Any) -> bool:
  return getattr(getattr(module, "quant", None), "experts", None) is Precision.NVFP4


def is_expert_kernel(mesh_axes: tuple[str | None, ...]) -> bool:
  """Whether `quant.einsum(mesh_axes=...)` is asked for an expert-weight einsum (not a dispatch/combine mask)."""
  return len(mesh_axes) == 3 and not any(str(a).startswith(_MASK_AXIS_PREFIX) for a in mesh_axes if a)


def _grouped(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, preferred_element_type: Any) -> jax.Array:
  call = _ACTIVE.get()
  call.gemms_run += 1
  key = call.next_key()
  forward_bf16 = False if call.forward_bf16 is None else call.forward_bf16

  def nvfp4(lhs, rhs, group_sizes):
    return call.gemms.grouped(lhs, rhs, group_sizes, key=key, recipe=call.recipe, forward_bf16=forward_bf16)

  def bf16(lhs, rhs, group_sizes):
    return _unquantized_ragged_dot(lhs, rhs, group_sizes, preferred_element_type=lhs.dtype)

  return call.run(nvfp4, bf16, lhs, rhs, group_sizes).astype(preferred_element_type or lhs.dtype)


def _refuse(what: str) -> None:
  raise NotImplementedError(f"NVFP4 routed experts: {what} is not supported; set nvfp4_moe_experts=bf16.")


def _wrap_gmm(original: Callable[..., Any]) -> Callable[..., Any]:
  """megablox's gmm (keyword call from RoutedMoE.sparse_matmul): NVFP4 while an NVFP4 RoutedMoE call runs."""

  @functools.wraps(original)
  def gmm(lhs, rhs, group_sizes, *args, **kwargs):
    if _ACTIVE.get() is None or args:
      return original(lhs, rhs, group_sizes, *args, **kwargs)
    if kwargs.get("partial_sum") is not None or kwargs.get("existing_out") is not None:
      _refuse("a partial-sum gmm (num_moe_emb_chunks)")
    if kwargs.get("transpose_rhs"):
      _refuse("gmm with transpose_rhs")
    if rhs.shape[0] != group_sizes.shape[0]:
      _refuse(f"a gmm over {rhs.shape[0]} of {group_sizes.shape[0]} experts (expert parallelism)")
    return _grouped(lhs, rhs, group_sizes, kwargs.get("preferred_element_type"))

  setattr(gmm, _MARK, True)
  return gmm


def _wrap_ragged_dot(original: Callable[..., Any]) -> Callable[..., Any]:
  """jax.lax.ragged_dot (RoutedMoE.sparse_matmul with megablox=false): NVFP4 while an NVFP4 RoutedMoE call runs."""

  @functools.wraps(original)
  def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None):
    if _ACTIVE.get() is None:
      return original(lhs, rhs, group_sizes, precision=precision, preferred_element_type=preferred_element_type,
                      group_offset=group_offset)
    if group_offset is not None:
      _refuse("ragged_dot with group_offset")
    return _grouped(lhs, rhs, group_sizes, preferred_element_type)

  setattr(ragged_dot, _MARK, True)
  return ragged_dot


def _wrap_init(original: Callable[..., Any]) -> Callable[..., Any]:
  @functools.wraps(original)
  def __init__(self, *args, **kwargs):  # pylint: disable=invalid-name
    original(self, *args, **kwargs)
    if _nvfp4_experts(self):
      from maxtext.layers import nnx_wrappers  # pylint: disable=import-outside-toplevel

      state = nnx_wrappers.ToNNX(_ExpertState(stochastic_rounding=self.quant.policy.recipe.stochastic_rounding,
                                              switches=self.quant.switches), rngs=self.rngs)
      state.lazy_init()
      setattr(self, _STATE_ATTR, state)

  setattr(__init__, _MARK, True)
  return __init__


def _wrap_call(original: Callable[..., Any]) -> Callable[..., Any]:
  @functools.wraps(original)
  def __call__(self, *args, **kwargs):  # pylint: disable=invalid-name
    if not _nvfp4_experts(self):
      return original(self, *args, **kwargs)
    gemms = expert_gemms(self.quant.backend)
    if gemms is None:  # the config validator refuses this first; kept as the last line of defence
      raise NotImplementedError(f"NVFP4 routed experts on the {self.quant.backend.value} backend: {TE_MISSING}. "
                                "Set nvfp4_moe_experts=bf16.")
    key, all_bf16, forward_bf16 = getattr(self, _STATE_ATTR)(mutable=["aqt"])
    call = _ExpertCall(gemms, self.quant.policy.recipe, key, all_bf16, forward_bf16)
    token = _ACTIVE.set(call)
    try:
      out = original(self, *args, **kwargs)
    finally:
      _ACTIVE.reset(token)
    if call.gemms_run == 0:  # maxtext took an expert path the hooks do not cover: never silently unquantized
      raise NotImplementedError("NVFP4 routed experts: this RoutedMoE call ran its expert GEMMs outside the NVFP4 "
                                "hooks (megablox gmm, jax.lax.ragged_dot, quant.einsum), so they would train "
                                "unquantized. Set nvfp4_moe_experts=bf16, or use maxtext's default MoE settings.")
    return out

  setattr(__call__, _MARK, True)
  return __call__


def expert_einsum(mesh_axes: tuple[str | None, ...]) -> Callable[..., jax.Array]:
  """What `Nvfp4Quantization.einsum(mesh_axes=...)` returns: NVFP4 for expert kernels, jnp.einsum otherwise."""
  return _einsum if is_expert_kernel(mesh_axes) else _routing_einsum


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
  call = _ACTIVE.get()
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
  call.gemms_run += 1
  key = call.next_key()
  forward_bf16 = False if call.forward_bf16 is None else call.forward_bf16

  def nvfp4(x, rhs):
    return call.gemms.batched(x, rhs, key=key, recipe=call.recipe, forward_bf16=forward_bf16)  # (E, T, N)

  def bf16(x, rhs):
    return jnp.einsum(f"{'e' if lead else ''}tk,ekn->etn", x, rhs).astype(x.dtype)

  y = call.run(nvfp4, bf16, x, rhs)
  y = y.reshape(y.shape[0], *token_shape, y.shape[-1])
  return jnp.einsum(f"{e}{tokens}{n}->{out}", y)


def install() -> None:
  """Wraps RoutedMoE.__init__/__call__, megablox's gmm and jax.lax.ragged_dot once (idempotent)."""
  # pylint: disable=import-outside-toplevel
  from maxtext.kernels import megablox
  from maxtext.layers import moe

  for owner, name, wrap in ((moe.RoutedMoE, "__init__", _wrap_init), (moe.RoutedMoE, "__call__", _wrap_call),
                            (megablox, "gmm", _wrap_gmm), (jax.lax, "ragged_dot", _wrap_ragged_dot)):
    original = getattr(owner, name)
    if not getattr(original, _MARK, False):
      setattr(owner, name, wrap(original))


def with_experts(quant: Any, config: Any) -> Any:
  """The quant object with its routed-expert precision set from the config; installs the hooks when NVFP4."""
  experts = experts_precision(config, quant.policy.mlp)
  if experts is Precision.NVFP4:
    install()
  return dataclasses.replace(quant, experts=experts,
                             experts_opted_out=_value(getattr(config, "nvfp4_moe_experts", "nvfp4")) == "bf16")
