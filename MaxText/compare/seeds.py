# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Seed groups: several runs of one precision (other `data_shuffle_seed` / `init_weights_seed`) read as one.

Why: one run's eval gap mixes the precision's effect with the luck of one seed. A run named `NAME@SEED` (a run dir
named so, or `NAME@SEED=PATH`) belongs to group NAME. Each candidate run is paired with the baseline group's run of
the same SEED (the same initial weights and data order), and the group reports the mean of those paired eval gaps
across seeds with their spread and a 95% interval (Student's t over seeds). The baseline group's own seed-to-seed
spread of eval losses is the noise floor: a gap smaller than it is not told apart from a change of seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from MaxText.compare.schema import Comparison, ComparisonSettings, SeedGroup
from MaxText.compare.verdict import judge_interval

SEP = "@"


def split_name(name: str) -> tuple[str, str | None]:
  """("te_nvfp4", "1") for "te_nvfp4@1"; (name, None) for a run outside any seed group."""
  group, sep, seed = name.rpartition(SEP)
  return (group, seed) if sep and group and seed else (name, None)


def baseline_for(candidate: str, baseline: str, names: Sequence[str]) -> str:
  """The baseline run a candidate is compared with: the baseline group's run of the candidate's seed if there is one,
  else the named baseline."""
  (_, seed), (base_group, _) = split_name(candidate), split_name(baseline)
  same_seed = f"{base_group}{SEP}{seed}"
  return same_seed if seed is not None and same_seed in names else baseline


def _spread(values: list[float]) -> tuple[float | None, list[float] | None]:
  """(sample standard deviation, 95% t-interval of the mean), or Nones for fewer than two values."""
  if len(values) < 2:
    return None, None
  sd = float(np.std(values, ddof=1))
  half = float(stats.t.ppf(0.975, len(values) - 1)) * sd / math.sqrt(len(values))
  mean = float(np.mean(values))
  return sd, [mean - half, mean + half]


def groups(comparisons: Sequence[Comparison], baseline_eval: dict[str, float | None],
           baseline: str, settings: ComparisonSettings) -> list[SeedGroup]:
  """One SeedGroup per candidate group, when any run is named NAME@SEED; [] otherwise.

  `baseline_eval` maps each baseline-group run to its final eval loss (None without one). A group with a spread is
  judged like a run (`verdict.judge_interval`, `settings`' band): its mean gap and interval relative to the baseline
  runs' mean eval loss.
  """
  if not any(split_name(c.candidate)[1] is not None for c in comparisons) and split_name(baseline)[1] is None:
    return []
  base_losses = [v for v in baseline_eval.values() if v is not None]
  noise, _ = _spread(base_losses)
  base = float(np.mean(base_losses)) if base_losses else None  # the scale of the group verdicts' relative gaps
  by_group: dict[str, list[Comparison]] = {}
  for c in comparisons:
    by_group.setdefault(split_name(c.candidate)[0], []).append(c)
  out = []
  for name, members in by_group.items():
    paired = [c for c in members if c.final_eval_gap_nats is not None]
    missing = [f"{c.candidate} (no eval in common with {c.baseline})" for c in members if c not in paired]
    gaps = [c.final_eval_gap_nats for c in paired]
    sd, ci = _spread(gaps)
    notes = []
    if len(gaps) < 2:
      notes.append(f"{len(gaps)} paired run(s): no spread across seeds (not 0); run more seeds")
    if noise is None:
      notes.append(f"{len(base_losses)} baseline run(s) with an eval: no noise floor")
    mean = float(np.mean(gaps)) if gaps else None
    level = None
    if ci is not None and mean is not None and base is not None:
      level = judge_interval(mean / base, (ci[0] / base, ci[1] / base), settings)
    out.append(SeedGroup(
        group=name, runs=[c.candidate for c in members], paired_with=[c.baseline for c in paired],
        eval_gaps_nats=gaps, mean_eval_gap_nats=mean, sd_nats=sd, ci95=ci,
        baseline_noise_sd_nats=noise, baseline_runs=len(baseline_eval), unpaired=missing, verdict=level,
        differs_from_baseline=None if ci is None else bool(ci[0] > 0 or ci[1] < 0), note="; ".join(notes) or None,
    ))  # fmt: skip
  return out
