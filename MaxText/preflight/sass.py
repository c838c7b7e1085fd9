# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The machine code (SASS) of a program compiled for a described GPU on this CPU, kernel by kernel.

Why: the pre-flight prices an elementwise kernel by its bytes and counts its instructions as one per fused HLO op per
element (classify._lane_ops). The GPU runs what ptxas made of them: it merges some ops into one instruction, spends
several on others, and issues int-float conversions at a fraction of its rate. XLA's GPU compiler already ran ptxas
for the described GPU when jax compiled the program (MaxText.preflight.compile): the cubins are inside the compiled
executable. This takes them out and disassembles them with NVIDIA's nvdisasm (PyPI: nvidia-cuda-nvdisasm, installed
by `./setup.sh --gpu`).

Where the cubins are, in XLA's serialization of a CUDA executable as jax 0.12 reaches it (read off its bytes; not a
documented format): a riegeli stream (a 24-byte block header every 64 KiB of it; a stream nested in another has
headers of its own) holding a snappy-compressed protobuf, in which each kernel's cubin is an ELF file. A jax that
lays it out otherwise gets a SassError naming what was not found, never a count.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import dataclasses
import math
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sysconfig
import tempfile
from typing import Any

__all__ = ["Launch", "SassError", "SassKernel", "by_instruction", "cubins", "disassemble", "dump_compiles", "kernels_of",
           "launches", "nvdisasm"]

_BLOCK = 1 << 16  # riegeli's block size
_BLOCK_HEADER = 24  # header hash, previous chunk's distance, next chunk's distance (uint64 each)
_ELF = b"\x7fELF"
#: SASS opcodes (first dotted part) of conversions between integers and floats and of rounding to an integral float.
CONVERSIONS = frozenset({"F2I", "I2F", "I2FP", "F2IP", "FRND", "F2F"})
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);")
_LAUNCH = re.compile(r"^\s*(\d+): kCustomKernel\b.*?\]\s+([\w.\-]+)\s+grid: \[(\d+), (\d+), (\d+)\] "
                     r"threads: \[(\d+), (\d+), (\d+)\]", re.M)
_THUNK = re.compile(r'profile_annotation: "([^"]+)"\s+thunk_id: (\d+)')
_KERNEL = re.compile(r"\.text\.([\w.$\-]+):")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\b.*?`?\(?(\.L_x_\d+)\)?")


class SassError(RuntimeError):
  """The machine code could not be taken out of a compiled executable or disassembled."""


@dataclasses.dataclass(frozen=True)
class SassKernel:
  """One kernel's SASS: `instructions` in program order, each as nvdisasm prints it (predicate, opcode, operands);
  `loops`: whether it branches back to an earlier label (then its static `count` is not what a thread issues; the
  branch to itself after EXIT that every kernel ends with does not count)."""

  name: str
  instructions: tuple[str, ...]
  loops: bool = False

  @property
  def opcodes(self) -> collections.Counter:
    """How many of each opcode (with its modifiers, e.g. F2I.U32.TRUNC.NTZ), predicates left off."""
    return collections.Counter(i.split()[1] if i.startswith("@") and len(i.split()) > 1 else i.split()[0]
                               for i in self.instructions)

  @property
  def count(self) -> int:
    """Instructions a thread issues running the kernel straight through, NOPs (alignment padding) left out."""
    return sum(n for op, n in self.opcodes.items() if op != "NOP")

  @property
  def conversions(self) -> int:
    """Its int-float conversions and roundings to an integral float (`CONVERSIONS`)."""
    return sum(n for op, n in self.opcodes.items() if op.split(".")[0] in CONVERSIONS)


def nvdisasm() -> pathlib.Path:
  """NVIDIA's disassembler: the nvidia-cuda-nvdisasm wheel's in this interpreter's site-packages, else PATH's."""
  wheel = pathlib.Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "cu13" / "bin" / "nvdisasm"
  found = wheel if wheel.is_file() else shutil.which("nvdisasm")
  if found is None:
    raise SassError("nvdisasm not found: run `./setup.sh --gpu` (it installs nvidia-cuda-nvdisasm) or put CUDA's "
                    "nvdisasm on PATH")
  return pathlib.Path(found)


def _executable_bytes(compiled: Any) -> bytes:
  """XLA's serialization of the executable behind `compiled` (what jax.experimental.serialize_executable pickles; taken
  directly, since a program with custom partitioning cannot be pickled)."""
  unloaded = getattr(compiled._executable, "_unloaded_executable", None)  # pylint: disable=protected-access  # jax
  executable = getattr(unloaded, "xla_executable", None)
  if executable is None:
    raise SassError("this jax executable has no XLA executable to serialize")
  serialize = getattr(executable, "serialize", None)
  return serialize() if serialize is not None else executable.client.serialize_executable(executable)


def _without_block_headers(data: bytes) -> bytes:
  """`data` less riegeli's block headers. A riegeli stream starts with a block header whose previous-chunk distance is
  0, and has another at every 64 KiB of it, each with both distances (back to its chunk's start, on to its end)
  within the data. A stream nested in another counts its 64 KiB without the outer stream's headers: the outer
  stream's come out first, then the next one's. Each round removes at least one header, so it ends."""

  def distances(data: bytes, at: int) -> tuple[int, int]:
    return struct.unpack_from("<QQ", data, at + 8) if at + _BLOCK_HEADER <= len(data) else (-1, -1)

  def inside(data: bytes, at: int) -> bool:  # a chunk may span blocks: the distances are to its two ends
    previous, following = distances(data, at)
    return 0 < previous < len(data) and 0 < following < len(data)

  while True:
    start = next((f for f in range(min(_BLOCK, len(data))) if distances(data, f)[0] == 0
                  and 0 < distances(data, f)[1] < len(data) and inside(data, f + _BLOCK)), None)
    if start is None:
      return data
    kept, at = [], 0
    for cut in range(start + _BLOCK, len(data), _BLOCK):
      if not inside(data, cut):
        break
      kept.append(data[at:cut])
      at = cut + _BLOCK_HEADER
    data = b"".join(kept) + data[at:]


def _varint(data: bytes, at: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    byte = data[at]
    at += 1
    value |= (byte & 0x7F) << shift
    shift += 7
    if byte < 0x80:
      return value, at


def _unsnappy(data: bytes, at: int) -> bytes | None:
  """The raw snappy stream starting at `at`, decompressed; None where it is not one (a copy reaching before the
  output's start, or fewer bytes than it declares)."""
  size, at = _varint(data, at)
  out = bytearray()
  try:
    while len(out) < size:
      tag = data[at]
      at += 1
      kind = tag & 3
      if kind == 0:  # literal
        length = tag >> 2
        if length >= 60:
          width = length - 59
          length = int.from_bytes(data[at:at + width], "little")
          at += width
        out += data[at:at + length + 1]
        at += length + 1
        continue
      if kind == 1:
        length, offset = ((tag >> 2) & 7) + 4, ((tag >> 5) << 8) | data[at]
        at += 1
      else:
        width = 2 if kind == 2 else 4
        length, offset = (tag >> 2) + 1, int.from_bytes(data[at:at + width], "little")
        at += width
      if not 0 < offset <= len(out):
        return None
      if offset >= length:  # no overlap: one slice
        out += out[len(out) - offset:len(out) - offset + length]
      else:  # a run: each byte copies one written `offset` before it
        for _ in range(length):
          out.append(out[-offset])
  except IndexError:
    return None
  return bytes(out) if len(out) == size else None


def _elf_files(data: bytes) -> list[bytes]:
  """The ELF files laid end to end in `data`, each cut at the end of its section and program header tables."""
  found, at = [], data.find(_ELF)
  while at >= 0:
    program_headers, section_headers = struct.unpack_from("<QQ", data, at + 0x20)
    program_size, programs, section_size, sections = struct.unpack_from("<HHHH", data, at + 0x36)
    end = at + max(section_headers + section_size * sections, program_headers + program_size * programs)
    found.append(data[at:end])
    at = data.find(_ELF, end)
  return found


def cubins(compiled: Any) -> list[bytes]:
  """The kernels' cubins (ELF files) of `compiled`, a jax executable compiled for a CUDA GPU (compile-only ones too)."""
  data = _without_block_headers(_executable_bytes(compiled))
  for at in range(len(data) - 10):  # a varint takes at most 10 bytes
    declared, _ = _varint(data, at)
    if len(data) < declared < 64 * len(data):
      out = _unsnappy(data, at)
      if out is not None and _ELF in out:
        return _elf_files(out)
  raise SassError("no compressed stream holding cubins in the executable (jax's serialized layout may have changed)")


def disassemble(cubin: bytes, tool: pathlib.Path | None = None) -> list[SassKernel]:
  """The kernels of one cubin, disassembled by nvdisasm."""
  with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
    file.write(cubin)
    file.flush()
    run = subprocess.run([str(tool or nvdisasm()), "-c", file.name], capture_output=True, text=True, check=False)
  if run.returncode:
    raise SassError(f"nvdisasm failed on a cubin of {len(cubin)} bytes: {run.stderr.strip()}")
  found: list[SassKernel] = []
  name, body, labels, loops, last_label = None, [], set(), False, None
  for line in run.stdout.splitlines():
    kernel = _KERNEL.search(line)
    if kernel:
      if name is not None:
        found.append(SassKernel(name, tuple(body), loops))
      name, body, labels, loops, last_label = kernel.group(1), [], set(), False, None
      continue
    label = _LABEL.match(line)
    if label:
      labels.add(label.group(1))
      last_label = label.group(1)
      continue
    instruction = _INSTRUCTION.search(line)
    if instruction and name is not None:
      text = " ".join(instruction.group(1).split())
      target = _BRANCH.search(text)
      if target and target.group(1) in labels and target.group(1) != last_label:
        loops = True
      body.append(text)
      last_label = None
  if name is not None:
    found.append(SassKernel(name, tuple(body), loops))
  return found


def kernels_of(compiled: Any) -> dict[str, SassKernel]:
  """Every kernel of `compiled` by its name (`launches` says which kernel an HLO instruction runs); nvdisasm runs on
  every core."""
  tool = nvdisasm()
  with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
    disassembled = list(pool.map(lambda cubin: disassemble(cubin, tool), cubins(compiled)))
  return {kernel.name: kernel for found in disassembled for kernel in found}


def dump_compiles() -> str:
  """A temporary folder XLA dumps every compile of this process into (removed at exit), for `launches`: call it before
  jax starts, since XLA reads XLA_FLAGS once."""
  folder = tempfile.mkdtemp(prefix="xla-dump-")
  atexit.register(shutil.rmtree, folder, ignore_errors=True)
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={folder}".strip()
  return folder


@dataclasses.dataclass(frozen=True)
class Launch:
  """How an HLO instruction runs as a kernel: the kernel's name (another instruction's, where XLA reuses the kernel of
  an identical fusion) and the threads it launches (grid x block)."""

  kernel: str
  threads: int


def launches(dump: str | pathlib.Path, module: str) -> dict[str, Launch]:
  """Each HLO instruction of jitted function `module` that runs a kernel, by its name, from XLA's dump of its compile in
  folder `dump` (`dump_compiles`): the thunk metadata names each thunk's
  instruction, the thunk sequence its kernel, grid and block. Empty where the dump has no such module."""
  found: dict[str, Launch] = {}
  for sequence in pathlib.Path(dump).glob(f"module_*.jit_{module}.thunk_sequence.txt"):
    by_thunk = {int(m.group(1)): Launch(m.group(2), math.prod(int(g) for g in m.groups()[2:]))
                for m in _LAUNCH.finditer(sequence.read_text())}
    metadata = sequence.with_name(sequence.name.replace(".thunk_sequence.txt", ".thunk_metadata.txt"))
    for annotation, thunk in _THUNK.findall(metadata.read_text() if metadata.is_file() else ""):
      if int(thunk) in by_thunk:
        found[annotation] = by_thunk[int(thunk)]
  return found


def by_instruction(compiled: Any, dump: str | pathlib.Path, module: str) -> dict[str, tuple[Launch, SassKernel]]:
  """What each HLO instruction of `compiled` (jitted function `module`, its compile dumped into `dump`) runs as a
  kernel of XLA's: the launch (`launches`) and that kernel's machine code (`kernels_of`). Instructions that run no
  such kernel (copies, library calls) are not in it."""
  machine = kernels_of(compiled)
  return {name: (launch, machine[launch.kernel]) for name, launch in launches(dump, module).items()
          if launch.kernel in machine}
