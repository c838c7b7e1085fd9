# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What one kernel of a compiled program computes: its math type, its FLOPs, and the bytes a collective puts on the
wire, read from the optimized HLO instruction (and, for a fusion, the computation it fuses).

Why: the step-time prediction (MaxText.preflight.predict) needs, per kernel, which peak bounds it. The HLO says it:
  - GEMMs: TransformerEngine's `te_gemm_v2_ffi` (operand shapes and TE's own layout attributes: `lhs_axis_boundary`,
    `lhs_transposed`, ...), XLA's `dot` (alone or inside a fusion, e.g. the Triton GEMM fusions XLA makes of FP8
    dots), and cuBLAS(Lt) custom calls (`__cublas$gemm`, `__cublas$lt$matmul[$f8]`, dimension numbers in their
    backend config). FLOPs = 2 M N K (batch dims in M); the math type is the operands' element type: FP4
    (f4e2m1fn), FP8 (any f8), BF16 (bf16 or f16). A GEMM on other types (s32, f32) is left unclassified.
  - Fused attention: TE's `te_fused_attn_forward_ffi` / `te_fused_attn_backward_ffi` (backend config: batch, heads,
    sequence lengths, head dims, mask). Forward 2 B H Sq Skv (Dqk + Dv); backward 2 B H Sq Skv (3 Dqk + 2 Dv)
    (S = Q K^T recomputed, dP, dV, dQ, dK); halved under a causal mask (cuDNN skips the masked tiles).
  - Collectives: the bytes one GPU sends over its links in a ring (NCCL's bus bytes): all-gather (n-1) x its
    operand, reduce-scatter and all-to-all (n-1)/n x the operand, all-reduce 2 (n-1)/n x the operand,
    collective-permute the operand; n from `replica_groups`.
  - Everything else a GPU launches (loop, input and reduction fusions, copies, TE's quantize and amax kernels,
    slices) moves bytes and does no tensor-core math: ELEMENTWISE.
  - A custom call this module does not know, or a GEMM whose shapes do not agree: UNCLASSIFIED (never dropped:
    the prediction times it by its bytes and shows it in a row of its own).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Callable, Sequence

from MaxText.preflight.hlo import Instruction, arrays, patterns

__all__ = ["Math", "Work", "dims_of", "group_members", "group_size", "work_of"]


class Math(enum.StrEnum):
  """Which peak bounds a kernel's time."""

  FP4_GEMM = "fp4_gemm"
  """A GEMM on FP4 operands (TE's NVFP4 cuBLASLt call): the FP4 tensor-core peak."""
  FP8_GEMM = "fp8_gemm"
  """A GEMM on FP8 operands (E4M3/E5M2, maxtext's fp8 and TE's FP8): the FP8 peak."""
  BF16_GEMM = "bf16_gemm"
  """A GEMM on BF16 (or FP16) operands: the BF16 peak."""
  ATTENTION = "attention"
  """cuDNN's fused attention: its FLOPs at the BF16 peak."""
  COLLECTIVE = "collective"
  """An all-gather, all-reduce, reduce-scatter, all-to-all or permute: its wire bytes over NVLink or the network."""
  ELEMENTWISE = "elementwise"
  """Everything else XLA launches (fusions, copies, reductions): its bytes over HBM."""
  UNCLASSIFIED = "unclassified"
  """A GEMM-like kernel whose operand types or dims cannot be read: timed by its bytes and reported apart."""

  @property
  def gemm(self) -> bool:
    return self in (Math.FP4_GEMM, Math.FP8_GEMM, Math.BF16_GEMM)


@dataclasses.dataclass(frozen=True)
class Work:
  """What a kernel computes, per run: tensor-core FLOPs; for a collective the bytes one GPU sends and the GPUs its
  group spans; for a GEMM its (M, N, K)."""

  math: Math = Math.ELEMENTWISE
  flops: int = 0
  wire_bytes: int = 0
  group: int = 1
  members: tuple[int, ...] = ()  # a collective's first replica group, as device ids of the program (`group_members`)
  devices: int = 1  # a collective's: the GPUs of the program it runs in
  gemm_dims: tuple[int, int, int] | None = None
  lane_ops: int = 0  # an elementwise fusion's instructions per run, one per element per fused op (`_lane_ops`)


#: Element types by the GEMM math type they run in.
_GEMM_TYPES = {"f4e2m1fn": Math.FP4_GEMM, "bf16": Math.BF16_GEMM, "f16": Math.BF16_GEMM}
_COLLECTIVES = {
    "all-gather": "all-gather", "all-gather-start": "all-gather", "all-reduce": "all-reduce",
    "all-reduce-start": "all-reduce", "reduce-scatter": "reduce-scatter", "reduce-scatter-start": "reduce-scatter",
    "all-to-all": "all-to-all", "collective-permute": "collective-permute",
    "collective-permute-start": "collective-permute", "ragged-all-to-all": "all-to-all",
}
_CAUSAL_MASKS = frozenset({2, 3, 4, 5})  # TE's NVTE_Mask_Type: CAUSAL, PADDING_CAUSAL and their bottom-right forms


def _gemm_math(*dtypes: str) -> Math:
  """The math type of a GEMM on operands of these element types: the wider one decides (FP4 x FP8 runs as FP8)."""
  kinds = [Math.FP8_GEMM if dtype.startswith("f8") else _GEMM_TYPES.get(dtype, Math.UNCLASSIFIED) for dtype in dtypes]
  if Math.UNCLASSIFIED in kinds:
    return Math.UNCLASSIFIED
  for kind in (Math.BF16_GEMM, Math.FP8_GEMM, Math.FP4_GEMM):
    if kind in kinds:
      return kind
  return Math.UNCLASSIFIED


def dims_of(lhs: Sequence[int], rhs: Sequence[int], lhs_contracting: Sequence[int], rhs_contracting: Sequence[int],
            lhs_batch: Sequence[int] = (), rhs_batch: Sequence[int] = ()) -> tuple[int, int, int] | None:
  """(M, N, K) of a dot with these operand dims and dimension numbers (batch dims folded into M); None when the
  contracting sizes of the two sides disagree."""
  k = math.prod(lhs[d] for d in lhs_contracting)
  if k != math.prod(rhs[d] for d in rhs_contracting):
    return None
  batch = math.prod(lhs[d] for d in lhs_batch)
  m = math.prod(s for d, s in enumerate(lhs) if d not in lhs_contracting and d not in lhs_batch)
  n = math.prod(s for d, s in enumerate(rhs) if d not in rhs_contracting and d not in rhs_batch)
  return batch * m, n, k


def _first_array(shape: str) -> tuple[str, tuple[int, ...]]:
  """(element type, dims) of the first array of an HLO shape; ("", ()) for none."""
  return (arrays(shape) or [("", ())])[0]


def _gemm(lhs_shape: str, rhs_shape: str, numbers: dict[tuple[str, str], list[int]]) -> Work:
  """A GEMM on operands of these shapes with these dimension numbers ({("lhs", "contracting"): [...], ...})."""
  (lhs_type, lhs), (rhs_type, rhs) = _first_array(lhs_shape), _first_array(rhs_shape)
  dims = dims_of(lhs, rhs, *(numbers.get(key, []) for key in (("lhs", "contracting"), ("rhs", "contracting"),
                                                                ("lhs", "batch"), ("rhs", "batch"))))
  kind = _gemm_math(lhs_type, rhs_type)
  if dims is None or kind is Math.UNCLASSIFIED:
    return Work(math=Math.UNCLASSIFIED)
  m, n, k = dims
  return Work(math=kind, flops=2 * m * n * k, gemm_dims=dims)


def _ints(text: str) -> list[int]:
  return [int(x) for x in re.findall(r"\d+", text)]


def _numbers(pattern: re.Pattern[str], text: str) -> dict[tuple[str, str], list[int]]:
  """Dimension numbers by (side, kind), e.g. {("lhs", "contracting"): [1]}, as `pattern` finds them in `text`."""
  return {(side, kind): _ints(value) for side, kind, value in pattern.findall(text)}


def _dot(inst: Instruction, operand_shapes: Sequence[str]) -> Work:
  """An HLO `dot`: dimension numbers from its attributes."""
  if len(operand_shapes) < 2:
    return Work(math=Math.UNCLASSIFIED)
  return _gemm(operand_shapes[0], operand_shapes[1], _numbers(patterns.dot_dims, inst.rest))


def _cublas(inst: Instruction, operand_shapes: Sequence[str]) -> Work:
  """XLA's cuBLAS(Lt) GEMM custom calls: dimension numbers from the backend config."""
  numbers = _numbers(patterns.cublas_dims, inst.rest)
  if len(operand_shapes) < 2 or ("lhs", "contracting") not in numbers:
    return Work(math=Math.UNCLASSIFIED)
  return _gemm(operand_shapes[0], operand_shapes[1], numbers)


def _attr(rest: str, key: str) -> str | None:
  match = re.search(rf"\b{key} = ([\w.+\-]+)", rest)
  return match.group(1) if match else None


def _te_gemm(inst: Instruction, operand_shapes: Sequence[str]) -> Work:
  """TE's GEMM: operands 0 (lhs) and 2 (rhs); TE splits each at its axis boundary into non-contracting and
  contracting dims, which side is which set by `*_transposed` (transformer_engine/jax/cpp_extensions/gemm.py)."""
  if len(operand_shapes) < 3:
    return Work(math=Math.UNCLASSIFIED)
  try:
    lhs_b, rhs_b = int(_attr(inst.rest, "lhs_axis_boundary") or ""), int(_attr(inst.rest, "rhs_axis_boundary") or "")
  except ValueError:
    return Work(math=Math.UNCLASSIFIED)
  lhs_rank, rhs_rank = len(_first_array(operand_shapes[0])[1]), len(_first_array(operand_shapes[2])[1])
  lhs_k = range(lhs_b) if _attr(inst.rest, "lhs_transposed") == "true" else range(lhs_b, lhs_rank)
  rhs_k = range(rhs_b, rhs_rank) if _attr(inst.rest, "rhs_transposed") == "true" else range(rhs_b)
  return _gemm(operand_shapes[0], operand_shapes[2], {("lhs", "contracting"): list(lhs_k),
                                                      ("rhs", "contracting"): list(rhs_k)})


def _te_attention(inst: Instruction, backward: bool) -> Work:
  """TE's fused attention (cuDNN), its sizes from the backend config TE writes."""
  values = {key: _attr(inst.rest, key) for key in ("input_batch", "attn_heads", "q_max_seqlen", "kv_max_seqlen",
                                                    "qk_head_dim", "v_head_dim", "mask_type")}
  if any(v is None for v in values.values()):
    return Work(math=Math.UNCLASSIFIED)
  b, h, sq, skv, dqk, dv, mask = (int(v) for v in values.values())  # type: ignore[arg-type]
  flops = 2 * b * h * sq * skv * ((3 * dqk + 2 * dv) if backward else (dqk + dv))
  return Work(math=Math.ATTENTION, flops=flops // 2 if mask in _CAUSAL_MASKS else flops)


def group_size(rest: str, default: int) -> int:
  """How many devices one replica group of a collective spans (`default`: every device, for `{}` or none)."""
  mesh = patterns.mesh_groups.search(rest)
  if mesh:
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", mesh.group(1)))
    return math.prod(int(sizes.get(axis, 1)) for axis in re.findall(r"'(\w+)'", mesh.group(2))) or 1
  iota = patterns.iota_groups.search(rest)
  if iota:
    return int(iota.group(2))
  listed = patterns.listed_groups.search(rest)
  if listed:
    return len(_ints(listed.group(1))) or default
  return default


def _row_major(sizes: Sequence[int], grouped: Sequence[int]) -> tuple[int, ...]:
  """The ids of the first group of an iota of `sizes` (row-major, id 0 first) when the axes `grouped` (indices into
  `sizes`) vary and every other axis is 0."""
  strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
  ids = [0]
  for axis in grouped:
    ids = [i + k * strides[axis] for i in ids for k in range(sizes[axis])]
  return tuple(sorted(ids))


def group_members(rest: str, devices: int) -> tuple[int, ...]:
  """The device ids (0 .. devices-1, the program's device order) of a collective's first replica group: which GPUs
  one collective joins, so the prediction can tell a group inside one NVLink domain from one that spans domains
  (MaxText.preflight.targets.Peaks.crosses_domains). The three forms XLA writes: `mesh['data'=2,'fsdp'=4] {'fsdp'}` (device
  ids row-major over the mesh), `[G,S]<=[dims]T(perm)` (an iota reshaped to dims, transposed by perm, read as G rows
  of S) and `{{0,1,..},..}` (listed); every device for `{}` or none."""
  mesh = patterns.mesh_groups.search(rest)
  if mesh:
    axes = re.findall(r"'(\w+)'=(\d+)", mesh.group(1))
    grouped = set(re.findall(r"'(\w+)'", mesh.group(2)))
    return _row_major([int(n) for _, n in axes], [i for i, (name, _) in enumerate(axes) if name in grouped])
  iota = patterns.iota_members.search(rest)
  if iota:
    size, dims = int(iota.group(2)), _ints(iota.group(3))
    perm = _ints(iota.group(4)) if iota.group(4) else list(range(len(dims)))
    # Element j of the transposed array is the iota's element at the index whose coordinates, permuted, are j's.
    shape = [dims[p] for p in perm]
    strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    out = []
    for flat in range(size):
      index, rem = [], flat
      for extent in reversed(shape):
        index.append(rem % extent)
        rem //= extent
      index.reverse()
      out.append(sum(index[k] * strides[perm[k]] for k in range(len(perm))))
    return tuple(sorted(out))
  listed = patterns.listed_groups.search(rest)
  if listed and _ints(listed.group(1)):
    return tuple(sorted(_ints(listed.group(1))))
  return tuple(range(devices))


def _collective(kind: str, inst: Instruction, operand_bytes: int, devices: int) -> Work:
  n = group_size(inst.rest, devices)
  if kind == "collective-permute":
    wire = operand_bytes
  elif kind == "all-gather":
    wire = operand_bytes * (n - 1)
  elif kind == "all-reduce":
    wire = 2 * operand_bytes * (n - 1) // n
  else:  # reduce-scatter, all-to-all
    wire = operand_bytes * (n - 1) // n
  return Work(math=Math.COLLECTIVE, wire_bytes=wire, group=n, members=group_members(inst.rest, devices),
              devices=devices)


def _custom_call(target: str, inst: Instruction, operand_shapes: Sequence[str]) -> Work:
  if target == "te_gemm_v2_ffi":
    return _te_gemm(inst, _layout_shapes(inst) or operand_shapes)
  if target in ("te_fused_attn_forward_ffi", "te_fused_attn_backward_ffi"):
    return _te_attention(inst, backward=target.endswith("backward_ffi"))
  if target == "__cublas$gemm" or (target.startswith("__cublas$") and "matmul" in target):
    return _cublas(inst, operand_shapes)
  if target.startswith("te_") or target == "AllocateBuffer":
    return Work(math=Math.ELEMENTWISE)  # TE's quantize, amax, norm and activation kernels; an empty allocation
  return Work(math=Math.UNCLASSIFIED)


def _layout_shapes(inst: Instruction) -> list[str]:
  """The operand shapes a custom call declares (`operand_layout_constraints`), one string per operand."""
  match = patterns.layouts.search(inst.rest)
  return [f"{dtype}[{dims}]" for dtype, dims in patterns.array.findall(match.group(1))] if match else []


#: Fused instructions that execute nothing per element: views, arguments and values fixed at compile time.
_FREE = frozenset({"parameter", "constant", "bitcast", "broadcast", "reshape", "tuple", "get-tuple-element", "iota"})


def _elements(shape: str) -> int:
  return sum(math.prod(dims) for _, dims in arrays(shape))


def _lane_ops(body: Sequence[Instruction]) -> int:
  """The instructions an elementwise fusion executes, counted as one per result element of each fused op (a reduce:
  one per element it reads; a dynamic-update-slice: one per element of the update). Why: the roofline prices such
  a kernel by its bytes alone, and a quantizer written in jnp (exact divisions in integers, E2M1 rounding by
  compares, stochastic rounding's hash) does far more arithmetic per byte than a norm or an activation. A count,
  not a measurement: a GPU may fuse a compare and a select into one instruction, and an integer multiply, a
  conversion or a hash round can take several."""
  shapes = {inst.name: inst.shape for inst in body}
  ops = 0
  for inst in body:
    if inst.opcode in _FREE:
      continue
    if inst.opcode == "reduce":  # its operands are (inputs..., inits...): one op per input element
      ops += sum(_elements(shapes.get(o, "")) for o in inst.operands[:len(inst.operands) // 2])
    elif inst.opcode == "dynamic-update-slice":  # in place: only the update is written
      ops += _elements(shapes.get(inst.operands[1], ""))
    else:
      ops += _elements(inst.shape)
  return ops


def _fused(body: Sequence[Instruction], nested: Callable[[str], Sequence[Instruction]]) -> Work:
  """A fusion: the GEMMs (dots) it contains, in its body or in fusions nested in it (XLA's Triton GEMM fusions
  nest their operands' fusions); none: elementwise."""
  shapes = {inst.name: inst.shape for inst in body}
  found: list[Work] = []
  for inst in body:
    if inst.opcode == "dot":
      found.append(_dot(inst, [shapes.get(o, "") for o in inst.operands]))
    elif inst.opcode == "fusion":
      called = patterns.fusion_calls.search(inst.rest)
      inner = _fused(nested(called.group(1)), nested) if called else Work()
      if inner.math is not Math.ELEMENTWISE:
        found.append(inner)
  if not found:
    return Work(math=Math.ELEMENTWISE, lane_ops=_lane_ops(body))
  if len(found) == 1:
    return found[0]
  kinds = {w.math for w in found}
  if len(kinds) > 1 or Math.UNCLASSIFIED in kinds:
    return Work(math=Math.UNCLASSIFIED)
  return Work(math=found[0].math, flops=sum(w.flops for w in found), gemm_dims=found[0].gemm_dims)


def work_of(inst: Instruction, operand_shapes: Sequence[str], operand_bytes: int, devices: int, target: str = "",
            body: Sequence[Instruction] | None = None,
            nested: Callable[[str], Sequence[Instruction]] = lambda name: ()) -> Work:
  """The work of one launched kernel.

  Args:
    inst: the instruction in its computation (a fusion's call site, a custom call, a collective, ...).
    operand_shapes: the HLO shape of each operand, in order.
    operand_bytes: the bytes of all operands (MaxText.preflight.kernels.shape_bytes).
    devices: the program's device count (a collective without replica groups spans them all).
    target: the custom-call target: the call's own, or the one a fusion wraps (XLA's dynamic-slice fusions).
    body: a fusion's fused computation, parsed.
    nested: a computation's instructions by name (fusions nested in `body`).
  """
  opcode = inst.opcode.split(":", 1)[0]
  collective = _COLLECTIVES.get(opcode)
  if collective:
    return _collective(collective, inst, operand_bytes, devices)
  if target and body is not None:  # a fusion around a custom call: the call, on the operands its body gives it
    shapes = {i.name: i.shape for i in body}
    call = next((i for i in body if i.opcode == "custom-call"), None)
    if call is not None:
      return _custom_call(target, call, [shapes.get(o, "") for o in call.operands])
  if target:
    return _custom_call(target, inst, operand_shapes)
  if opcode == "dot":
    return _dot(inst, operand_shapes)
  if opcode in ("fusion", "fusion-start") and body is not None:
    return _fused(body, nested)
  if opcode in ("convolution", "custom-call"):
    return Work(math=Math.UNCLASSIFIED)
  return Work(math=Math.ELEMENTWISE)
