# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""A compiled XLA program read as the kernels it launches, each with the bytes it reads and writes.

Why: the pre-flight and the overhead audit compare what TE's kernels move with what the plugin adds around them,
on a program compiled for a GPU that is not here, so no profiler can be asked. XLA's optimized HLO text names
every kernel: each instruction of the entry computation and of the computations it runs in turn (while bodies
and conditions, conditional branches, called computations), except the bookkeeping ones that launch nothing
(parameters, tuples, bitcasts, ...). A fusion is one kernel whatever it fuses.

What a kernel's bytes are here: its result plus its operands, at their full sizes. That is what an elementwise or
reduction kernel moves; a kernel that reads part of an operand (a dynamic slice fused in) is overcounted, and a
GEMM's re-reads through cache are not counted. A kernel inside a while loop runs once per iteration: `runs` is the
product of the known trip counts of the loops around it (XLA records them: the layer loop under scan_layers runs
once per decoder layer), so `total_bytes` is per training step. Both branches of a conditional are counted (the
program holds both; one runs). Both sides of a comparison are counted the same way, so their difference is what one
side adds per step, wherever XLA placed the work (in the layer loop, or hoisted out of it over all layers at once).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable

from MaxText.preflight import hlo as hlo_lib
from MaxText.preflight.classify import Work, work_of
from MaxText.preflight.hlo import Instruction, arrays, instructions, patterns

#: Bytes per element of each HLO element type (sub-byte types as fractions: FP4 packs two per byte).
_DTYPE_BYTES = {
    "pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "f4e2m1fn": 0.5, "s8": 1, "u8": 1,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e5m2fnuz": 1, "f8e4m3fnuz": 1, "f8e4m3b11fnuz": 1, "f8e8m0fnu": 1,
    "f8e3m4": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8,
    "u64": 8, "c64": 8, "c128": 16,
}
#: Instructions that launch no kernel of their own.
_NO_KERNEL = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call", "after-all",
    "add-dependency", "opt-barrier", "domain", "partition-id", "replica-id", "async-done", "async-update",
    "copy-done", "send-done", "recv-done", "all-gather-done", "all-reduce-done", "collective-permute-done",
    "reduce-scatter-done", "all-to-all-done", "get-dimension-size", "fusion-done",
})
#: Custom-call results of this type are scratch workspaces (cuBLAS, cuDNN), not data a kernel writes out.
_WORKSPACE = "u8"


def shape_bytes(shape: str, workspace: bool = True) -> int:
  """Bytes of an HLO shape's arrays, e.g. "(bf16[8192,4096]{1,0}, f32[1]{0})" -> 67108868; without u8 arrays
  (a custom call's workspace) when not `workspace`."""
  total = 0.0
  for dtype, dims in arrays(shape):
    if dtype in _DTYPE_BYTES and (workspace or dtype != _WORKSPACE):
      total += _DTYPE_BYTES[dtype] * math.prod(dims)
  return int(math.ceil(total))


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One launched kernel: its instruction name, opcode, custom-call target (if any), bytes moved per run, op_name
  (jax's name stack), how many times a step runs it, what it computes per run (MaxText.preflight.classify), the
  name stack it is attributed to (`scope`, see `kernels`; "" reads as `op_name`) and its result's element types."""

  name: str
  opcode: str
  target: str
  bytes: int
  op_name: str
  runs: int = 1
  work: Work = Work()
  scope: str = ""
  results: tuple[str, ...] = ()  # the element types of its result, sorted, u8 workspaces left out
  computation: str = ""  # the computation whose schedule launches it: the entry, a loop body, a branch
  asynchronous: bool = False  # launched between an async start and its done: may overlap what its computation runs

  @property
  def attributed(self) -> str:
    """The name stack that says whose and which phase's kernel this is: `scope`, else `op_name`."""
    return self.scope or self.op_name

  @property
  def step_bytes(self) -> int:
    """Bytes this kernel moves per training step."""
    return self.bytes * self.runs

  @property
  def te(self) -> bool:
    """A TransformerEngine kernel (its custom calls all start with "te_")."""
    return self.target.startswith("te_")

  @property
  def te_gemm_path(self) -> bool:
    """One of TE's kernels of a quantized GEMM: quantize, RHT amax, GEMM (not its fused attention)."""
    return self.te and "fused_attn" not in self.target

  @property
  def kind(self) -> str:
    """What it is, for tables: the custom-call target, else the fusion kind or the opcode."""
    return self.target or self.opcode


_SLICING = frozenset({"dynamic-slice", "slice", "gather"})


def _fusion_bytes(body: list[Instruction]) -> tuple[int, str]:
  """(bytes a fusion kernel reads and writes, the custom-call target it wraps or ""), from its fused computation.

  A parameter read only through slices counts the slices; the buffer a dynamic-update-slice writes into counts
  only the update (in place: XLA aliases it with the result); a fusion that wraps a custom call (XLA's
  dynamic-slice fusion around TE's calls) is that call on the slices it is given. Bitcasts (a new shape or
  layout of the same bytes) are looked through: a slice of a bitcast of a parameter is a slice of the parameter.
  """
  by_name = {inst.name: inst for inst in body}
  direct: dict[str, list[Instruction]] = collections.defaultdict(list)
  for inst in body:
    for operand in inst.operands:
      direct[operand].append(inst)

  def uses_of(name: str) -> list[tuple[str, Instruction]]:
    """(the name the user reads it as, the user) for each user of `name`, through chains of bitcasts."""
    found = []
    for user in direct[name]:
      found += uses_of(user.name) if user.opcode == "bitcast" else [(name, user)]
    return found

  calls = [inst for inst in body if inst.opcode == "custom-call"]
  if calls:
    call = calls[0]
    target = patterns.target.search(call.rest)
    moved = shape_bytes(call.shape, workspace=False) + sum(shape_bytes(by_name[o].shape) for o in call.operands
                                                           if o in by_name)
    return moved, target.group(1) if target else ""
  read = 0
  for inst in body:
    if inst.opcode != "parameter":
      continue
    uses = uses_of(inst.name)
    if uses and all(u.opcode in _SLICING and u.operands[0] == seen_as for seen_as, u in uses):
      read += sum(shape_bytes(u.shape) for _, u in uses)
    elif uses and all(u.opcode == "dynamic-update-slice" and u.operands[0] == seen_as for seen_as, u in uses):
      continue  # written in place; the update is counted as the write
    else:
      read += shape_bytes(inst.shape)
  root = next((inst for inst in body if inst.root), body[-1] if body else None)
  outputs = [by_name.get(o) for o in root.operands] if root is not None and root.opcode == "tuple" else [root]
  written = 0
  for out in outputs:
    if out is None:
      continue
    if out.opcode == "dynamic-update-slice" and len(out.operands) > 1 and out.operands[1] in by_name:
      written += shape_bytes(by_name[out.operands[1]].shape)
    else:
      written += shape_bytes(out.shape)
  return read + written, ""


def _output_scope(body: list[Instruction]) -> str:
  """The op_name of the fused instruction that writes a fusion's largest output, or of the nearest instruction it
  reads that has one ("" for none). Why not the fusion's own op_name: XLA names a multi-output fusion after the
  consumer it fused a producer into, so a small reduction fused into a large kernel (the guard's max|.| into the
  SwiGLU activation) would take the whole kernel's bytes; the kernel's bytes are its largest output's, the
  reduction's own output rides along."""
  by_name = {inst.name: inst for inst in body}
  root = next((inst for inst in body if inst.root), body[-1] if body else None)
  if root is None:
    return ""
  outputs = [by_name[o] for o in root.operands if o in by_name] if root.opcode == "tuple" else [root]
  todo = [max(outputs, key=lambda inst: shape_bytes(inst.shape))] if outputs else []
  seen: set[str] = set()
  while todo:
    inst = todo.pop(0)
    if inst.name in seen:
      continue
    seen.add(inst.name)
    found = patterns.op_name.search(inst.rest)
    if found and found.group(1):
      return found.group(1)
    todo += [by_name[o] for o in inst.operands if o in by_name]
  return ""


def kernels(hlo: str) -> list[Kernel]:
  """Every kernel of a compiled program (`compiled.as_text()`), in program order, computations entered as run.

  Each kernel's `scope` attributes it (MaxText.preflight.origins): a fusion's is the op_name of the fused
  instruction that writes its largest output (`_output_scope`), any other kernel's its own op_name; a kernel with
  neither (XLA leaves some of TE's calls and its own copies without metadata) takes the op_name of the loop,
  conditional or call that runs it, which says at least the phase of the step (forward or backward loop)."""
  computations, entry = hlo_lib.computations(hlo)
  partitions = patterns.partitions.search(hlo[:hlo.find("\n")] if "\n" in hlo else hlo)
  devices = int(partitions.group(1)) if partitions else 1
  found: list[Kernel] = []
  seen: set[str] = set()

  def visit(name: str, runs: int, context: str, schedule: str = "", asynchronous: bool = False) -> None:
    """The kernels of computation `name`; `schedule`: the computation whose schedule they run in (an async
    start's wrapped computation runs in its caller's, overlapping it), "" for `name` itself."""
    if name in seen or name not in computations:
      return
    seen.add(name)
    schedule = schedule or name
    shapes: dict[str, str] = {}
    for inst in instructions(computations[name]):
      shapes[inst.name] = inst.shape
      if inst.opcode in ("while", "conditional", "call", "async-start"):
        trips = patterns.trip_count.search(inst.rest) if inst.opcode == "while" else None
        inner = runs * (int(trips.group(1)) if trips else 1)
        entered = patterns.op_name.search(inst.rest)
        inner_context = entered.group(1) if entered and entered.group(1) else context
        wrapped = inst.opcode == "async-start"
        for key, called in patterns.called.findall(inst.rest):
          if key != "to_apply" or inst.opcode == "call":
            visit(called, inner, inner_context, schedule if wrapped else "", wrapped)
        for group in patterns.branches.findall(inst.rest):
          for called in group.split(","):
            visit(called.strip().lstrip("%"), runs, inner_context)
      if inst.opcode in _NO_KERNEL or inst.opcode == "async-start":
        continue
      target = patterns.target.search(inst.rest)
      target_name = target.group(1) if target else ""
      operand_shapes = [shapes.get(o, "") for o in inst.operands]
      operand_bytes = sum(shape_bytes(shape) for shape in operand_shapes)
      moved = shape_bytes(inst.shape, workspace=inst.opcode != "custom-call") + operand_bytes
      opcode, body, scope = inst.opcode, None, ""
      if opcode in ("fusion", "fusion-start"):
        called = patterns.fusion_calls.search(inst.rest)
        if called and called.group(1) in computations:
          body = instructions(computations[called.group(1)])
          moved, wrapped = _fusion_bytes(body)
          target_name = target_name or wrapped
          scope = _output_scope(body)
        kind = patterns.fusion_kind.search(inst.rest)
        opcode = f"fusion:{kind.group(1)}" if kind else "fusion"
      work = work_of(inst, operand_shapes, operand_bytes, devices, target_name, body,
                     lambda name: instructions(computations.get(name, [])))
      op_name = patterns.op_name.search(inst.rest)
      own = op_name.group(1) if op_name else ""
      found.append(Kernel(name=inst.name, opcode=opcode, target=target_name, bytes=moved, op_name=own, runs=runs,
                          work=work, scope=scope or own or context,
                          results=tuple(sorted({t for t, _ in arrays(inst.shape) if t != _WORKSPACE})),
                          computation=schedule,
                          asynchronous=asynchronous or inst.opcode.endswith("-start")))

  visit(entry, 1, "")
  return found


def total_bytes(found: Iterable[Kernel]) -> int:
  """Bytes the kernels move per training step."""
  return sum(k.step_bytes for k in found)


def te_kernels(found: Iterable[Kernel], gemm_path_only: bool = False) -> list[Kernel]:
  """TE's kernels; with `gemm_path_only`, those of its quantized GEMMs (see Kernel.te_gemm_path)."""
  return [k for k in found if (k.te_gemm_path if gemm_path_only else k.te)]


def counts(found: Iterable[Kernel]) -> dict[str, int]:
  """Kernel kind -> how many, for TE's calls (e.g. {"te_gemm_v2_ffi": 3, ...})."""
  return dict(collections.Counter(k.kind for k in found))


def added(ours: list[Kernel], bare: list[Kernel]) -> list[Kernel]:
  """The kernels of `ours` beyond those of `bare`, matched by kind, bytes and runs (a multiset difference)."""
  remaining = collections.Counter((k.kind, k.bytes, k.runs) for k in bare)
  extra = []
  for kernel in ours:
    key = (kernel.kind, kernel.bytes, kernel.runs)
    if remaining[key]:
      remaining[key] -= 1
    else:
      extra.append(kernel)
  return extra


@dataclasses.dataclass(frozen=True)
class NetRow:
  """One group of kernels and the bytes per step it moves in one program minus in another."""

  group: str
  net_bytes: int


def phase(kernel: Kernel) -> str:
  """Where in the step a kernel runs, from jax's name stack: the forward pass, the backward pass, the forward
  recomputed in the backward (remat), or elsewhere (the loss, the optimizer update, what XLA adds of its own).
  Read from the kernel's attributed name stack (`Kernel.attributed`)."""
  name = kernel.attributed
  if "rematted_computation" in name:
    return "recomputed forward"
  if "transpose(" in name:
    return "backward"
  if "jvp(" in name:
    return "forward"
  return "elsewhere"


def net_by_group(ours: Iterable[Kernel], other: Iterable[Kernel]) -> list[NetRow]:
  """The bytes per step each group of kernels moves in `ours` minus in `other`, nonzero groups only, largest
  difference first. A group is the kernels of one phase of the step (see `phase`) that are TransformerEngine's, or
  XLA's: fusion boundaries and instruction names change between two compiles of nearly the same program (a check
  fused into a kernel changes that kernel's name and kind), the phase and the origin of a kernel do not. The rows
  sum to total_bytes(ours) - total_bytes(other) exactly."""
  net: dict[str, int] = collections.defaultdict(int)
  for sign, kernels_ in ((1, ours), (-1, other)):
    for kernel in kernels_:
      net[f"{phase(kernel)}, {'TransformerEngine' if kernel.te else 'XLA'} kernels"] += sign * kernel.step_bytes
  rows = [NetRow(group, value) for group, value in net.items() if value]
  return sorted(rows, key=lambda row: (-abs(row.net_bytes), row.group))
