# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The recipe's BF16 switches: BF16 first/last decoder layers and the late switch of GEMMs to BF16.

NVIDIA's NVFP4 pretraining paper keeps some blocks in BF16 (12B: the first 2 and last 8 of 62) and switches the
GEMMs (or only the forward pass) to BF16 for the last part of training. Neither may need a maxtext edit and both
must hold in one compiled program, so both are decided by traced values inside the GEMM:

- Layer: maxtext builds one layer body for a scanned stack (scan_layers=true) and one per layer otherwise, and
  neither tells the GEMM which layer it is in. Each NVFP4 GEMM therefore holds an int32 `nvfp4_layer` variable
  in the "aqt" collection (stacked along the layer axis under scan, like every per-layer variable), and
  `assign_layer_indices` writes the decoder layer index into it right after maxtext builds the model (the
  plugin's `maybe_quantize_model` hook). The index is a fact about the model, not about the config, so a resume
  with other first/last values reads the right layers from the same checkpoint.
- Step: `install_step_hooks` wraps maxtext's `train_step` and `eval_step` (module attributes of its pre-training
  trainer, looked up when the train loop starts) so that while they are traced the optimizer step of the state
  they were handed is available to the GEMMs (`current_step`). "Step" is maxtext's training step: the `step`
  of the metrics line whose update is being computed (0 for the first update). Gradient accumulation
  microbatches and evaluations read the step of the state they run on, so neither shifts the switch.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

_LOG = logging.getLogger(__name__)

#: The per-GEMM variable holding its decoder layer index (-1 until assigned: not a decoder layer GEMM).
LAYER_COLLECTION = "aqt"
LAYER_NAME = "nvfp4_layer"
_UNASSIGNED = -1

_MARK = "_nvfp4_plugin_wrapper"  # as in plugin.py: never wrap a wrapper
_current_step: contextvars.ContextVar[jax.Array | None] = contextvars.ContextVar("nvfp4_step", default=None)
_switch_logged: set[tuple[str, int]] = set()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Switches:
  """The four nvfp4_bf16_* keys, with the layer count they refer to; hashable so Linen modules can hold it."""

  first_layers: int = 0
  last_layers: int = 0
  num_layers: int = 0
  from_step: int | None = None
  forward_from_step: int | None = None

  @property
  def per_layer(self) -> bool:
    return bool(self.first_layers or self.last_layers)

  @property
  def any(self) -> bool:
    return self.per_layer or self.from_step is not None or self.forward_from_step is not None

  def bf16_layer(self, index: int) -> bool:
    """Whether decoder layer `index` (0-based) runs its MLP GEMMs in BF16."""
    return index < self.first_layers or index >= self.num_layers - self.last_layers

  def describe(self) -> dict[str, Any]:
    return {"bf16_first_layers": self.first_layers, "bf16_last_layers": self.last_layers,
            "bf16_from_step": self.from_step, "bf16_forward_from_step": self.forward_from_step}


def switches_from_config(config: Any) -> Switches:
  return Switches(first_layers=int(getattr(config, "nvfp4_bf16_first_layers", 0) or 0),
                  last_layers=int(getattr(config, "nvfp4_bf16_last_layers", 0) or 0),
                  num_layers=int(getattr(config, "num_decoder_layers", 0) or 0),
                  from_step=getattr(config, "nvfp4_bf16_from_step", None),
                  forward_from_step=getattr(config, "nvfp4_bf16_forward_from_step", None))


# --- Step ---------------------------------------------------------------------------------------------------


def current_step() -> jax.Array | None:
  """The training step of the train/eval step being traced, or None outside one (init, abstract builds)."""
  return _current_step.get()


@contextlib.contextmanager
def step_scope(step: jax.Array) -> Iterator[None]:
  token = _current_step.set(step)
  try:
    yield
  finally:
    _current_step.reset(token)


def _state_step(state: Any) -> jax.Array | None:
  """The optimizer step of maxtext's NNX train state (a pure nnx.State), or None if it has none."""
  try:
    step = state["optimizer"]["step"]
  except (KeyError, TypeError):
    step = getattr(getattr(state, "optimizer", None), "step", None)
  if step is None:
    return None
  return jnp.asarray(step.get_value() if hasattr(step, "get_value") else step)


def _with_step(step_fn: Callable[..., Any], state_index: int) -> Callable[..., Any]:
  """Wraps maxtext's train_step/eval_step so the GEMMs traced inside see the state's step."""

  @functools.wraps(step_fn)
  def wrapped(*args: Any, **kwargs: Any) -> Any:
    state = kwargs.get("state", args[state_index] if len(args) > state_index else None)
    step = _state_step(state)
    if step is None:
      return step_fn(*args, **kwargs)
    with step_scope(step):
      return step_fn(*args, **kwargs)

  setattr(wrapped, _MARK, True)
  return wrapped


def _logging_iteration(iteration: Callable[..., Any]) -> Callable[..., Any]:
  """Wraps maxtext's `training_loop_iteration` (host side, once per step) to log a switch step when reached.

  Host side on purpose: a `jax.debug.callback` in the step would block ahead-of-time lowering for another
  platform (train_compile, our CUDA lowering tests) and add a host round trip per step.
  """

  @functools.wraps(iteration)
  def wrapped(jax_device_state: Any, python_vars: Any, immutable_data: Any) -> Any:
    _log_when_reached(immutable_data.get("config"), int(python_vars["step"]))
    return iteration(jax_device_state, python_vars, immutable_data)

  setattr(wrapped, _MARK, True)
  return wrapped


def install_step_hooks(train_module: Any) -> None:
  """Wraps `train_step` (state is its 5th argument), `eval_step` (3rd) and `training_loop_iteration` of maxtext's
  pre-training trainer."""
  for name, wrap in (("train_step", lambda f: _with_step(f, 4)), ("eval_step", lambda f: _with_step(f, 2)),
                     ("training_loop_iteration", _logging_iteration)):
    original = getattr(train_module, name, None)
    if original is not None and not getattr(original, _MARK, False):
      setattr(train_module, name, wrap(original))


def _log_when_reached(config: Any, step: int) -> None:
  """Logs, once per process and switch, that training reached a switch step (at it, or resumed past it)."""
  from MaxText.config import NVFP4_MODES  # pylint: disable=import-outside-toplevel

  quantization = getattr(config, "quantization", None)
  if str(getattr(quantization, "value", quantization) or "") not in NVFP4_MODES:
    return
  switches = switches_from_config(config)
  for key, at, what in (("nvfp4_bf16_from_step", switches.from_step, "all NVFP4 GEMMs (forward and backward)"),
                        ("nvfp4_bf16_forward_from_step", switches.forward_from_step, "the forward NVFP4 GEMMs")):
    if at is not None and step >= at and (key, at) not in _switch_logged:
      _switch_logged.add((key, at))
      _LOG.warning("NVFP4: from step %d on (%s=%d), %s run in BF16", step, key, at, what)


def _reached(at: int | None) -> jax.Array | None:
  """`step >= at` as a traced bool, or None when no switch step is set or no train/eval step is being traced."""
  step = current_step()
  if at is None or step is None:
    return None
  return step >= at


# --- Layer --------------------------------------------------------------------------------------------------


def layer_flag(module: Any, switches: Switches) -> jax.Array | None:
  """Inside a Linen GEMM module: a traced bool, true when this GEMM's decoder layer is a BF16 layer."""
  if not switches.per_layer:
    return None
  index = module.variable(LAYER_COLLECTION, LAYER_NAME, lambda: jnp.full((), _UNASSIGNED, jnp.int32)).value
  return (index >= 0) & ((index < switches.first_layers) | (index >= switches.num_layers - switches.last_layers))


def gemm_flags(module: Any, switches: Switches) -> tuple[jax.Array | None, jax.Array | None]:
  """(all of this GEMM in BF16, only its forward in BF16): traced bools, or None where no switch applies."""
  full = layer_flag(module, switches)
  late = _reached(switches.from_step)
  if late is not None:
    full = late if full is None else full | late
  return full, _reached(switches.forward_from_step)


#: Decoder layer containers of maxtext's NNX decoders, in model order: scanned stacks ("layers", "dense_layers",
#: "moe_layers") and their unscanned forms ("layers_3", ...).
_STACK_RE = re.compile(r"^(?P<stack>dense_layers|moe_layers|layers)(?:_(?P<index>\d+))?$")


def assign_layer_indices(model: Any, switches: Switches, first_num_dense_layers: int = 0) -> int:
  """Writes each NVFP4 GEMM's decoder layer index into its `nvfp4_layer` variable; returns how many were set.

  Raises:
    ValueError: a GEMM holding the variable sits in a decoder layout this does not know (e.g. scanned blocks of
      several layers), so BF16 first/last layers cannot be honoured there.
  """
  from flax import nnx  # pylint: disable=import-outside-toplevel

  assigned = 0
  for path, node in nnx.iter_graph(model):
    if not (isinstance(node, nnx.Variable) and path and path[-1] == LAYER_NAME):
      continue
    parts = [str(p) for p in path]
    match = _STACK_RE.match(parts[1]) if len(parts) > 1 and parts[0] == "decoder" else None
    if match is None:
      raise ValueError(f"nvfp4_bf16_first_layers/last_layers: the NVFP4 GEMM at {'/'.join(parts[:-1])} is not in a "
                       "decoder layer layout the plugin knows (decoder/layers, dense_layers, moe_layers, scanned or "
                       "not); unset both keys for this model.")
    offset = first_num_dense_layers if match["stack"] == "moe_layers" else 0
    shape = tuple(getattr(node.get_value(), "shape", ()))
    if match["index"] is not None:
      value = jnp.full(shape, offset + int(match["index"]), jnp.int32)
    else:
      value = (offset + jnp.arange(shape[0], dtype=jnp.int32)).reshape(shape) if shape else jnp.int32(offset)
    node.set_value(value)
    assigned += 1
  return assigned


def layer_precisions(switches: Switches, mlp_precision: str) -> list[str]:
  """The MLP GEMM precision of each decoder layer, in order (before any late switch step)."""
  if mlp_precision != "nvfp4":
    return [mlp_precision] * switches.num_layers
  return ["bf16" if switches.bf16_layer(i) else "nvfp4" for i in range(switches.num_layers)]


def summary(switches: Switches, mlp_precision: str) -> str:
  """One line for the printed plan: layer ranges and their MLP precision, then the switch steps."""
  runs: list[tuple[int, int, str]] = []
  for i, p in enumerate(layer_precisions(switches, mlp_precision)):
    if runs and runs[-1][2] == p:
      runs[-1] = (runs[-1][0], i, p)
    else:
      runs.append((i, i, p))
  layers = ", ".join(f"{a}{'' if a == b else f'-{b}'}: {p}" for a, b, p in runs)
  steps = []
  if switches.forward_from_step is not None:
    steps.append(f"forward NVFP4 GEMMs in BF16 from step {switches.forward_from_step}")
  if switches.from_step is not None:
    steps.append(f"all NVFP4 GEMMs in BF16 from step {switches.from_step}")
  return f"MLP GEMMs per decoder layer: {layers}" + (f"; {'; '.join(steps)}" if steps else "")
