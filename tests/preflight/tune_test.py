# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""`--tune`'s parts that need no compile: the layouts it enumerates (MaxText.preflight.layouts), which GPUs a
collective joins and whether they span NVLink domains (classify.group_members, targets.Peaks), the estimate that
prunes (MaxText.preflight.estimate) and the branch and bound (MaxText.preflight.tune.search) on rows whose
predictions are built here. The compiles themselves: tests/te/tune_test.py."""

from __future__ import annotations

import math

import pytest

from MaxText.preflight import calibration, estimate, layouts, predict, report, tune
from MaxText.preflight.classify import Math, Work, group_members
from MaxText.preflight.kernels import Kernel
from MaxText.preflight.targets import TARGETS

GIB = 1024**3


def test_every_layout_uses_every_gpu_and_puts_the_across_domain_part_outermost():
  """128 GPUs in two domains of 64: each candidate's axes multiply to 128, its ici part to 64; the dcn part is on the
  first axis above 1 (so the one-process compile lays devices out as jax's hybrid mesh does); the global batch is
  a whole number of sequences that the batch axes split evenly."""
  space = layouts.Space(devices=128, domain=64)
  found = layouts.candidates(space)
  assert len(found) > 100 and len(set(found)) == len(found)
  for layout in found:
    assert math.prod(layout.ici) == 64 and layout.slices == 2, layout
    assert math.prod(layout.size(a) for a in layouts.AXES) == 128
    first = next(i for i, a in enumerate(layouts.AXES) if layout.size(a) > 1)
    assert all(size == 1 for i, size in enumerate(layout.dcn) if i != first) or layout.dcn[0] > 1, layout
    sequences = layout.per_device_batch * 128
    assert sequences.is_integer() and sequences % (layout.size("data") * layout.size("fsdp")) == 0, layout
    compiled = dict(o.split("=") for o in layout.compiled())
    assert all(int(compiled[f"ici_{a}_parallelism"]) == layout.size(a) for a in layouts.AXES)
    assert "dcn_data_parallelism" not in compiled
  labels = {layout.label() for layout in found}
  assert "fsdp=64 | across domains data=2 | b=3 full" in labels
  assert "fsdp=64 | across domains fsdp=2 | b=1 save_qkv_proj" in labels


def test_the_overrides_for_one_slice_per_node_lay_devices_out_as_compiled():
  """data 2 x fsdp 64 on 32 nodes of 4: the node's 4 GPUs are the innermost fsdp part, the rest across nodes; a
  tensor group of 8 spans two nodes; on one node the keys are the compiled ones."""
  layout = _layout(ici=(1, 64, 1, 1), dcn=(2, 1, 1, 1))
  assert layout.overrides(4)[:8] == ["ici_data_parallelism=1", "ici_fsdp_parallelism=4", "ici_context_parallelism=1",
                                     "ici_tensor_parallelism=1", "dcn_data_parallelism=2", "dcn_fsdp_parallelism=16",
                                     "dcn_context_parallelism=1", "dcn_tensor_parallelism=1"]
  tensor = _layout(ici=(1, 8, 1, 8), dcn=(2, 1, 1, 1)).overrides(4)
  assert "ici_tensor_parallelism=4" in tensor and "dcn_tensor_parallelism=2" in tensor and "dcn_fsdp_parallelism=8" in tensor
  assert _layout(ici=(1, 4, 1, 1)).overrides(4) == _layout(ici=(1, 4, 1, 1)).compiled()


def test_a_fixed_global_batch_varies_the_accumulation_instead_of_the_batch():
  found = layouts.candidates(layouts.Space(devices=8, domain=8, global_batch=32, tensor=(1,), context=(1,)))
  assert found and all(layout.per_device_batch * 8 * layout.accumulation == 32 for layout in found)
  assert {layout.accumulation for layout in found} == {1, 2, 4}  # 8 would leave half a sequence per GPU


def test_a_collectives_group_is_read_as_device_ids_in_all_three_forms():
  assert group_members("replica_groups=[2,64]<=[128], dimensions={0}", 128) == tuple(range(64))
  assert group_members("replica_groups=[64,2]<=[2,64]T(1,0), dimensions={0}", 128) == (0, 64)
  assert group_members("replica_groups=[4,2]<=[2,2,2]T(2,1,0)", 8) == (0, 4)
  assert group_members("replica_groups=mesh['data'=2,'fsdp'=4] {'data'}, d", 8) == (0, 4)
  assert group_members("replica_groups=mesh['data'=2,'fsdp'=4] {'fsdp'}, d", 8) == (0, 1, 2, 3)
  assert group_members("replica_groups={{0,2},{1,3}}, d", 4) == (0, 2)
  assert group_members("replica_groups={}, d", 4) == (0, 1, 2, 3)


def test_a_group_of_two_gpus_in_two_racks_goes_over_the_network_and_64_in_one_over_nvlink():
  """Group size alone said the opposite of the first: 2 GPUs are fewer than a domain holds, but GPUs 0 and 64 of a
  128-GPU run lie in two NVL72 racks (64 each)."""
  peaks = TARGETS["gb300"].peaks
  assert peaks.domain_gpus(128) == 64 and peaks.domain_gpus(64) == 64 and peaks.domain_gpus(4) == 4
  assert TARGETS["b200"].peaks.domain_gpus(16) == 8
  wire = 10**9

  def seconds(members: tuple[int, ...]) -> float:
    work = Work(math=Math.COLLECTIVE, wire_bytes=wire, group=len(members), members=members, devices=128)
    return predict.kernel_seconds(Kernel(name="c", opcode="all-reduce", target="", bytes=0, op_name="", work=work),
                                  peaks)

  assert seconds((0, 64)) == pytest.approx(wire / peaks.network)
  assert seconds(tuple(range(64, 128))) == pytest.approx(wire / peaks.nvlink)
  assert seconds(tuple(range(128))) == pytest.approx(wire / peaks.network)


FACTS = estimate.ModelFacts(layers=126, emb=16384, mlp=53248, heads=128, kv_heads=8, head_dim=128, vocab=128256,
                            sequence=8192)


def _reference(layout: layouts.Layout, gathered: float = 4e12, scattered: float = 2e12) -> estimate.Reference:
  return estimate.Reference(layout=layout, compute_seconds=10.0, optimizer_seconds=0.5, gathered_bytes=gathered,
                            scattered_bytes=scattered, other_comm_seconds=0.0, state_bytes=40 * GIB,
                            temporary_bytes=60 * GIB, model_flops=1e16)


def _layout(ici=(1, 128, 1, 1), dcn=(1, 1, 1, 1), batch=1.0, accumulation=1, remat="full") -> layouts.Layout:
  return layouts.Layout(ici=ici, dcn=dcn, per_device_batch=batch, accumulation=accumulation, remat=remat)


def test_the_estimate_moves_fsdp_inside_a_rack_off_the_network_and_scales_compute_and_memory():
  peaks = TARGETS["gb300"].peaks
  own = _layout()
  ref = _reference(own)
  same = estimate.estimate(own, ref, FACTS, peaks, 128)
  assert same.compute_seconds == pytest.approx(10.0)
  network = peaks.network * calibration.NETWORK_BUS_EFFICIENCY.value  # collectives at nccl-tests' bus bandwidth
  nvlink = peaks.nvlink * calibration.NVLINK_BUS_EFFICIENCY.value
  assert same.comm_seconds == pytest.approx(6e12 * 127 / 128 / network)
  assert same.peak_bytes == pytest.approx(100 * GIB)
  inside = estimate.estimate(_layout(ici=(1, 64, 1, 1), dcn=(2, 1, 1, 1)), ref, FACTS, peaks, 128)
  gradient_shard = 2e12 / 64
  assert inside.comm_seconds == pytest.approx(6e12 * 63 / 64 / nvlink + gradient_shard / network)
  assert inside.peak_bytes == pytest.approx(80 * GIB + 60 * GIB)  # state on 64 shards instead of 128
  triple = estimate.estimate(_layout(batch=3.0), ref, FACTS, peaks, 128)
  assert triple.compute_seconds == pytest.approx(9.5 * 3 + 0.5) and triple.tokens == 3 * 8192
  assert triple.seconds_per_token < same.seconds_per_token  # the same gathers carry three times the tokens
  saved = estimate.estimate(_layout(remat="minimal_with_context"), ref, FACTS, peaks, 128)
  assert saved.compute_seconds == pytest.approx(9.5 * 3 / 4 + 0.5) and saved.peak_bytes > same.peak_bytes


def _row(step_estimate: float, peak_estimate: float, name: str) -> tune.Row:
  est = estimate.Estimate(compute_seconds=step_estimate, comm_seconds=0.0,
                          peak_bytes=peak_estimate, tokens=1000, model_flops=1e15)
  return tune.Row(program="run", layout=_layout(remat=name), estimate=est)


def _compiled(step: float, peak: int) -> tune.Compiled:
  prediction = predict.Prediction(seconds={g: 0.0 for g in predict.Group} | {predict.Group.MLP_GEMMS: step},
                                  bytes={}, kernels={}, flops={}, model_flops=1e15)
  memory = report.Memory(arguments=peak, outputs=0, aliased=0, temporaries=0, code=0, device=100)
  return tune.Compiled(prediction=prediction, memory=memory, tokens=1000)


def test_the_search_compiles_by_estimate_stops_when_no_estimate_can_win_and_never_picks_what_does_not_fit():
  """Compiled truth per row (step seconds, peak bytes against 100 jax may use): the estimated-fastest row does not
  fit, so the next fitting one is best; rows estimated far over memory are skipped; the search stops at the first
  row estimated more than TOLERANCE slower than the best; exhaustive compiles every row and agrees."""
  truth = {"a": (1.0, 120), "b": (1.4, 90), "c": (1.5, 80), "d": (1.2, 90), "e": (3.0, 50), "f": (0.5, 95)}
  estimates = {"a": (1.0, 95), "b": (1.3, 90), "c": (1.45, 80), "d": (1.2, 500), "e": (2.0, 50), "f": (0.9, 200)}

  def run(exhaustive: bool) -> tuple[tune.Search, list[str]]:
    compiled: list[str] = []

    def compile_row(row: tune.Row) -> None:
      compiled.append(row.layout.remat)
      row.compiled = _compiled(*truth[row.layout.remat])

    reference = _row(*estimates["c"], "c")
    reference.compiled, reference.reference = _compiled(*truth["c"]), True
    others = [_row(*estimates[n], n) for n in "abdef"]
    return tune.search(reference, others, compile_row, device_bytes=100, budget=10, exhaustive=exhaustive), compiled

  pruned, compiled = run(exhaustive=False)
  assert compiled == ["a", "b"]  # f and d estimated > 110; e (2.0 * 0.9 > 1.4) not worth a compile
  assert pruned.best.layout.remat == "b" and pruned.best.compiled.memory.fits
  full, compiled = run(exhaustive=True)
  assert sorted(compiled) == ["a", "b", "d", "e", "f"]
  assert full.best.layout.remat == "f"  # the truth the memory estimate hid: the slack is what bounds that miss
  assert all(r.compiled.memory.fits for r in (pruned.best, full.best))


def test_the_search_stops_at_its_compile_budget():
  def compile_row(row: tune.Row) -> None:
    row.compiled = _compiled(10.0, 200)  # none fits: nothing bounds the search but the budget

  reference = _row(1.0, 10, "r")
  reference.compiled = _compiled(10.0, 200)
  found = tune.search(reference, [_row(1.0 + i / 10, 10, str(i)) for i in range(8)], compile_row, 100, budget=3)
  assert found.compiles == 4 and found.best is None  # the reference and three more


def test_the_search_compiles_every_row_that_may_still_win_and_stops_at_the_first_that_cannot():
  """The bound, pinned on both sides: the reference compiles at 1.0 and the first row at 0.9, so the best drops
  mid-search; every later row estimated below 0.9, or above it by less than TOLERANCE (estimate x (1 - TOLERANCE)
  under the best), compiles, and the search stops at the first row whose estimate x (1 - TOLERANCE) is over it.
  Why: a bound loosened the wrong way (1 + TOLERANCE, or no tolerance) stops before a row estimated faster than the
  best, and the table then reports a best that a compile it skipped would have beaten."""
  edge = 0.9 / (1 - tune.TOLERANCE)  # the slowest estimate that may still beat a best of 0.9
  estimates = {"a": 0.80, "b": 0.85, "c": 0.88, "d": edge * 0.99, "e": edge * 1.01, "f": edge * 1.02}
  truth = {"a": 0.90, "b": 0.95, "c": 0.99, "d": 1.2, "e": 0.5, "f": 0.4}  # e and f would win: the bound's price
  compiled: list[str] = []

  def compile_row(row: tune.Row) -> None:
    compiled.append(row.layout.remat)
    row.compiled = _compiled(truth[row.layout.remat], 50)

  reference = _row(1.0, 50, "ref")
  reference.compiled, reference.reference = _compiled(1.0, 50), True
  found = tune.search(reference, [_row(estimates[n], 50, n) for n in "fedcba"], compile_row, device_bytes=100,
                      budget=10)
  assert compiled == ["a", "b", "c", "d"], compiled
  assert found.best.layout.remat == "a" and found.compiles == 5
  # The rule itself, row by row in the order searched: a row compiles exactly when its estimate may beat the best
  # compiled before it; the first that cannot ends the search.
  best = 1.0
  for row in found.rows[1:]:
    may_win = row.estimate.seconds_per_token * (1 - tune.TOLERANCE) <= best / 1000
    assert (row.compiled is not None) == may_win, (row.layout.remat, row.estimate.seconds_per_token, best)
    if not may_win:
      break
    best = min(best, truth[row.layout.remat])


def test_the_data_parallel_gradient_reduction_is_counted_once_a_step_whatever_the_reference_accumulated():
  """A reference compiled at gradient_accumulation_steps=4 reduce-scatters its gradients once per microbatch, so its
  scattered bytes are 4 x one gradient; a data-parallel group all-reduces the accumulated gradient once a step.
  Estimated from it, a data=2 layout (fsdp=64 in each rack, data across the two) all-reduces one gradient shard,
  2 (d - 1) / d x gradient / 64 on the network, at accumulation 1 or 4, and its whole communication is what the same
  program compiled at accumulation 1 (a quarter of the bytes) gives. The network's seconds per byte are read off the
  estimate itself (the reference's own fsdp=128 layout, which crosses racks), and the all-reduce is separated from the
  FSDP term by the accumulation (that term is per microbatch), so the test holds whatever rate a link is priced at.
  Why: a term that scales with the reference's accumulation makes every data-parallel layout look slower the more the
  run accumulates, and the search then prunes the wrong rows."""
  peaks = TARGETS["gb300"].peaks
  one = _reference(_layout(accumulation=1), gathered=4e12, scattered=2e12)
  four = _reference(_layout(accumulation=4), gathered=4 * 4e12, scattered=4 * 2e12)
  network_per_byte = estimate.estimate(_layout(), four, FACTS, peaks, 128).comm_seconds / (6e12 * 127 / 128)

  def comm(accumulation: int, ref: estimate.Reference) -> float:
    data = _layout(ici=(1, 64, 1, 1), dcn=(2, 1, 1, 1), accumulation=accumulation)
    return estimate.estimate(data, ref, FACTS, peaks, 128).comm_seconds

  per_microbatch = (comm(4, four) - comm(1, four)) / 3
  all_reduce = comm(1, four) - per_microbatch
  assert per_microbatch > 0 and all_reduce > 0
  assert all_reduce == pytest.approx(2 * (2 - 1) / 2 * 2e12 / 64 * network_per_byte, rel=1e-9)
  for accumulation in (1, 4):
    assert comm(accumulation, four) == pytest.approx(comm(accumulation, one), rel=1e-9), accumulation


def test_the_first_compile_of_another_partitioning_family_re_estimates_that_family():
  """The reference is fsdp-only; the tensor-parallel rows are estimated fastest from it, as the 405B NVFP4 program's
  were (TE's weight gradients all-reduced over data x fsdp under tensor parallelism: 831 ms per 1,000 tokens
  estimated, 2,638 compiled). The first tensor row compiles, becomes its family's reference, and its family is
  estimated again from it (here: at what they compile to); the search then goes on with the fsdp rows and stops
  before the re-estimated tensor rows. Red where the family is not re-estimated (every tensor row compiles first)."""
  def layout(tensor: int, batch: float) -> layouts.Layout:
    return _layout(ici=(1, 64 // tensor, 1, tensor), dcn=(2, 1, 1, 1), batch=batch)

  truth = {layout(4, 1): 2.0, layout(2, 1): 2.1, layout(8, 1): 2.2, layout(1, 1): 0.95, layout(1, 2): 0.97}
  first = {layout(4, 1): 0.5, layout(2, 1): 0.6, layout(8, 1): 0.7, layout(1, 1): 0.9, layout(1, 2): 1.0,
           _layout(): 1.5}

  def row(lay: layouts.Layout) -> tune.Row:
    est = estimate.Estimate(compute_seconds=first[lay], comm_seconds=0.0, peak_bytes=50, tokens=1000, model_flops=1e15)
    return tune.Row(program="run", layout=lay, estimate=est)

  def run(rebase: bool) -> tuple[tune.Search, list[layouts.Layout]]:
    compiled: list[layouts.Layout] = []

    def compile_row(r: tune.Row) -> None:
      compiled.append(r.layout)
      r.compiled = _compiled(truth[r.layout], 50)

    def estimator_from(r: tune.Row):
      assert estimate.partitioning(r.layout) == "tensor"
      return lambda lay: estimate.Estimate(compute_seconds=truth[lay], comm_seconds=0.0, peak_bytes=50, tokens=1000,
                                           model_flops=1e15)

    reference = row(_layout())
    reference.compiled, reference.reference = _compiled(1.5, 50), True
    found = tune.search(reference, [row(lay) for lay in truth], compile_row, device_bytes=100, budget=10,
                        estimator_from=estimator_from if rebase else None)
    return found, compiled

  found, compiled = run(rebase=True)
  assert compiled == [layout(4, 1), layout(1, 1), layout(1, 2)], [c.label() for c in compiled]
  assert found.best.layout == layout(1, 1)
  moved = [r for r in found.rows if r.estimated_from]
  assert {r.layout for r in moved} == {layout(2, 1), layout(8, 1)}
  assert all(r.estimated_from == layout(4, 1).label() for r in moved)
  assert [r.layout for r in found.rows] == [_layout(), *compiled, layout(2, 1), layout(8, 1)]
  _, compiled = run(rebase=False)
  assert compiled[:3] == [layout(4, 1), layout(2, 1), layout(8, 1)]  # the budget goes to the family that loses
