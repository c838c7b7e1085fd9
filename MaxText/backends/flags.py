# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The BF16 switches as traced values inside a GEMM module: this GEMM's layer and the training step.

- Layer: maxtext builds one layer body for a scanned stack (scan_layers=true) and one per layer otherwise, and
  neither tells the GEMM which layer it is in. Each NVFP4 GEMM therefore holds an int32 `nvfp4_layer` variable
  in the "aqt" collection (stacked along the layer axis under scan, like every per-layer variable); the
  integration layer writes the decoder layer index into it right after maxtext builds the model. The index is a
  fact about the model, not about the config, so a resume with other first/last values reads the right layers.
- Step: while maxtext's train_step/eval_step are traced, the optimizer step of the state they were handed is set
  here (`step_scope`, by the integration layer's step hooks). "Step" is maxtext's training step: the `step` of
  the metrics line whose update is being computed (0 for the first update). Gradient accumulation microbatches
  and evaluations read the step of the state they run on, so neither shifts the switch.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from MaxText.precision.switches import Switches

__all__ = ["LAYER_COLLECTION", "LAYER_NAME", "UNASSIGNED", "current_step", "gemm_flags", "layer_flag", "step_scope"]

#: The per-GEMM variable holding its decoder layer index (-1 until assigned: not a decoder layer GEMM).
LAYER_COLLECTION = "aqt"
LAYER_NAME = "nvfp4_layer"
UNASSIGNED = -1

_current_step: contextvars.ContextVar[jax.Array | None] = contextvars.ContextVar("nvfp4_step", default=None)


def current_step() -> jax.Array | None:
  """The training step of the train/eval step being traced, or None outside one (init, abstract builds)."""
  return _current_step.get()


@contextlib.contextmanager
def step_scope(step: jax.Array) -> Iterator[None]:
  """Makes `step` the current training step for the GEMMs traced inside."""
  token = _current_step.set(step)
  try:
    yield
  finally:
    _current_step.reset(token)


def _reached(at: int | None) -> jax.Array | None:
  """`step >= at` as a traced bool, or None when no switch step is set or no train/eval step is being traced."""
  step = current_step()
  if at is None or step is None:
    return None
  return step >= at


def layer_flag(module: Any, switches: Switches) -> jax.Array | None:
  """Inside a Linen GEMM module: a traced bool, true when this GEMM's decoder layer is a BF16 layer."""
  if not switches.per_layer:
    return None
  index = module.variable(LAYER_COLLECTION, LAYER_NAME, lambda: jnp.full((), UNASSIGNED, jnp.int32)).value
  edge = (index < switches.first_layers) | (index >= switches.num_layers - switches.last_layers)
  named = jnp.isin(index, jnp.asarray(switches.layers, jnp.int32)) if switches.layers else False
  return (index >= 0) & (edge | named)


def gemm_flags(module: Any, switches: Switches) -> tuple[jax.Array | None, jax.Array | None]:
  """(all of this GEMM in BF16, only its forward in BF16): traced bools, or None where no switch applies."""
  full = layer_flag(module, switches)
  late = _reached(switches.from_step)
  if late is not None:
    full = late if full is None else full | late
  return full, _reached(switches.forward_from_step)
