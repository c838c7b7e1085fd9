# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""`--tune` (MaxText.preflight.tune) on real compiles: the tiny model's every candidate in a small space compiled for
4 B200s once (exhaustive), then the pruned search replayed over those compiles, so that pruning, the fit rule and
the refusals are all judged against what a full search finds, at the cost of one full search (about 10 compiles of
the tiny BF16 step). The CPU tests of each part: tests/preflight/tune_test.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.helpers import TINY_YML

#: The tiny model in BF16 with the recipes' attention (TE's cuDNN fused attention) and data (TFDS, packed sequences:
#: a compile reads no data).
TINY_BF16 = ["base_emb_dim=128", "head_dim=32", "base_mlp_dim=256", "per_device_batch_size=1", "max_target_length=128",
             "hardware=gpu", "attention=cudnn_flash_te", "max_segments_per_seq=4", "dataset_type=tfds"]


@pytest.fixture(scope="module")
def full(te):
  """The tiny BF16 run's every candidate compiled for 4 B200s: fsdp 4 at batch 1 (the run's) and 2, tensor 2 x fsdp 2
  at batch 0.5, 1 and 2, full remat; context 2 with each is refused by maxtext with packed sequences at trace time,
  in seconds, without a compile (the search passes context sizes of its own only where maxtext allows them)."""
  del te
  from MaxText.backends import environment  # pylint: disable=import-outside-toplevel  # jax: after the fixture
  from MaxText.preflight import layouts, library, tune  # pylint: disable=import-outside-toplevel

  space = layouts.Space(devices=4, domain=4, batches=(1, 2), tensor=(1, 2), context=(1, 2), data=(1,),
                        remat=("full",), sequence=128)
  with environment.answering(library.target_environment("b200", 4)):
    return tune.tune(str(TINY_YML), TINY_BF16, "b200", 4, fraction=0.75, against=(), space=space, exhaustive=True)


def _replayed(full, device_bytes: int, budget: int = 6):
  """The pruned search over the full search's rows, each compile answered by the full search's (no compile here)."""
  from MaxText.preflight import tune  # pylint: disable=import-outside-toplevel

  def fits(row):  # the memory verdict against `device_bytes`
    if row.compiled is None:
      return None
    return dataclasses.replace(row.compiled, memory=dataclasses.replace(row.compiled.memory, device=device_bytes))

  rows = full.results["run"].rows
  recorded = {row.layout: row for row in rows}

  def compile_row(row):
    row.compiled, row.reason = fits(recorded[row.layout]), recorded[row.layout].reason

  reference = dataclasses.replace(rows[0], compiled=fits(rows[0]))
  fresh = [tune.Row(program="run", layout=row.layout, estimate=row.estimate) for row in rows[1:]]
  pruned = tune.search(reference, fresh, compile_row, device_bytes, budget)
  exhaustive = tune.Search(program="run", rows=[reference, *(dataclasses.replace(r, compiled=fits(r)) for r in rows[1:])])
  return pruned, exhaustive


def test_the_pruned_search_picks_what_the_full_search_picks_in_no_more_compiles(full):
  """Against the GPU's memory, and against a device one byte too small for the fastest layout per token: the same
  best either way, never one that does not fit, in no more compiles. (This tiny search's five rows all lie within
  the bound's tolerance of the best, so the pruned search compiles each of them; tests/preflight/tune_test.py pins
  where the bound stops.)"""
  compiled = [row for row in full.results["run"].rows if row.compiled is not None]
  fastest = min(compiled, key=lambda row: row.compiled.seconds_per_token)
  for device_bytes in (compiled[0].compiled.memory.device, fastest.compiled.memory.peak - 1):
    pruned, exhaustive = _replayed(full, device_bytes)
    assert exhaustive.best is not None and exhaustive.best.compiled.memory.fits, device_bytes
    assert pruned.best is not None and pruned.best.layout == exhaustive.best.layout, (device_bytes, pruned.best.layout,
                                                                                       exhaustive.best.layout)
    assert pruned.compiles <= exhaustive.compiles, (pruned.compiles, exhaustive.compiles)
  assert exhaustive.best.layout != fastest.layout  # the fit rule decided it


def test_a_layout_maxtext_refuses_is_a_row_with_its_reason(full):
  rows = full.results["run"].rows
  refused = [row for row in rows if row.reason]
  assert refused and all(row.layout.size("context") == 2 and row.compiled is None for row in refused)
  assert all("Packing is only supported for load balanced ring attention" in row.reason for row in refused)
  assert all(row.status == "refused" for row in refused)
  assert any("refused" in line for line in full.lines) and any(refused[0].reason in line for line in full.lines)


def test_the_json_has_the_candidates_the_best_and_its_overrides(full):
  payload = json.loads(json.dumps(full.payload))  # what --json writes
  tuned = payload["tune"]
  best = tuned["best"]["run"]
  assert set(best) >= {"overrides", "step_seconds", "step_interval_seconds", "peak_bytes"}
  low, high = best["step_interval_seconds"]
  assert high >= best["step_seconds"] >= low > 0 and best["peak_bytes"] > 0
  assert any(o.startswith("ici_fsdp_parallelism=") for o in best["overrides"])
  rows = tuned["candidates"]
  assert len(rows) == len(full.results["run"].rows) and rows[0]["reference"]
  assert {row["status"] for row in rows} == {"fits", "refused"}
  for row in rows:
    assert set(row) >= {"program", "layout", "overrides", "status", "estimate", "compiled", "reason"}
    assert (row["compiled"] is None) == (row["status"] == "refused")
  assert tuned["speedup"] == {} and "approximation" in tuned
