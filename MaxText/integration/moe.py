# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The MoE hooks: maxtext's RoutedMoE and its grouped matmuls routed to the NVFP4 expert GEMMs (backends.experts).

Installed by the seam (MaxText.integration.seam), which checks each signature first:
  * `RoutedMoE.__init__`: each MoE layer whose quant object runs NVFP4 experts gets a small bridged Linen module
    (experts.ExpertState) serving its stochastic-rounding key and BF16 switches.
  * `RoutedMoE.__call__`: reads that state and makes the layer's `ExpertCall` current while the call is traced;
    only for that call, `jax.lax.ragged_dot` (maxtext's megablox=false path looks it up on jax) is routed to the
    NVFP4 grouped GEMM, and restored when the last such call returns: jax itself is never patched for the process.
  * `megablox.gmm` (maxtext's attribute, keyword call from RoutedMoE.sparse_matmul): the NVFP4 grouped GEMM while
    an NVFP4 RoutedMoE call runs, megablox's own otherwise.
A call whose expert GEMMs bypassed all three (a maxtext MoE path not covered) fails instead of training unquantized.

BF16 experts whose weight gradients the statistics measure (nvfp4_mlp_precision=bf16 with nvfp4_stats_interval:
Settings.bf16_mlp_taps) take the same three hooks, which then run maxtext's own GEMM (megablox's gmm, jax's
ragged_dot, jnp.einsum) on the weight stack passed through the measurement (ExpertCall.measured_weight).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from maxtext.layers import nnx_wrappers

from MaxText.backends import experts, table
from MaxText.integration import seam
from MaxText.precision.policy import Precision

__all__ = ["STATE_ATTR", "wrap_gmm", "wrap_ragged_dot", "wrap_routed_moe_call", "wrap_routed_moe_init"]

STATE_ATTR = "nvfp4_experts"  # the RoutedMoE attribute holding ExpertState (no leading "_": NNX state)


def _refuse(what: str) -> None:
  raise NotImplementedError(f"NVFP4 routed experts: {what} is not supported; set nvfp4_moe_experts=bf16.")


def _nvfp4_experts(module: Any) -> bool:
  return getattr(getattr(module, "quant", None), "experts", None) is Precision.NVFP4


def _measured_experts(module: Any) -> bool:
  """BF16 experts whose weight gradients a tap measures (Settings.bf16_mlp_taps; the experts are BF16 there)."""
  return bool(getattr(getattr(getattr(module, "quant", None), "settings", None), "bf16_mlp_taps", ()))


def wrap_gmm(original: Callable[..., Any]) -> Callable[..., Any]:
  """megablox's gmm: NVFP4 while an NVFP4 RoutedMoE call runs (arguments bound by name)."""
  signature = inspect.signature(original)

  @functools.wraps(original)
  def gmm(*args: Any, **kwargs: Any) -> Any:
    call = experts.active_call()
    if call is None:
      return original(*args, **kwargs)
    if call.gemms is None:  # BF16 experts, measured: megablox's own gmm on the measured stack
      return _on_measured_weight(original, signature, call, args, kwargs, transposed="transpose_rhs")
    bound = signature.bind(*args, **kwargs).arguments
    if bound.get("partial_sum") is not None or bound.get("existing_out") is not None:
      _refuse("a partial-sum gmm (num_moe_emb_chunks)")
    if bound.get("transpose_rhs"):
      _refuse("gmm with transpose_rhs")
    lhs, rhs, group_sizes = bound["lhs"], bound["rhs"], bound["group_sizes"]
    if rhs.shape[0] != group_sizes.shape[0]:
      _refuse(f"a gmm over {rhs.shape[0]} of {group_sizes.shape[0]} experts (expert parallelism)")
    return experts.grouped_gemm(call, lhs, rhs, group_sizes, bound.get("preferred_element_type"))

  return gmm


def wrap_ragged_dot(original: Callable[..., Any]) -> Callable[..., Any]:
  """jax.lax.ragged_dot while an NVFP4 RoutedMoE call is traced: its expert GEMMs in NVFP4, jax's otherwise."""
  signature = inspect.signature(original)

  @functools.wraps(original)
  def ragged_dot(*args: Any, **kwargs: Any) -> Any:
    call = experts.active_call()
    if call is None:  # another thread's model, or a ragged_dot that is not an expert GEMM of this layer
      return original(*args, **kwargs)
    if call.gemms is None:  # BF16 experts, measured: jax's own ragged_dot on the measured stack
      return _on_measured_weight(original, signature, call, args, kwargs)
    bound = signature.bind(*args, **kwargs).arguments
    if bound.get("group_offset") is not None:
      _refuse("ragged_dot with group_offset")
    return experts.grouped_gemm(call, bound["lhs"], bound["rhs"], bound["group_sizes"],
                                bound.get("preferred_element_type"))

  return ragged_dot


def _on_measured_weight(original: Callable[..., Any], signature: inspect.Signature, call: experts.ExpertCall,
                        args: tuple[Any, ...], kwargs: dict[str, Any], transposed: str | None = None) -> Any:
  """`original(*args, **kwargs)` with its `rhs` (the expert weight stack) through call.measured_weight; `transposed`
  names the argument saying rhs is (E, N, K)."""
  bound = signature.bind(*args, **kwargs)
  flipped = bool(bound.arguments.get(transposed)) if transposed else False
  bound.arguments["rhs"] = call.measured_weight(bound.arguments["rhs"], transposed=flipped)
  return original(*bound.args, **bound.kwargs)


def wrap_routed_moe_init(original: Callable[..., Any]) -> Callable[..., Any]:
  """RoutedMoE.__init__, then (NVFP4 experts, or measured BF16 experts) the layer's ExpertState bridged into NNX with
  its rng streams."""

  @functools.wraps(original)
  def __init__(self, *args, **kwargs):  # pylint: disable=invalid-name
    original(self, *args, **kwargs)
    if _nvfp4_experts(self) or _measured_experts(self):
      quantized = _nvfp4_experts(self)
      # Measured BF16 experts draw no random numbers, and forking the layer's Rngs would move every later parameter's
      # initial draw: the baseline with statistics would start from other weights than without.
      state = nnx_wrappers.ToNNX(experts.ExpertState(settings=self.quant.settings, num_experts=int(self.num_experts),
                                                     quantized=quantized), rngs=self.rngs if quantized else None)
      state.lazy_init()
      setattr(self, STATE_ATTR, state)

  return __init__


def wrap_routed_moe_call(original: Callable[..., Any]) -> Callable[..., Any]:
  """RoutedMoE.__call__ with this layer's ExpertCall current (NVFP4 experts, or measured BF16 experts), maxtext's own
  otherwise."""

  @functools.wraps(original)
  def __call__(self, *args, **kwargs):  # pylint: disable=invalid-name
    if _measured_experts(self):
      return _measured_call(original, self, args, kwargs)
    if not _nvfp4_experts(self):
      return original(self, *args, **kwargs)
    gemms = table.expert_gemms(self.quant.backend)
    if gemms is None:  # the config validator refuses this first; kept as the last line of defence
      raise NotImplementedError(f"NVFP4 routed experts on the {self.quant.backend.value} backend: "
                                f"{experts.TE_MISSING}. Set nvfp4_moe_experts=bf16.")
    key, state, sinks = getattr(self, STATE_ATTR)(mutable=["aqt"])
    call = experts.ExpertCall(gemms, self.quant.settings.recipe, key, state, sinks)
    with experts.expert_call(call), seam.installed_during("moe call"):
      out = original(self, *args, **kwargs)
    if call.gemms_run == 0:  # maxtext took an expert path the hooks do not cover: never silently unquantized
      raise NotImplementedError("NVFP4 routed experts: this RoutedMoE call ran its expert GEMMs outside the NVFP4 "
                                "hooks (megablox gmm, jax.lax.ragged_dot, quant.einsum), so they would train "
                                "unquantized. Set nvfp4_moe_experts=bf16, or use maxtext's default MoE settings.")
    return out

  return __call__


def _measured_call(original: Callable[..., Any], module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
  """A BF16 RoutedMoE call whose expert GEMMs' weight gradients are measured: maxtext's own GEMMs (gemms None)."""
  _, state, sinks = getattr(module, STATE_ATTR)(mutable=["aqt"])
  call = experts.ExpertCall(None, module.quant.settings.recipe, None, state, sinks)
  with experts.expert_call(call), seam.installed_during("moe call"):
    out = original(module, *args, **kwargs)
  if call.gemms_run == 0:  # never a statistic that silently misses the experts
    raise NotImplementedError("expert statistics: this RoutedMoE call ran its BF16 expert GEMMs outside the hooks "
                              "(megablox gmm, jax.lax.ragged_dot, quant.einsum), so their weight gradients would go "
                              "unmeasured. Set nvfp4_stats_interval=0, or use maxtext's default MoE settings.")
  return out
