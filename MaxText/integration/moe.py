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


def wrap_gmm(original: Callable[..., Any]) -> Callable[..., Any]:
  """megablox's gmm: NVFP4 while an NVFP4 RoutedMoE call runs (arguments bound by name)."""
  signature = inspect.signature(original)

  @functools.wraps(original)
  def gmm(*args: Any, **kwargs: Any) -> Any:
    call = experts.active_call()
    if call is None:
      return original(*args, **kwargs)
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
    bound = signature.bind(*args, **kwargs).arguments
    if bound.get("group_offset") is not None:
      _refuse("ragged_dot with group_offset")
    return experts.grouped_gemm(call, bound["lhs"], bound["rhs"], bound["group_sizes"],
                                bound.get("preferred_element_type"))

  return ragged_dot


def wrap_routed_moe_init(original: Callable[..., Any]) -> Callable[..., Any]:
  """RoutedMoE.__init__, then (NVFP4 experts) the layer's ExpertState bridged into NNX with its rng streams."""

  @functools.wraps(original)
  def __init__(self, *args, **kwargs):  # pylint: disable=invalid-name
    original(self, *args, **kwargs)
    if _nvfp4_experts(self):
      state = nnx_wrappers.ToNNX(experts.ExpertState(settings=self.quant.settings, num_experts=int(self.num_experts)),
                                 rngs=self.rngs)
      state.lazy_init()
      setattr(self, STATE_ATTR, state)

  return __init__


def wrap_routed_moe_call(original: Callable[..., Any]) -> Callable[..., Any]:
  """RoutedMoE.__call__ with this layer's ExpertCall current (NVFP4 experts), maxtext's own otherwise."""

  @functools.wraps(original)
  def __call__(self, *args, **kwargs):  # pylint: disable=invalid-name
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
