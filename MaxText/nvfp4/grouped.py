# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""NVFP4 expert GEMMs (MoE): the dense recipe of gemm.py applied per expert, for grouped and batched layouts.

Two layouts maxtext uses for routed experts (W: E x K x N, one K x N matrix per expert):
  grouped  (sparse_matmul=true): x is M x K, tokens sorted by expert, `group_sizes[e]` consecutive rows per
           expert, rows past sum(group_sizes) are padding whose output is 0 (jax.lax.ragged_dot semantics).
  batched  (sparse_matmul=false): x is E x T x K (each expert its own token slots) or T x K shared by every
           expert (maxtext's dropless einsum "BSM,EMH -> BSEH").

Per expert e, exactly the dense recipe (docs/numerics.md#which-operand-gets-what), by calling `nvfp4_dot_general`
under jax.vmap:
  fprop  y_e  = x_e . W_e      x_e 1D along K;           W_e 2D 16x16 tiles (shared with dgrad)
  dgrad  dx_e = dY_e . W_e^T   dY_e 1D along N, SR;      W_e the same tiles
  wgrad  dW_e = x_e^T . dY_e   both 1D along expert e's tokens, RHT (te_nvfp4), SR on dY_e
The "tensor" of every global amax is one expert's operand: W_e (one expert's K x N matrix of the E x K x N stack),
x_e and dY_e (the rows routed to expert e). Why: that is what TE's grouped linear layer does in the stack that
trains MoE in NVFP4 (Megatron-LM with TE's GroupedLinear: one weight parameter and one quantizer per expert,
activations split per expert with `m_splits` and each split quantized with its own amax), and it keeps one
expert's outliers (or one expert's tiny gradients) from setting the scale of the others. A shared x (the
batched T x K layout) is one tensor used by every expert, so it has one amax.

Blocks never straddle experts: each expert's tokens are laid out in their own zero-padded slab of C rows
(C = M rounded up to 16, enough for an expert receiving every row), so every 16-token wgrad block and every
16-row RHT run holds one expert's tokens followed by zeros. That equals padding each group with zero tokens to a
multiple of 16 (Megatron's per-expert padding for FP8/FP4), because zero rows change no amax and no block that
holds real tokens. The cost is honest emulation cost: E x C x K x N multiply-adds instead of M x K x N.
Keys: stochastic rounding of expert e uses jax.random.split(key, E)[e], which `nvfp4_dot_general` splits once more
into its dgrad and wgrad keys.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from MaxText.nvfp4.formats import NVFP4, next_multiple
from MaxText.nvfp4.gemm import MATMUL_DIMS, GemmRecipe, nvfp4_dot_general

__all__ = ["ExpertGemm", "batched_expert_matmul", "grouped_matmul", "group_capacity"]


def group_capacity(rows: int, block: int = NVFP4.block_size) -> int:
  """Rows of each expert's slab: every row could go to one expert, rounded up to the format's block (16 rows)."""
  return next_multiple(rows, block)


def _expert_keys(key: jax.Array | None, experts: int) -> jax.Array | None:
  return None if key is None else jax.random.split(key, experts)


#: One expert's GEMM: (x_e, w_e, key_e, extra_e) -> y_e, differentiable in x_e and w_e.
ExpertGemm = Callable[[jax.Array, jax.Array, Any, Any], jax.Array]


def _nvfp4_expert(recipe: GemmRecipe) -> ExpertGemm:
  def gemm(x_e, w_e, key_e, extra_e):
    del extra_e
    return nvfp4_dot_general(x_e, w_e, MATMUL_DIMS, key=key_e, recipe=recipe)

  return gemm


def batched_expert_matmul(x: jax.Array, w: jax.Array, *, key: jax.Array | None, recipe: GemmRecipe = GemmRecipe(),
                          gemm: ExpertGemm | None = None, extra: Any = None) -> jax.Array:
  """Per-expert NVFP4 GEMMs y[e] = x[e] . w[e] (or x . w[e] for a shared x), each with its own amaxes.

  Args:
    x: E x T x K (expert e's T token slots; zero slots are padding) or T x K (the same tokens for every expert).
      T and K multiples of 16.
    w: E x K x N expert weights (N a multiple of 16); dW takes w's dtype.
    key: PRNG key for stochastic rounding of the output gradients (None only when the recipe has no SR).
    recipe: the recipe switches, as for the dense GEMMs.
    gemm: each expert's GEMM, `gemm(x_e, w_e, key_e, extra_e)`; default the NVFP4 GEMM of `recipe`. A caller that
      wraps the GEMM (the training pipeline's stages, MaxText.backends) passes its own.
    extra: a pytree whose leaves have a leading expert axis (E, ...), handed to `gemm` one expert's slice at a time;
      None: `gemm` gets None.

  Returns:
    E x T x N in x's dtype.
  """
  experts = w.shape[0]
  keys = _expert_keys(key, experts)
  if x.ndim == 2:
    # A shared x is handed to every expert: the same tensor, so the same amax and the same quantized bits in each
    # (and dx sums the experts' dgrads). Broadcast rather than vmap with in_axes=None: the latter trips XLA:CPU
    # ("Unsupported element type for DotThunk: BF16 x BF16 = F32" in the RHT of the unbatched x^T).
    x = jnp.broadcast_to(x, (experts, *x.shape))
  gemm = gemm or _nvfp4_expert(recipe)
  key_axis = None if keys is None else 0  # no stochastic rounding: no keys to map over
  extra_axis = None if extra is None else 0
  return jax.vmap(gemm, in_axes=(0, 0, key_axis, extra_axis))(x, w, keys, extra)


def grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *, key: jax.Array | None,
                   recipe: GemmRecipe = GemmRecipe(), gemm: ExpertGemm | None = None, extra: Any = None) -> jax.Array:
  """`jax.lax.ragged_dot(x, w, group_sizes)` with every expert GEMM in NVFP4 (fprop, dgrad, wgrad).

  Args:
    x: M x K, rows sorted by expert: rows [start_e, start_e + group_sizes[e]) go to expert e; rows past
      sum(group_sizes) are padding (their output is 0 and they get no gradient). K a multiple of 16.
    w: E x K x N (N a multiple of 16).
    group_sizes: E integers (traced), sum <= M. An expert may get zero rows.
    key: PRNG key for stochastic rounding (None only when the recipe has no SR).
    recipe: the recipe switches.
    gemm, extra: each expert's GEMM and its per-expert arguments, as in batched_expert_matmul (each expert's slab
      is its operand).

  Returns:
    M x N in x's dtype.
  """
  rows, experts = x.shape[0], w.shape[0]
  if group_sizes.shape != (experts,):
    raise ValueError(f"grouped_matmul: group_sizes has shape {group_sizes.shape}, expected ({experts},) for "
                     f"weights of shape {w.shape} (one group per expert matrix).")
  capacity = group_capacity(rows, recipe.format.block_size)
  sizes = group_sizes.astype(jnp.int32)
  ends = jnp.cumsum(sizes)
  starts = ends - sizes
  # Expert slabs (E, C, K): slot c of expert e holds row starts[e] + c, or zero past the expert's tokens.
  slot = jnp.arange(capacity, dtype=jnp.int32)
  src = jnp.clip(starts[:, None] + slot[None, :], 0, rows - 1)
  slabs = jnp.where((slot[None, :] < sizes[:, None])[..., None], x[src], jnp.zeros((), x.dtype))
  y_slabs = batched_expert_matmul(slabs, w, key=key, recipe=recipe, gemm=gemm, extra=extra)  # (E, C, N)
  # Back to rows: row r belongs to the first expert whose end is past r; rows past every end are padding.
  row = jnp.arange(rows, dtype=jnp.int32)
  owner = jnp.searchsorted(ends, row, side="right")
  owned = owner < experts
  owner = jnp.minimum(owner, experts - 1)
  y = y_slabs[owner, row - starts[owner]]
  return jnp.where(owned[:, None], y, jnp.zeros((), y.dtype))
