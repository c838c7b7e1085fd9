# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The layout estimate's shard rules (MaxText.preflight.estimate, MaxText.preflight.layouts.Layout.weight_shards):
what the optimizer update and a weight's bytes are divided by. The estimate's link and compute rules:
tests/preflight/tune_test.py."""

from __future__ import annotations

import dataclasses

import pytest

from MaxText.preflight import estimate, layouts
from MaxText.preflight.targets import TARGETS

GIB = 1024**3
#: Llama 3.1 405B's sizes at 8k tokens (the tune tests' model).
FACTS = estimate.ModelFacts(layers=126, emb=16384, mlp=53248, heads=128, kv_heads=8, head_dim=128, vocab=128256,
                            sequence=8192)
#: The reference: fsdp=128 over two racks of 64 GB300s; 10 s of compute of which 0.5 s the optimizer update, 40 GiB
#: of weights and optimizer state per GPU, 60 GiB of temporaries.
REFERENCE = estimate.Reference(layout=layouts.Layout(ici=(1, 128, 1, 1), dcn=(1, 1, 1, 1), per_device_batch=1,
                                                     accumulation=1, remat="full"),
                               compute_seconds=10.0, optimizer_seconds=0.5, gathered_bytes=4e12, scattered_bytes=2e12,
                               other_comm_seconds=0.0, state_bytes=40 * GIB, temporary_bytes=60 * GIB, model_flops=1e16)


def _estimate(ici: tuple[int, int, int, int], dcn: tuple[int, int, int, int] = (1, 1, 1, 1)) -> estimate.Estimate:
  """The estimate of a layout with the reference's batch, accumulation and remat (so the same tokens per GPU)."""
  layout = layouts.Layout(ici=ici, dcn=dcn, per_device_batch=1, accumulation=1, remat="full")
  return estimate.estimate(layout, REFERENCE, FACTS, TARGETS["gb300"].peaks, 128)


def test_the_optimizer_update_takes_less_time_on_more_weight_shards():
  """The update is elementwise over one GPU's shard of the weights and optimizer state: at the same tokens per GPU
  the forward and backward cost the same (9.5 s), and the update's 0.5 s on 128 shards is 1 s on 64 and 2 s on 32
  (data parallelism replicates, so its GPUs do not share the update). Red where the shard count multiplies."""
  optimizer = {}
  for shards, ici, dcn in [(128, (1, 128, 1, 1), (1, 1, 1, 1)), (64, (1, 64, 1, 1), (2, 1, 1, 1)),
                           (32, (2, 32, 1, 1), (2, 1, 1, 1))]:
    assert layouts.Layout(ici=ici, dcn=dcn, per_device_batch=1, accumulation=1, remat="full").weight_shards == shards
    optimizer[shards] = _estimate(ici, dcn).compute_seconds - 9.5
  assert optimizer == pytest.approx({128: 0.5, 64: 1.0, 32: 2.0}), optimizer


def test_context_parallelism_shards_the_weights_as_fsdp_does():
  """maxtext's rules shard `embed` over fsdp and context: fsdp 32 x context 2 splits each weight (and its optimizer
  state) over 64 GPUs, as fsdp 64 does, so the two layouts' peak memory is the same 40 GiB x 128 / 64 + 60 GiB =
  140 GiB. Weight shards of fsdp x tensor alone count 32 and estimate 220 GiB, and --tune then prunes every
  context-parallel layout as over memory."""
  context = layouts.Layout(ici=(1, 32, 2, 1), dcn=(2, 1, 1, 1), per_device_batch=1, accumulation=1, remat="full")
  assert context.weight_shards == 64
  assert layouts.Layout(ici=(1, 8, 2, 4), dcn=(2, 1, 1, 1), per_device_batch=1, accumulation=1,
                        remat="full").weight_shards == 64  # and with tensor parallelism beside it
  with_context, with_fsdp = _estimate((1, 32, 2, 1), (2, 1, 1, 1)), _estimate((1, 64, 1, 1), (2, 1, 1, 1))
  assert with_context.peak_bytes / GIB == pytest.approx(140)
  assert with_context.peak_bytes == pytest.approx(with_fsdp.peak_bytes)


def test_an_unknown_remat_policy_is_an_error_naming_it_not_a_silent_default():
  with pytest.raises(estimate.UnknownRemat, match="remat_policy='my_policy'.*it knows .*full"):
    FACTS.recomputed("my_policy")
  with pytest.raises(estimate.UnknownRemat, match="remat_policy='my_policy'"):
    FACTS.saved_bytes("my_policy")


def test_pipeline_layouts_are_searched_with_whole_stages_and_keep_the_keys_maxtext_takes():
  """Stages must divide the layers (405B's 126 take 2, not 4 or 8), lie outside fsdp (stage 0 on the first rack),
  run 2 microbatches a stage, and gather the weights once a step."""
  space = layouts.Space(devices=128, domain=64, stages=(1, 2, 4, 8), layers=126, batches=(2,), remat=("full",))
  piped = [c for c in layouts.candidates(space) if c.stages > 1]
  assert piped and {c.stages for c in piped} == {2}
  tp4 = next(c for c in piped if c.size("tensor") == 4)
  assert (tp4.size("fsdp"), tp4.microbatches, tp4.weight_shards) == (16, 4, 128)
  assert tp4.compiled() == ["ici_data_parallelism=1", "ici_fsdp_parallelism=16", "ici_context_parallelism=1",
                            "ici_tensor_parallelism=4", "ici_pipeline_parallelism=2", "per_device_batch_size=2",
                            "gradient_accumulation_steps=1", "remat_policy=full", "num_pipeline_microbatches=4",
                            "pipeline_fsdp_ag_once=true"]
  assert tp4.bubble == pytest.approx(5 / 4)
  assert not [c for c in layouts.candidates(dataclasses.replace(space, layers=0)) if c.stages > 1]


def test_a_pipeline_pays_its_bubble_and_its_stage_transfers_and_gathers_only_its_stages_layers():
  flat = layouts.Layout(ici=(1, 64, 1, 1), dcn=(2, 1, 1, 1), per_device_batch=1, accumulation=1, remat="full")
  piped = layouts.Layout(ici=(1, 64, 1, 1), dcn=(1, 1, 1, 1), per_device_batch=1, accumulation=1, remat="full",
                         stages=2, microbatches=4)
  peaks = TARGETS["gb300"].peaks
  all_reduce = 2 * (2 - 1) / 2 * 2e12 / 64 / (peaks.network * 0.92)  # the flat reference's own, across the racks
  ref = dataclasses.replace(REFERENCE, layout=flat, other_comm_seconds=all_reduce)
  one, two = estimate.estimate(flat, ref, FACTS, peaks, 128), estimate.estimate(piped, ref, FACTS, peaks, 128)
  assert two.compute_seconds == pytest.approx(9.5 * 5 / 4 + 0.5 / 2)  # the bubble; the update on twice the shards
  gathers = 6e12 / 2 * 63 / 64 / (peaks.nvlink * 0.755)
  transfers = 3 * (4 + 2 - 1) * (8192 * 2 / 4 * 16384 * 2) / (peaks.network * 0.92)  # stages fill a rack each
  assert two.comm_seconds == pytest.approx(gathers + transfers)
  held = FACTS.parameters() * 2 / 2
  assert two.peak_bytes == pytest.approx(one.peak_bytes - 20 * GIB + held)
