# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What the backends' tests share: one GEMM module's forward and gradients as one compiled program."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax

from MaxText.backends import flags

__all__ = ["gemm_program"]


def gemm_program(module: Any, x: jax.Array, w: jax.Array, dims: Any, *, with_step: bool = True,
                 sink: tuple[str, str] | None = None) -> tuple[dict, Callable]:
  """The variables of one GEMM `module` (a DenseGeneral's dot_general) and `run(variables, step, x, w, dy,
  sink_value=None) -> (y, gradients)`, compiled once.

  The step is a traced argument, as maxtext's is in training, so every step of one configuration runs one program;
  `with_step=False` traces the GEMM outside a train step (no late switch or tap applies). `sink`, a tap's variable as
  (collection, name), takes `sink_value` in place of its init and adds its gradient (what the tap measured) to the
  gradients: (dx, dW, dsink); without it they are (dx, dW).
  """
  rngs = {"params": jax.random.key(1), "dropout": jax.random.key(2)}
  variables = module.init(rngs, x, w, dims)

  def run(variables, step, x, w, dy, sink_value=None):
    def apply(x, w, sink_value):
      values = variables if sink_value is None else {**variables, sink[0]: {**variables[sink[0]], sink[1]: sink_value}}
      with flags.step_scope(step) if with_step else contextlib.nullcontext():
        return module.apply(values, x, w, dims, rngs=rngs, mutable=["aqt"])[0]

    y, vjp = jax.vjp(apply, x, w, sink_value)
    gradients = vjp(dy)
    return y, gradients if sink is not None else gradients[:2]

  return variables, jax.jit(run)
