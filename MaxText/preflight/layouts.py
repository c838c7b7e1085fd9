# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The layouts `--tune` searches: how a run splits over N GPUs, and the maxtext keys that say it.

A layout is what a maxtext user chooses beside the model: the mesh (data, fsdp, context and tensor parallelism, each
split between one NVLink domain, maxtext's `ici_*`, and across domains, `dcn_*`), the per-device batch, gradient
accumulation and the remat policy. Why a module of its own, without jax or maxtext: the candidates are enumerated,
estimated and pruned (MaxText.preflight.estimate) before anything compiles, and the command line checks its
arguments before it imports maxtext.

Pipeline parallelism (maxtext's `stage` axis, between data and fsdp in its mesh order) splits the decoder layers
into `stages` consecutive stages, each on its own GPUs, with `microbatches` microbatches a step (maxtext's
num_pipeline_microbatches, a multiple of the stages; the bubble is (stages - 1) / (microbatches + stages - 1)); the
weights are gathered over FSDP once a step (pipeline_fsdp_ag_once), not once per microbatch. A stage axis outside
fsdp lays each stage on consecutive device ids: stages of a whole domain each sit in their own domain, which is
NVIDIA's usual placement (pipeline across nodes, tensor within).

How the mesh maps to GPUs. maxtext lays the devices out axis by axis in its `mesh_axes` order (data first, tensor
last), the across-domain part of each axis outside its within-domain part (jax's hybrid mesh), each domain one of
jax's slices (`num_slices`; on NVL72 racks, the slice_index jax.distributed is given per rack). The pre-flight
compiles for one process whose device ids run domain after domain (MaxText.preflight.targets.Peaks.domain_gpus),
so a layout compiles as one mesh over all N with each axis's size the product of its two parts (`compiled`): the
same device order as the hybrid mesh where the across-domain parts sit on the outermost axes, which is the only
form generated here. A collective then spans domains exactly when it would on the cluster, and the prediction
times it on the scale-out network (MaxText.preflight.predict).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Sequence

__all__ = ["AXES", "REMAT_POLICIES", "Layout", "Space", "candidates"]

#: The mesh axes searched, in maxtext's mesh order (outermost first): the order that lays devices out.
AXES = ("data", "fsdp", "context", "tensor")

#: maxtext's remat policies that keep everything on the GPU (the `*_offloaded` ones move activations to the host,
#: and `custom` needs per-tensor settings), from least to most memory; the last also keeps the quantized GEMM inputs
#: (the 8B recipes').
REMAT_POLICIES = ("full", "save_qkv_proj", "save_dot_except_mlp", "save_dot_with_context_except_mlp",
                  "save_dot_except_mlpwi", "minimal_with_context", "minimal_with_context_and_quantization")


@dataclasses.dataclass(frozen=True)
class Layout:
  """One candidate: per-axis sizes within an NVLink domain (`ici`) and across domains (`dcn`), in AXES order, the
  per-device batch, the gradient accumulation steps and the remat policy."""

  ici: tuple[int, int, int, int]
  dcn: tuple[int, int, int, int]
  per_device_batch: float
  accumulation: int
  remat: str
  stages: int = 1  # pipeline stages (maxtext's ici_pipeline_parallelism); 1: no pipeline
  microbatches: int = 0  # num_pipeline_microbatches when stages > 1

  def size(self, axis: str) -> int:
    """The axis's size over all GPUs."""
    i = AXES.index(axis)
    return self.ici[i] * self.dcn[i]

  @property
  def weight_shards(self) -> int:
    """How many GPUs one weight (and its optimizer state) is split over: maxtext's rules shard `embed` over fsdp and
    context, `mlp`/`heads` over tensor; data parallelism replicates."""
    return self.size("fsdp") * self.size("context") * self.size("tensor") * self.stages

  @property
  def bubble(self) -> float:
    """The pipeline's time over its work: (microbatches + stages - 1) / microbatches; 1 without a pipeline."""
    return (self.microbatches + self.stages - 1) / self.microbatches if self.stages > 1 else 1.0

  @property
  def slices(self) -> int:
    return math.prod(self.dcn)

  def overrides(self, gpus_per_slice: int) -> list[str]:
    """The maxtext keys a multi-process run uses for this layout when each jax slice holds `gpus_per_slice` GPUs
    (jax's default on GPUs: one slice per node, so `ici_*` within a node of 4 or 8 and `dcn_*` across nodes): the
    innermost mesh axes fill a slice, so the hybrid mesh lays devices out as `compiled` does. One slice (a single
    node, or slice_index set for the whole job): `compiled`."""
    sizes = [self.size(axis) for axis in AXES]
    devices = math.prod(sizes)
    if self.stages > 1 or devices <= gpus_per_slice or devices % gpus_per_slice:
      return self.compiled()
    ici, left = [1] * len(AXES), gpus_per_slice
    for i in reversed(range(len(AXES))):
      take = math.gcd(sizes[i], left)
      if take < min(sizes[i], left):  # the slice would split an axis in a way the hybrid mesh orders otherwise
        return self.compiled()
      ici[i], left = take, left // take
    keys = [f"ici_{axis}_parallelism={size}" for axis, size in zip(AXES, ici)]
    keys += [f"dcn_{axis}_parallelism={size // part}" for axis, size, part in zip(AXES, sizes, ici)]
    return keys + self._rest()

  def compiled(self) -> list[str]:
    """The keys the pre-flight compiles it with: one mesh over every GPU, each axis the product of its parts (the
    same device order; module docstring)."""
    pipeline = [f"ici_pipeline_parallelism={self.stages}"] if self.stages > 1 else []
    return [f"ici_{axis}_parallelism={self.size(axis)}" for axis in AXES] + pipeline + self._rest()

  def _rest(self) -> list[str]:
    batch = int(self.per_device_batch) if float(self.per_device_batch).is_integer() else self.per_device_batch
    pipeline = ([f"num_pipeline_microbatches={self.microbatches}", "pipeline_fsdp_ag_once=true"]
                if self.stages > 1 else [])
    return [f"per_device_batch_size={batch}", f"gradient_accumulation_steps={self.accumulation}",
            f"remat_policy={self.remat}", *pipeline]

  def label(self) -> str:
    """A short name for the table: the axes above 1 inside a domain, then across domains, batch, remat."""
    inside = " ".join(([f"pipeline={self.stages} (mb {self.microbatches})"] if self.stages > 1 else [])
                      + [f"{axis}={size}" for axis, size in zip(AXES, self.ici) if size > 1]) or "1 GPU"
    across = " ".join(f"{axis}={size}" for axis, size in zip(AXES, self.dcn) if size > 1)
    accumulation = f" ga={self.accumulation}" if self.accumulation > 1 else ""
    return (f"{inside}{' | across domains ' + across if across else ''} | b={self._rest()[0].split('=')[1]}{accumulation} "
            f"{self.remat}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Space:
  """What `candidates` enumerates for a run on `devices` GPUs in domains of `domain` GPUs.

  global_batch: sequences per optimizer step held fixed (per_device_batch x devices x accumulation), or None: the
    per-device batch is free (`batches`) and each candidate's throughput is compared per token.
  batches: per-device batches tried when the global batch is free.
  accumulations: gradient accumulation steps tried when the global batch is fixed.
  tensor, context, data: the sizes tried for those axes within a domain (fsdp takes the rest of it).
  remat: the policies tried.
  sequence: max_target_length (context parallelism must divide it).
  """

  devices: int
  domain: int
  global_batch: int | None = None
  batches: tuple[float, ...] = (1, 2, 3, 4, 6, 8)
  accumulations: tuple[int, ...] = (1, 2, 4, 8)
  tensor: tuple[int, ...] = (1, 2, 4, 8)
  context: tuple[int, ...] = (1, 2, 4)
  data: tuple[int, ...] = (1, 2, 4)
  remat: tuple[str, ...] = REMAT_POLICIES
  sequence: int = 8192
  stages: tuple[int, ...] = (1,)  # pipeline stages tried (each must divide `layers`), with tensor parallelism
  layers: int = 0  # decoder layers (for the stages), 0: no pipeline


def _meshes(space: Space) -> Iterator[tuple[tuple[int, int, int, int], tuple[int, int, int, int]]]:
  """(ici, dcn) pairs: tensor and context inside a domain, data (1, 2 or 4) and fsdp the rest of it; across domains,
  data or (with no data inside) fsdp, so that the across-domain part sits on the outermost axis above 1."""
  domains = space.devices // space.domain
  for tensor, context, data in itertools.product(space.tensor, space.context, space.data):
    if space.domain % (tensor * context * data) or space.sequence % context:
      continue
    ici = (data, space.domain // (tensor * context * data), context, tensor)
    if domains == 1:
      yield ici, (1, 1, 1, 1)
      continue
    yield ici, (domains, 1, 1, 1)  # data parallel across domains
    if data == 1:
      yield ici, (1, domains, 1, 1)  # FSDP across domains too


def _pipelines(space: Space) -> Iterator[Layout]:
  """Pipeline layouts: `stages` stages of consecutive device ids (each stage a whole domain or a part of one),
  tensor parallelism inside a stage, FSDP over the rest of it, 2 microbatches per stage; the per-device batch
  free or the global batch held (its accumulation 1)."""
  for stages, tensor, remat in itertools.product(space.stages, space.tensor, space.remat):
    if stages < 2 or not space.layers or space.layers % stages or space.devices % (stages * tensor):
      continue
    fsdp = space.devices // (stages * tensor)
    batches = [space.global_batch / space.devices] if space.global_batch else list(space.batches)
    for batch in batches:
      microbatches = 2 * stages
      sequences = batch * space.devices
      if not float(sequences).is_integer() or int(sequences) % (microbatches * fsdp):
        continue
      yield Layout(ici=(1, fsdp, 1, tensor), dcn=(1, 1, 1, 1), per_device_batch=batch, accumulation=1, remat=remat,
                   stages=stages, microbatches=microbatches)


def candidates(space: Space) -> list[Layout]:
  """Every layout of `space` maxtext can express: the global batch a whole number of sequences, split evenly over
  the batch axes (data x fsdp; tensor and context share a sequence, so a per-device batch below 1 is allowed
  there), and at least one sequence per batch shard; then the pipeline layouts (`_pipelines`)."""
  out = []
  for ici, dcn in _meshes(space):
    layout_axes = Layout(ici=ici, dcn=dcn, per_device_batch=1, accumulation=1, remat="full")
    batch_shards = layout_axes.size("data") * layout_axes.size("fsdp")
    if space.global_batch is None:
      pairs = [(b, 1) for b in space.batches] + [(b / (layout_axes.size("tensor") * layout_axes.size("context")), 1)
                                                 for b in space.batches[:1]]
    else:
      pairs = [(space.global_batch / (space.devices * a), a) for a in space.accumulations]
    for (batch, accumulation), remat in itertools.product(dict.fromkeys(pairs), space.remat):
      sequences = batch * space.devices
      if batch <= 0 or not float(sequences).is_integer() or int(sequences) % batch_shards:
        continue
      out.append(dataclasses.replace(layout_axes, per_device_batch=batch, accumulation=accumulation, remat=remat))
  return out + list(_pipelines(space))


def parse_batch(values: Sequence[str]) -> tuple[float, ...]:
  """`--tune-batches 1,2,4` as numbers (positive)."""
  out = tuple(float(v) for v in values if v.strip())
  if not out or any(v <= 0 for v in out):
    raise ValueError(f"{','.join(values)!r}: give positive per-device batch sizes, e.g. 1,2,4")
  return out
