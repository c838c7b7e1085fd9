# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""XLA's optimized HLO text as the pre-flight reads it: the program split into computations, each computation into
instructions, and every pattern the readers pick attributes out of an instruction's line with.

Why one module: the kernel list (MaxText.preflight.kernels) and the classification of each kernel
(MaxText.preflight.classify) read the same text; its syntax is written down once, here, so a change in XLA's printer
is mended in one place. The text is `compiled.as_text()` of a jax executable (XLA's HloModule::ToString).
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["Instruction", "arrays", "computations", "instructions", "patterns"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Instruction:
  """One instruction line: `[ROOT] %name = shape opcode(operands), rest`."""

  name: str
  shape: str
  opcode: str
  operands: tuple[str, ...]
  rest: str  # everything after the opening parenthesis: operands, then attributes and metadata
  root: bool = False


class _Patterns:  # pylint: disable=too-few-public-methods  # a namespace of compiled patterns
  """The patterns, by what they find (their groups in each comment)."""

  array = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")  # element type, dims "2,4"
  computation = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")  # "ENTRY " or not, name
  instruction = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$")  # name shape op rest
  called = re.compile(r"\b(body|condition|to_apply|calls|true_computation|false_computation)=%?([\w.\-]+)")
  branches = re.compile(r"branch_computations=\{([^}]*)\}")  # a conditional's computations, comma-separated
  target = re.compile(r'custom_call_target="([^"]+)"')
  op_name = re.compile(r'op_name="([^"]*)"')  # jax's name stack
  trip_count = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')  # a while loop's, when XLA knows it
  partitions = re.compile(r"\bnum_partitions=(\d+)")  # in the HloModule line: the devices the program spans
  fusion_calls = re.compile(r"\bcalls=%?([\w.\-]+)")
  fusion_kind = re.compile(r"\bkind=(k\w+)")
  layouts = re.compile(r"operand_layout_constraints=\{(.*?)\}, (?:api_version|output_to|metadata|backend)")
  dot_dims = re.compile(r"(lhs|rhs)_(contracting|batch)_dims=\{([0-9,]*)\}")  # side, kind, "1,2"
  cublas_dims = re.compile(r'"(lhs|rhs)_(contracting|batch)_dimensions":\[([^\]]*)\]')  # in the backend config
  mesh_groups = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")  # mesh axes, the axes grouped
  iota_groups = re.compile(r"replica_groups=\[(\d+),(\d+)\]")  # groups, group size
  iota_members = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=\[([0-9,]*)\](?:T\(([0-9,]*)\))?")  # ..., dims, perm
  listed_groups = re.compile(r"replica_groups=\{\{([^}]*)\}")  # the first group's devices
  operand = re.compile(r"%([\w.\-]+)")


patterns = _Patterns()


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
  """(element type, dims) of each array in an HLO shape, in order: "(bf16[2,4]{1,0}, f32[])" -> [("bf16", (2, 4)),
  ("f32", ())]."""
  return [(dtype, tuple(int(d) for d in dims.split(",") if d)) for dtype, dims in patterns.array.findall(shape)]


def _operand_list(text: str) -> str:
  """The operand list of `op(...)`: the text up to the parenthesis that closes it."""
  depth = 1
  for i, char in enumerate(text):
    if char in "([{":
      depth += 1
    elif char in ")]}":
      depth -= 1
      if depth == 0:
        return text[:i]
  return text


def computations(hlo: str) -> tuple[dict[str, list[str]], str]:
  """Computation name -> its instruction lines, and the entry computation's name."""
  found: dict[str, list[str]] = {}
  entry, current = "", None
  for line in hlo.splitlines():
    if current is None:
      match = patterns.computation.match(line.strip())
      if match and not line.startswith("HloModule") and not patterns.instruction.match(line):
        current = match.group(2)
        found[current] = []
        if match.group(1):
          entry = current
      continue
    if line.strip() == "}":
      current = None
    else:
      found[current].append(line)
  return found, entry


def instructions(lines: list[str]) -> list[Instruction]:
  """The instructions of a computation's lines (`computations`), in order."""
  parsed = []
  for line in lines:
    match = patterns.instruction.match(line)
    if match:
      name, shape, opcode, rest = match.groups()
      parsed.append(Instruction(name=name, shape=shape, opcode=opcode, rest=rest,
                                operands=tuple(patterns.operand.findall(_operand_list(rest))),
                                root=line.lstrip().startswith("ROOT ")))
  return parsed
