# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The stochastic-rounding key of one GEMM call, shared by the emulated and the TE backend.

Its own module so that both backends (MaxText/backends/emulated.py, MaxText/backends/te.py) depend on it and neither
on the other (no import circle).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

#: Collection and name of the per-GEMM call counter folded into the stochastic-rounding key (see sr_key).
SR_COUNT_COLLECTION = "aqt"
SR_COUNT_NAME = "nvfp4_sr_count"


def sr_key(module: nn.Module) -> jax.Array:
  """The stochastic-rounding key of this GEMM for this call: distinct per layer, per step, reproducible.

  Layer: ToNNX forks its own rng streams per DenseGeneral (and per scanned layer), so make_rng("dropout")
  differs between GEMMs. Step: under scan_layers maxtext discards the rng counters every step, so a uint32 call
  counter in the "aqt" collection (the one DenseGeneral leaves mutable) is folded in; it is model state, saved
  in checkpoints with the rng state, so a resumed run draws the same keys. It counts forward calls: 1 after
  init, +1 per training microbatch (and per eval forward).
  """
  count = module.variable(SR_COUNT_COLLECTION, SR_COUNT_NAME, lambda: jnp.zeros((), jnp.uint32))
  key = jax.random.fold_in(module.make_rng("dropout"), count.value)
  if not module.is_initializing() and module.is_mutable_collection(SR_COUNT_COLLECTION):
    count.value = count.value + jnp.uint32(1)
  return key
