# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""A layout's step and memory estimated from one compiled layout of the same program, before compiling it: what
`--tune` prunes with (MaxText.preflight.tune), so that only the finalists compile.

Why estimate from a compiled reference and not from a formula alone: the reference holds what a formula would guess
(which bytes each precision gathers: NVFP4 codes and scales, FP8 or BF16 weights; what the optimizer and the
quantizers cost; what XLA keeps in temporaries), and the prediction's own model (MaxText.preflight.predict) prices
it. The estimate moves that reference to another layout with the rules below, each a first-order fact of how
maxtext shards a dense transformer; the finalists then compile, and only their compiled prediction is reported as
a prediction.

  compute       the reference's non-communication seconds scale with the tokens a GPU processes per optimizer
                step (per-device batch x accumulation) and with the forward share the remat policy recomputes
                ((3 + r) / (3 + r_ref): forward once, backward twice, r of the forward again); its kernels outside
                the forward and backward (the optimizer update) scale with 1 / the weight shards.
  FSDP          the bytes the reference all-gathers (weights) and reduce-scatters (gradients) over its FSDP group,
                as whole tensors, are the same at any layout once divided by the tensor parallelism; a layout moves
                (f - 1) / f of them over its group of f (fsdp x context), per microbatch, on NVLink or, when the
                group spans domains, on the network.
  data          a data-parallel group all-reduces each GPU's gradient shard once a step: 2 (d - 1) / d of it.
  tensor        a tensor group of t GPUs works on t x the per-device batch, its activations sharded on emb and
                gathered (or reduce-scattered) around each projection: per layer (t - 1) x tokens x emb x
                TENSOR_BYTES(r) on the wire per GPU, TENSOR_BYTES = 2 x (12 + 5r) (read off the 405B fp8 recipe
                compiled with tensor=8 for 128 GB300s: 884 bf16 reduce-scatters and 2,016 FP8 all-gathers of
                [8, 8192, 16384] over 126 layers, 30 bytes an element per layer at r = 0.55).
  context       3 + r all-gathers of a layer's keys and values over the context group.
  pipeline      s stages of m microbatches: compute x (m + s - 1) / m (the bubble); a GPU gathers and scatters
                only its stage's layers (1 / s of the FSDP bytes, once a step); each of the m + s - 1 iterations
                sends a microbatch's activations (tokens x emb, BF16) to the next stage, 2 + r times (forward,
                backward, recomputed), on the network when a stage fills a domain; the stage's weights are held
                gathered (BF16, 1 / (s x tensor) of them), the state is split over s more.
  reference     the reference's own data, tensor, context and pipeline collectives are among its other
                collectives, which move unchanged: the four rules above add what a layout has beyond the
                reference's own (a reference with tensor=4 estimates tensor=8 by the difference of the two).
  links         every collective at the calibrated share of its link's rate (MaxText.preflight.calibration:
                nccl-tests' bus bandwidth), and hidden behind compute as the layer loop's asynchronous collectives
                are: the step is max(compute, communication) plus the communication the reference's compile left
                exposed beyond that (a layer loop whose collectives outlast its own compute; the calibrated step's
                point less its all-hidden end), scaled with the communication; `unhidden_seconds` is their sum.
  partitioning  a reference moves within its partitioning family (`partitioning`: tensor parallel or not, pipelined
                or not): across families the partitioners choose other collectives. Compiled for 128 GB300s, the
                405B NVFP4-MLP program at fsdp 16 x tensor 4 (data 2 across racks) all-reduces TE's weight gradients
                over data x fsdp, 389 GB a step on the network, where at fsdp 128 it reduce-scatters them; estimated
                from the fsdp reference it was 831 ms per 1,000 tokens, compiled 2,638. So --tune compiles the best
                estimated layout of each family first and re-estimates that family from it.
  memory        arguments and outputs (weights, optimizer state) scale with 1 / the weight shards; temporaries
                are the reference's less its saved activations (layers x tokens x the policy's saved bytes per
                token, plus the logits), which then scale with the tokens of a microbatch.
What it leaves out is what the compile of the finalists sees: XLA's own choices (fusion, rematerialized buffers,
collective combining), partitioning that differs from these rules, and anything a layout maxtext refuses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from MaxText.preflight import calibration, predict
from MaxText.preflight.classify import Math
from MaxText.preflight.kernels import Kernel
from MaxText.preflight.layouts import Layout
from MaxText.preflight.targets import Peaks

__all__ = ["Estimate", "ModelFacts", "Reference", "UnknownRemat", "estimate", "partitioning", "tensor_bytes"]


class UnknownRemat(ValueError):
  """A remat policy the estimate has no rule for."""


def _policy(table: dict[str, Any], remat: str) -> Any:
  """`table`'s entry for `remat`; a policy without one is an error naming it, never a silent default (a default
  would skew every estimate made from or to that policy)."""
  if remat not in table:
    raise UnknownRemat(f"remat_policy={remat!r}: the layout estimate has no rule for it (it knows "
                       f"{', '.join(sorted(table))}); choose one of those for --tune")
  return table[remat]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelFacts:
  """A dense transformer's sizes, from maxtext's config (MaxText.preflight.tune reads them)."""

  layers: int
  emb: int
  mlp: int
  heads: int
  kv_heads: int
  head_dim: int
  vocab: int
  sequence: int
  mlp_matrices: int = 3  # wi_0, wi_1, wo (gated activations); 2 without a gate

  def forward_shares(self) -> dict[str, float]:
    """Each part's share of a layer's forward FLOPs per token: q/k/v projections, output projection, MLP and the
    attention core (causal, so half of S x S)."""
    flops = {"qkv": self.emb * (self.heads + 2 * self.kv_heads) * self.head_dim,
             "out": self.heads * self.head_dim * self.emb, "mlp": self.mlp_matrices * self.emb * self.mlp,
             "attention": self.sequence * self.heads * self.head_dim}
    total = sum(flops.values())
    return {name: value / total for name, value in flops.items()}

  def parameters(self) -> int:
    """The decoder layers' weights (embeddings left out)."""
    attention = self.emb * (2 * self.heads + 2 * self.kv_heads) * self.head_dim
    return self.layers * (attention + self.mlp_matrices * self.emb * self.mlp)

  def recomputed(self, remat: str) -> float:
    """r: the share of the forward that the backward computes again under the remat policy."""
    share = self.forward_shares()
    return _policy({"full": 1.0, "save_qkv_proj": 1.0 - share["qkv"], "save_out_proj": 1.0 - share["out"],
            "save_dot_except_mlp": share["mlp"] + share["attention"], "save_dot_with_context_except_mlp": share["mlp"],
            "save_dot_except_mlpwi": share["mlp"] * 2 / 3 + share["attention"],
            "minimal_with_context": 0.0, "minimal": share["attention"], "minimal_with_context_and_quantization": 0.0,
            "minimal_with_quantization": share["attention"]}, remat)

  def saved_bytes(self, remat: str) -> int:
    """Bytes per token and layer a remat policy keeps for the backward (BF16), beyond the layer's input."""
    qkv = 2 * (self.heads + 2 * self.kv_heads) * self.head_dim
    context, out, mlp = 2 * self.heads * self.head_dim, 2 * self.emb, 2 * (self.mlp_matrices - 1) * self.mlp
    minimal = qkv + out + mlp + 2 * self.emb
    quantized = 2 * self.emb + self.heads * self.head_dim + self.mlp  # each GEMM input once more, in 8 bits
    return _policy({"full": 0, "save_qkv_proj": qkv, "save_out_proj": out, "save_dot_except_mlp": qkv + out,
            "save_dot_with_context_except_mlp": qkv + context + out, "save_dot_except_mlpwi": qkv + out + 2 * self.emb,
            "minimal_with_context": minimal + context, "minimal": minimal,
            "minimal_with_context_and_quantization": minimal + context + quantized,
            "minimal_with_quantization": minimal + quantized}, remat) + 2 * self.emb

  def logits_bytes(self) -> int:
    """Per token: the output head's logits in f32 and their gradient in BF16."""
    return 6 * self.vocab


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reference:
  """One program compiled at one layout, reduced to what the estimate moves to another layout."""

  layout: Layout
  compute_seconds: float  # every group but communication
  optimizer_seconds: float  # the elementwise kernels outside forward and backward
  gathered_bytes: float  # whole tensors all-gathered over the FSDP group per step
  scattered_bytes: float  # whole tensors reduce-scattered over it per step
  other_comm_seconds: float  # every other collective
  state_bytes: int  # arguments + outputs - aliased
  temporary_bytes: int
  model_flops: float  # maxtext's FLOPs per device and step at this layout
  scheduled_seconds: float = 0.0  # communication its compile leaves exposed beyond what the step's compute could hide
  reduced_bytes: float = 0.0  # whole tensors all-reduced over data x fsdp per step (TE's weight gradients, tensor>1)

  @classmethod
  def of(cls, layout: Layout, found: Iterable[Kernel], prediction: predict.Prediction, memory: Any,
         peaks: Peaks, factors: calibration.Factors | None = None) -> Reference:
    """From a compiled program's kernels, its prediction and its memory (MaxText.preflight.report.Memory)."""
    factors = factors or calibration.Factors.fitted()
    fsdp = layout.size("fsdp") * layout.size("context")
    batch_group, tensor = layout.size("data") * fsdp, layout.size("tensor")
    gathered = scattered = reduced = other = 0.0
    for kernel in found:
      work = kernel.work
      if work.math is not Math.COLLECTIVE or work.group < 2:
        continue
      whole = work.wire_bytes * work.group / (work.group - 1) * kernel.runs
      # Over the batch axes (fsdp, context, data: device ids `tensor` apart), not a tensor group of the same size.
      batch = not work.members or tensor == 1 or work.members[1] - work.members[0] == tensor
      if work.group == fsdp and batch and kernel.opcode.startswith("all-gather"):
        gathered += whole
      elif work.group == fsdp and batch and kernel.opcode.startswith("reduce-scatter"):
        scattered += whole
      elif work.group == batch_group > fsdp and batch and kernel.opcode.startswith("all-reduce"):
        reduced += whole / 2  # an all-reduce's wire is 2 (n - 1) / n of its operand
      else:
        other += calibration.collective_seconds(work, peaks, factors) * kernel.runs
    optimizer = sum(s for (_, phase), s in prediction.elementwise_seconds.items() if phase == "elsewhere")
    return cls(layout=layout, compute_seconds=prediction.step_seconds - prediction.seconds[predict.Group.COMMUNICATION],
               optimizer_seconds=optimizer, gathered_bytes=gathered, scattered_bytes=scattered, reduced_bytes=reduced,
               other_comm_seconds=other, scheduled_seconds=prediction.seconds[predict.Group.COMMUNICATION]
               - prediction.communication_range[0], state_bytes=memory.arguments + memory.outputs - memory.aliased,
               temporary_bytes=memory.temporaries + memory.code, model_flops=prediction.model_flops)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Estimate:
  """A layout's estimated step: compute and communication seconds, peak bytes per GPU, and tokens per GPU."""

  compute_seconds: float
  comm_seconds: float
  peak_bytes: float
  tokens: float  # per GPU and optimizer step
  model_flops: float  # per GPU and optimizer step
  scheduled_seconds: float = 0.0  # the reference's, scaled with the communication (the `links` rule)

  @property
  def step_seconds(self) -> float:
    """Communication hidden behind compute as far as the step's compute covers it, plus what the reference's
    compile could not hide even so (a layer loop whose collectives outlast its own compute)."""
    return max(self.compute_seconds, self.comm_seconds) + self.scheduled_seconds

  @property
  def unhidden_seconds(self) -> float:
    """None of it hidden: the interval's other end."""
    return self.compute_seconds + self.comm_seconds

  @property
  def seconds_per_token(self) -> float:
    return self.step_seconds / self.tokens

  @property
  def tflops_per_gpu(self) -> float:
    return self.model_flops / self.step_seconds / 1e12


def tensor_bytes(recomputed: float) -> float:
  """Bytes per activation element a tensor-parallel layer puts on the wire (module docstring)."""
  return 2 * (12 + 5 * recomputed)


def _tokens(layout: Layout, facts: ModelFacts) -> float:
  """Tokens one GPU processes per microbatch (a tensor or context group shares its sequences)."""
  return layout.per_device_batch * facts.sequence


def partitioning(layout: Layout) -> str:
  """The partitioning family of a layout: layouts of one family partition the program alike, so one compiled layout
  moves to another of its family by the module's rules; across families XLA's and TE's partitioners choose other
  collectives (TE's GEMMs under tensor parallelism all-reduce the weight gradient over data x fsdp instead of
  reduce-scattering it over fsdp), which no rule here foresees. `--tune` compiles a reference per family."""
  parts = (["pipeline"] if layout.stages > 1 else []) + (["tensor"] if layout.size("tensor") > 1 else [])
  return " + ".join(parts) or "fsdp and data"


def _fsdp_seconds(layout: Layout, ref: Reference, peaks: Peaks, devices: int, factors: calibration.Factors) -> float:
  """The reference's FSDP gathers and scatters moved to `layout` (the module's FSDP rule)."""
  fsdp = layout.size("fsdp") * layout.size("context")
  spans = (layout.dcn[1] * layout.dcn[2] > 1) or (fsdp > peaks.domain_gpus(devices))
  # Whole tensors a GPU handles per step: 1 / tensor of each weight, once per microbatch, its stage's layers.
  share = (ref.layout.size("tensor") / layout.size("tensor") * layout.accumulation / ref.layout.accumulation
           * ref.layout.stages / layout.stages)
  seconds = (ref.gathered_bytes + ref.scattered_bytes) * share * (fsdp - 1) / fsdp / calibration.bus_rate(spans, peaks,
                                                                                                            factors)
  if ref.reduced_bytes:
    group = layout.size("data") * fsdp
    seconds += (2 * (group - 1) / group * ref.reduced_bytes * share
                / calibration.bus_rate(layout.dcn[0] > 1 or spans, peaks, factors))
  return seconds


def _layout_seconds(layout: Layout, ref: Reference, facts: ModelFacts, peaks: Peaks, devices: int,
                    factors: calibration.Factors) -> float:
  """The collectives the data, tensor, context and pipeline rules give `layout` (FSDP's apart)."""
  micro, r = _tokens(layout, facts), facts.recomputed(layout.remat)
  tensor, fsdp = layout.size("tensor"), layout.size("fsdp") * layout.size("context")
  seconds = 0.0
  data = layout.size("data")
  if data > 1:
    gradient_shard = (ref.scattered_bytes / max(ref.layout.accumulation, 1) * ref.layout.size("tensor") / tensor
                      / fsdp)
    seconds += 2 * (data - 1) / data * gradient_shard / calibration.bus_rate(layout.dcn[0] > 1, peaks, factors)
  if tensor > 1:
    wire = (tensor - 1) * micro / layout.size("context") * facts.emb * tensor_bytes(r)
    seconds += facts.layers * layout.accumulation * wire / calibration.bus_rate(False, peaks, factors)
  context = layout.size("context")
  if context > 1:
    keys_values = micro * 2 * facts.kv_heads * facts.head_dim * 2
    seconds += ((3 + r) * facts.layers * layout.accumulation * (context - 1) * keys_values
                / calibration.bus_rate(False, peaks, factors))
  if layout.stages > 1:
    per_domain = peaks.domain_gpus(devices)
    iteration = micro * layout.stages / layout.microbatches * facts.emb * 2
    stage_spans = devices // layout.stages >= per_domain and devices > per_domain
    seconds += ((2 + r) * (layout.microbatches + layout.stages - 1) * layout.accumulation * iteration
                / calibration.bus_rate(stage_spans, peaks, factors))
  return seconds


def estimate(layout: Layout, ref: Reference, facts: ModelFacts, peaks: Peaks, devices: int,
             factors: calibration.Factors | None = None) -> Estimate:
  """`layout`'s step estimated from `ref` (the same program compiled at another layout) by the module's rules."""
  factors = factors or calibration.Factors.fitted()
  micro, micro_ref = _tokens(layout, facts), _tokens(ref.layout, facts)
  tokens, tokens_ref = micro * layout.accumulation, micro_ref * ref.layout.accumulation
  r, r_ref = facts.recomputed(layout.remat), facts.recomputed(ref.layout.remat)
  shards, shards_ref = layout.weight_shards, ref.layout.weight_shards
  compute = ((ref.compute_seconds - ref.optimizer_seconds) * tokens / tokens_ref * (3 + r) / (3 + r_ref)
             * layout.bubble / ref.layout.bubble + ref.optimizer_seconds * shards_ref / shards)
  tensor, tensor_ref = layout.size("tensor"), ref.layout.size("tensor")
  # The reference's own data, tensor, context and pipeline collectives are in its other collectives already: the
  # rules add what the layout has beyond them (never less than nothing).
  others = max(ref.other_comm_seconds + _layout_seconds(layout, ref, facts, peaks, devices, factors)
               - _layout_seconds(ref.layout, ref, facts, peaks, devices, factors), 0.0)
  comm = _fsdp_seconds(layout, ref, peaks, devices, factors) + others
  comm_ref = _fsdp_seconds(ref.layout, ref, peaks, devices, factors) + ref.other_comm_seconds
  scheduled = ref.scheduled_seconds * comm / comm_ref if comm_ref > 0 else 0.0

  activations_ref = micro_ref * (facts.layers * facts.saved_bytes(ref.layout.remat) + facts.logits_bytes() / tensor_ref)
  fixed = max(ref.temporary_bytes - activations_ref, 0) * tensor_ref / tensor
  activations = micro * (facts.layers * facts.saved_bytes(layout.remat) + facts.logits_bytes() / tensor)
  held = facts.parameters() * 2 / (layout.stages * tensor) if layout.stages > 1 else 0.0  # gathered once a step
  peak = ref.state_bytes * shards_ref / shards + fixed + activations + held
  return Estimate(compute_seconds=compute, comm_seconds=comm, scheduled_seconds=scheduled, peak_bytes=peak,
                  tokens=tokens, model_flops=ref.model_flops * tokens / tokens_ref)
