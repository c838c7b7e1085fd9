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

import numpy as np

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


def lower_train_step(config: Any, log: Any = print) -> str:
  """maxtext's train step for `config`, lowered for CUDA on the CPU devices (as many as the config's mesh asks)."""
  import jax  # pylint: disable=import-outside-toplevel

  from MaxText.integration.train_step import traced_train_step  # pylint: disable=import-outside-toplevel

  start = time.perf_counter()
  devices = jax.devices()[: int(config.num_target_devices or 1)] if hasattr(config, "num_target_devices") else None
  devices = devices or jax.devices()
  traced, _ = traced_train_step(config, devices)
  text = traced.lower(lowering_platforms=("cuda",)).as_text(debug_info=True)
  log(f"  lowered the train step for CUDA on {len(devices)} CPU device(s) in {time.perf_counter() - start:.1f} s")
  return text


def _definitions(lines: list[str]) -> dict[str, str]:
  """SSA value name (e.g. "%61"; "%44#0" is looked up as "%44") -> what defines it, in one function's lines."""
  defs = {}
  for line in lines:
    match = re.match(r"\s*(%[\w]+)(?::\d+)? = (.*)$", line)
    if match:
      defs[match.group(1)] = match.group(2)
  return defs


def guard_inputs(text: str, result_type: str) -> list[set[str]]:
  """For each guard poison producing `result_type` (e.g. "tensor<128x256xbf16>"): the types of the tensors whose
  max|.| is_finite feeds its verdict (through `stablehlo.and`s).

  Why: the non-finite guard is `out * where(ok, 1, NaN)` (a scalar, converted and broadcast) with
  ok = is_finite(max|a|) & is_finite(max|b|); this reads which operands' checks actually reach each output in the
  lowered program.
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
      while reduced.startswith("stablehlo.convert "):  # max|dY| is checked as the f32 it travels as
        reduced = defs.get(re.findall(r"%[\w#]+", reduced)[0].split("#")[0], "")
      match = re.search(r"applies stablehlo\.maximum .*: \((tensor<[^>]+>)", reduced)
      return {match.group(1)} if match else set()
    return set()

  return [finite_sources(defs, pred) for defs, (pred, _, _) in _poison_factors(text, result_type)]


def guard_factors(text: str, result_type: str) -> list[tuple[float, float]]:
  """For each guard poison producing `result_type`: the factor's two values, (when every operand is finite, when
  one is not): (1.0, nan) is the guard; a zero or any finite value in the second place would hide a NaN."""
  def value(defs: dict[str, str], name: str) -> float:
    line = defs.get(name.split("#")[0], "")
    match = re.match(r"stablehlo\.constant dense<([^>]+)>", line)
    assert match, f"the guard's factor {name} is not a constant: {line!r}"
    literal = match.group(1)
    if literal.startswith("0x"):  # non-finite f32 values are printed as bit patterns
      return float(np.frombuffer(int(literal, 16).to_bytes(4, "little"), np.float32)[0])
    return float(literal)

  return [(value(defs, ok), value(defs, bad)) for defs, (_, ok, bad) in _poison_factors(text, result_type)]


def _poison_factors(text: str, result_type: str) -> list[tuple[dict[str, str], tuple[str, str, str]]]:
  """Each guard poison `out * factor` producing `result_type`, as (its function's definitions, (the predicate, the
  factor where it holds, the factor where it does not)): broadcast_in_dim <- convert <- call @_where(pred, 1, NaN)."""
  def where_call(defs: dict[str, str], name: str) -> tuple[str, str, str] | None:
    for _ in range(3):
      line = defs.get(name.split("#")[0], "")
      call = re.match(r"call @_where\w*\((%[\w#]+), (%[\w#]+), (%[\w#]+)\)", line)
      if call:
        return call.group(1), call.group(2), call.group(3)
      if not re.match(r"stablehlo\.(broadcast_in_dim|convert) ", line):
        return None
      name = re.findall(r"%[\w#]+", line)[0]
    return None

  found = []
  for function in text.split("func.func")[1:]:  # SSA names are per function
    lines = function.splitlines()
    defs = _definitions(lines)
    for line in lines:
      match = re.search(r"= stablehlo\.multiply (%[\w#]+), (%[\w#]+) : " + re.escape(result_type) + r"(?:\s|$)", line)
      if match:
        call = where_call(defs, match.group(2))
        if call:
          found.append((defs, call))
  return found
