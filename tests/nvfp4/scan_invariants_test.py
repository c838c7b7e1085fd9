# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Nothing the quantizer computes at the operand's size (or its blocks') is a constant to JAX.

Why: under scan_layers, JAX's partial evaluation of the layer loop computes everything that depends on no loop input
once, outside the loop, and passes it in (jax's `_scan_partial_eval`: loop-invariant values are hoisted). A
`jnp.where(p, 2.0, ...)` branch, a `zeros`, an `iota` or a constant broadcast against an operand then becomes a
full-size array made before the loop and read by every layer: about 10 GB per GPU and a third of the fused
backend's elementwise time on the 8B recipe for 4 x GB300 before arithmetic.anchored. No CPU run shows the cost, so this
reads the jaxpr: every equation whose result has at least one element per block must depend on an input.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jcore

from MaxText.nvfp4 import stats
from MaxText.nvfp4.block_scaled import quantize_block_scaled, quantize_codes
from MaxText.nvfp4.formats import BLOCK_SIZE
from MaxText.nvfp4.quantize import quantize

SHAPE = (64, 128)  # 512 blocks; the RHT's 16 x 16 matrix and a 128-long iota are smaller, and may be constants


def _constant_arrays(closed: jcore.ClosedJaxpr, min_size: int) -> list[str]:
  """Equations (in nested jits and both branches of conds too) whose result has >= min_size elements and depends on
  none of the function's inputs."""
  found = []

  def walk(jaxpr: jcore.Jaxpr, live: set) -> None:
    for eqn in jaxpr.eqns:
      inputs = [v for v in eqn.invars if not isinstance(v, jcore.Literal)]
      for sub, args in _subjaxprs(eqn):
        walk(sub, {s for s, v in zip(sub.invars, args) if not isinstance(v, jcore.Literal) and v in live})
      if any(v in live for v in inputs):
        live.update(eqn.outvars)
      elif any(np.prod(getattr(o.aval, "shape", ())) >= min_size for o in eqn.outvars):
        found.append(f"{eqn.primitive.name} -> {eqn.outvars[0].aval}")

  walk(closed.jaxpr, set(closed.jaxpr.invars))
  return found


def _subjaxprs(eqn: jcore.JaxprEqn) -> list[tuple[jcore.Jaxpr, list]]:
  if eqn.primitive.name == "cond":
    return [(branch.jaxpr, eqn.invars[1:]) for branch in eqn.params["branches"]]
  inner = eqn.params.get("jaxpr")
  if inner is not None:
    return [(getattr(inner, "jaxpr", inner), eqn.invars)]
  return []


_CALLS = {
    "codes 1d": lambda x, k: quantize_codes(x, "1d"),
    "codes 2d": lambda x, k: quantize_codes(x, "2d"),
    "codes rht sr axis 0": lambda x, k: quantize_codes(x, "1d", rht=True, stochastic_rounding=True, key=k, axis=0),
    "block_scaled 1d sr": lambda x, k: quantize_block_scaled(x, "1d", stochastic_rounding=True, key=k),
    "block_scaled 2d": lambda x, k: quantize_block_scaled(x, "2d"),
    "block_scaled rht sr axis 0": lambda x, k: quantize_block_scaled(x, "1d", rht=True, stochastic_rounding=True,
                                                                     key=k, axis=0),
    "quantize 1d rht": lambda x, k: quantize(x, "1d", rht=True),
    "statistics rht axis 0": lambda x, k: stats.quantization_stats(x, rht=True, axis=0),
}


@pytest.mark.parametrize("name", sorted(_CALLS))
def test_no_operand_sized_constant(name):
  x = jnp.zeros(SHAPE, jnp.bfloat16)
  closed = jax.make_jaxpr(_CALLS[name])(x, jax.random.key(0))
  assert _constant_arrays(closed, x.size // BLOCK_SIZE) == []
