# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""Lowering to CUDA StableHLO on CPU, and reading the TE custom calls out of the text.

`lower_train_step` builds maxtext's own train step the way `train_compile` does (abstract state from
`train_compile.get_shaped_inputs`, shardings from `get_functional_train_with_signature`) on the CPU devices, and
lowers it for CUDA: nothing is compiled or run, so no GPU is needed, and what TE puts in the program (its custom
calls, their attributes, its sharding rules) is all there. `custom_calls` parses the text printed with
`debug_info=True`, resolving each call's location to its name stack (e.g. `.../decoder/layers/mlp/wi_0/...`).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import time
from collections.abc import Sequence
from typing import Any

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
#: Every TE custom call target the NVFP4 / FP8 current-scaling dense paths emit start with this.
TE_PREFIX = "te_"

_CALL_RE = re.compile(r"stablehlo\.custom_call @(?P<target>[\w.]+)\((?P<operands>[^)]*)\)(?P<rest>.*)$")
_LOC_DEF_RE = re.compile(r"^#(?P<name>loc\d*) = loc\((?P<body>.*)\)\s*$")
_LOC_REF_RE = re.compile(r"loc\(#(?P<name>loc\d*)\)\s*$")


@dataclasses.dataclass(frozen=True)
class CustomCall:
  """One `stablehlo.custom_call`: its target, the attribute text after the operands, and its name stack."""

  target: str
  attrs: str
  name: str

  def attr(self, key: str) -> str | None:
    """The value of `key = value` in the call's attributes (e.g. scaling_mode, use_rht), or None."""
    match = re.search(rf"\b{re.escape(key)} = ([^,}}:]+)", self.attrs)
    return match.group(1).strip() if match else None


def custom_calls(text: str) -> list[CustomCall]:
  """Every custom call in StableHLO text printed with debug_info=True, with its location resolved to names."""
  loc_defs = {}
  for line in text.splitlines():
    match = _LOC_DEF_RE.match(line.strip())
    if match:
      loc_defs[match.group("name")] = match.group("body")

  def resolve(body: str, depth: int = 0) -> list[str]:
    """The quoted strings of a location body, aliases followed in order (name stacks, file names, functions)."""
    names = []
    for token in re.findall(r'"(?:[^"\\]|\\.)*"|#loc\d*', body):
      if token.startswith('"'):
        names.append(token[1:-1])
      elif depth < 16 and token[1:] in loc_defs:
        names += resolve(loc_defs[token[1:]], depth + 1)
    return names

  def name_stack(body: str) -> str:
    """The op's name stack (e.g. "jit(f)/jvp(...)/decoder/layers/mlp/wi_0/..."): the first name that is a path of
    transformations and modules, not a source file."""
    for name in resolve(body):
      if "/" in name and not name.startswith("/"):
        return name
    return ""

  calls = []
  for line in text.splitlines():
    match = _CALL_RE.search(line)
    if not match:
      continue
    ref = _LOC_REF_RE.search(line)
    name = name_stack(loc_defs.get(ref.group("name"), "")) if ref else ""
    calls.append(CustomCall(match.group("target"), match.group("rest"), name))
  return calls


def te_calls(text: str) -> list[CustomCall]:
  return [c for c in custom_calls(text) if c.target.startswith(TE_PREFIX)]


def lower_cuda(fn: Any, *args: Any, **kwargs: Any) -> str:
  """StableHLO text of jax.jit(fn)(*args) lowered for CUDA, with locations."""
  import jax  # pylint: disable=import-outside-toplevel

  return jax.jit(fn).trace(*args, **kwargs).lower(lowering_platforms=("cuda",)).as_text(debug_info=True)


def load_config(config_path: pathlib.Path | str, overrides: Sequence[str]) -> Any:
  """maxtext's config through the plugin's config class (the suite's one loader, tests/helpers.py)."""
  from tests import helpers  # pylint: disable=import-outside-toplevel

  return helpers.load_config(config_path, *overrides)


def _traced_train_step(config: Any, devices: Sequence[Any]) -> Any:
  """maxtext's train step for `config` on a mesh of `devices`, traced (inputs from train_compile.get_shaped_inputs)."""
  # pylint: disable=import-outside-toplevel
  import jax
  from flax.linen import partitioning as nn_partitioning
  from jax.sharding import AxisType, Mesh
  from maxtext.trainers.pre_train import train, train_compile
  from maxtext.utils import maxtext_utils, sharding

  mesh = Mesh(maxtext_utils.create_device_mesh(config, devices), config.mesh_axes,
              axis_types=(AxisType.Auto,) * len(config.mesh_axes))
  shaped_args, shaped_kwargs, state_shardings, _, model = train_compile.get_shaped_inputs(mesh, config)
  params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(config, state_shardings)
  input_state_shardings = sharding.build_zero1_input_state_mesh_shardings(config, state_shardings, params_shardings)
  data_sharding = sharding.get_input_data_sharding(config, mesh)
  func, in_shard, out_shard, static_argnums, donate_argnums = maxtext_utils.get_functional_train_with_signature(
      train.train_step, data_sharding, input_state_shardings, model, config, params_shardings)
  with jax.set_mesh(mesh), nn_partitioning.axis_rules(config.logical_axis_rules):
    jitted = jax.jit(func, in_shardings=in_shard, out_shardings=out_shard, static_argnums=static_argnums,
                     donate_argnums=donate_argnums)
    return jitted.trace(*shaped_args, **shaped_kwargs), mesh


def lower_train_step(config: Any, log: Any = print) -> str:
  """maxtext's train step for `config`, lowered for CUDA on the CPU devices (as many as the config's mesh asks)."""
  import jax  # pylint: disable=import-outside-toplevel

  start = time.perf_counter()
  devices = jax.devices()[: int(config.num_target_devices or 1)] if hasattr(config, "num_target_devices") else None
  devices = devices or jax.devices()
  traced, _ = _traced_train_step(config, devices)
  text = traced.lower(lowering_platforms=("cuda",)).as_text(debug_info=True)
  log(f"  lowered the train step for CUDA on {len(devices)} CPU device(s) in {time.perf_counter() - start:.1f} s")
  return text


def target_devices(target: str, count: int) -> list[Any]:
  """`count` compile-only devices of a GPU described in MaxText.backends.targets (XLA's GPU compiler, no GPU)."""
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel

  from MaxText.backends.targets import TARGETS  # pylint: disable=import-outside-toplevel

  return list(topologies.get_topology_desc("", "cuda", topology=f"1x1x{count}",
                                           target_config=TARGETS[target].target_config()).devices)


def compile_train_step(config: Any, target: str, count: int, log: Any = print) -> Any:
  """maxtext's train step for `config` compiled by XLA's GPU compiler for `count` `target` GPUs; the executable.

  TE's custom partitioners read TE's global MeshResource, so the compile runs inside maxtext's
  `transformer_engine_context()` as the lowering does in maxtext's trainer."""
  import jax  # pylint: disable=import-outside-toplevel
  from maxtext.utils import max_utils  # pylint: disable=import-outside-toplevel

  start = time.perf_counter()
  traced, mesh = _traced_train_step(config, target_devices(target, count))
  with jax.set_mesh(mesh), max_utils.transformer_engine_context():
    compiled = traced.lower().compile()
  log(f"  compiled the train step for {count} x {target} in {time.perf_counter() - start:.1f} s")
  return compiled


def _definitions(lines: list[str]) -> dict[str, str]:
  """SSA value name (e.g. "%61"; "%44#0" is looked up as "%44") -> what defines it, in one function's lines."""
  defs = {}
  for line in lines:
    match = re.match(r"\s*(%[\w]+)(?::\d+)? = (.*)$", line)
    if match:
      defs[match.group(1)] = match.group(2)
  return defs


def guard_inputs(text: str, result_type: str) -> list[set[str]]:
  """For each guard select (a call of a `where` helper) producing `result_type` (e.g. "tensor<128x256xbf16>"): the
  types of the tensors whose max|.| is_finite feeds its predicate (through `stablehlo.and`s).

  Why: the non-finite guard is `where(ok, out, NaN)` with ok = is_finite(max|a|) & is_finite(max|b|); this reads
  which operands' checks actually reach each output in the lowered program.
  """
  def finite_sources(defs: dict[str, str], name: str, depth: int = 0) -> set[str]:
    line = defs.get(name.split("#")[0], "")
    if depth > 8:
      return set()
    if line.startswith("stablehlo.and "):
      operands = re.findall(r"%[\w#]+", line.split(":")[0])
      return set().union(*(finite_sources(defs, o, depth + 1) for o in operands))
    if line.startswith("stablehlo.is_finite "):
      reduced = defs.get(re.findall(r"%[\w#]+", line)[0].split("#")[0], "")
      match = re.search(r"applies stablehlo\.maximum .*: \((tensor<[^>]+>)", reduced)
      return {match.group(1)} if match else set()
    return set()

  found = []
  for function in text.split("func.func")[1:]:  # SSA names are per function
    lines = function.splitlines()
    defs = _definitions(lines)
    for line in lines:
      match = re.search(r"= call @_where\w*\((%[\w#]+), .*-> " + re.escape(result_type), line)
      if match:
        found.append(finite_sources(defs, match.group(1)))
  return found
