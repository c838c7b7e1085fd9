# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What `make quickstart` and the studies train, and how a run's progress reads: the precisions (each a name, its
maxtext overrides and a description), a run (a precision and a seed), and the progress lines made of maxtext's log.

Why a module of its own: the quickstart's command line (MaxText.quickstart) drives these; the catalogue and the
log reader are data and parsing, without jax, that its tests and the docs read on their own.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable

BASELINE = "bf16"
#: Progress lines per run: the mean training loss of the steps since the previous line, this many times.
PROGRESS_LINES = 6
#: ... and at least one line this often (seconds) while steps arrive: on a busy machine 50 steps can take minutes.
PROGRESS_SECONDS = 30.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Precision:
  """One training run of the quickstart: its name (run dir, report row) and its maxtext overrides."""

  name: str
  overrides: tuple[str, ...]
  description: str
  #: The late switch (nvfp4_bf16_forward_from_step) at this fraction of the run's steps; None: no switch.
  forward_switch_at: float | None = None

  def overrides_for(self, steps: int) -> tuple[str, ...]:
    """`overrides`, plus the late switch's step for a run of `steps` steps (at least 1, before the last step)."""
    if self.forward_switch_at is None:
      return self.overrides
    switch = min(max(1, round(self.forward_switch_at * steps)), steps - 1)
    return (*self.overrides, f"nvfp4_bf16_forward_from_step={switch}")


#: The NVFP4 runs log their per-GEMM quantization statistics every this many steps (compare draws the heatmaps).
STATS_INTERVAL = 25

PRECISIONS = (
    Precision(
        name=BASELINE,
        overrides=("quantization=te_nvfp4", "nvfp4_mlp_precision=bf16"),
        description="baseline: te_nvfp4 with every GEMM in bf16 (same initial weights as the quantized runs)",
    ),
    Precision(
        name="fp8",
        overrides=("quantization=fp8",),
        description="maxtext's fp8 (the published comparison's baseline)",
    ),
    Precision(
        name="te_nvfp4",
        overrides=("quantization=te_nvfp4", f"nvfp4_stats_interval={STATS_INTERVAL}"),
        description="NVFP4 MLP GEMMs, random Hadamard transform on wgrad, stochastic rounding",
    ),
    Precision(
        name="te_nvfp4_no_rht",
        overrides=("quantization=te_nvfp4_no_rht", f"nvfp4_stats_interval={STATS_INTERVAL}"),
        description="NVFP4 MLP GEMMs without the Hadamard transform",
    ),
)
PRECISION_NAMES = tuple(p.name for p in PRECISIONS)

#: `make study` adds the two ways the NVFP4 recipe keeps some GEMMs in BF16 (docs/numerics.md#the-recipe-around-the-gemms,
#: docs/recipe-switches.md).
STUDY_PRECISIONS = PRECISIONS + (
    Precision(
        name="te_nvfp4_last_bf16",
        overrides=("quantization=te_nvfp4", "nvfp4_bf16_last_layers=1", f"nvfp4_stats_interval={STATS_INTERVAL}"),
        description="te_nvfp4 with the last decoder layer's MLP in BF16",
    ),
    Precision(
        name="te_nvfp4_late_fwd",
        overrides=("quantization=te_nvfp4", f"nvfp4_stats_interval={STATS_INTERVAL}"),
        description="te_nvfp4 whose forward GEMMs switch to BF16 for the last 20% of the steps (dgrad, wgrad stay NVFP4)",
        forward_switch_at=0.8,
    ),
)
STUDY_NAMES = tuple(p.name for p in STUDY_PRECISIONS)

#: `make study-attention`: what the attention projections' precision costs, beside fp8 and the MLP-only recipe
#: (docs/quickstart.md#make-study-attention): FP8 projections (the default pair's), and NVFP4 ones (every dense GEMM
#: in NVFP4, as upstream maxtext's te_nvfp4).
ATTENTION_PRECISIONS = (
    Precision(
        name="te_nvfp4_fp8attn",
        overrides=("quantization=te_nvfp4", "nvfp4_attention_precision=fp8", f"nvfp4_stats_interval={STATS_INTERVAL}"),
        description="te_nvfp4 with the attention projections in FP8",
    ),
    Precision(
        name="te_nvfp4_all",
        overrides=("quantization=te_nvfp4", "nvfp4_attention_precision=nvfp4", f"nvfp4_stats_interval={STATS_INTERVAL}"),
        description="te_nvfp4 with the attention projections in NVFP4 too: every dense GEMM in NVFP4",
    ),
)
ATTENTION_STUDY_NAMES = (BASELINE, "fp8", "te_nvfp4", *(p.name for p in ATTENTION_PRECISIONS))
#: Every precision a run can be named by (--precisions).
ALL_PRECISIONS = STUDY_PRECISIONS + ATTENTION_PRECISIONS


# maxtext's per-step log lines (absl, stderr): "completed step: 12, seconds: 0.243, ..., loss: 7.123, lm_loss: ..."
# and "Completed eval after train step 75, loss=7.480, perplexity=...".
_TRAIN_LINE = re.compile(r"completed step: (\d+), seconds: ([^,\s]+),.*?, loss: ([^,\s]+)")
_EVAL_LINE = re.compile(r"Completed eval after train step (\d+), loss=([^,\s]+)")


def format_seconds(seconds: float) -> str:
  """`75.2` -> `1m15s`: the elapsed times in the progress lines."""
  minutes, secs = divmod(int(round(seconds)), 60)
  return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


@dataclasses.dataclass
class RunProgress:
  """Turns one run's maxtext log lines into a few progress lines: mean loss per stretch of steps, eval losses."""

  name: str
  total_steps: int
  emit: Callable[[str], None]
  clock: Callable[[], float] = time.monotonic
  every: int = dataclasses.field(init=False)  # steps between progress lines, about total_steps / PROGRESS_LINES
  last_step: int = dataclasses.field(init=False, default=-1)
  last_loss: float = dataclasses.field(init=False, default=math.nan)
  last_eval: float = dataclasses.field(init=False, default=math.nan)
  _losses: list[float] = dataclasses.field(init=False, default_factory=list)  # since the last progress line
  _times: list[float] = dataclasses.field(init=False, default_factory=list)
  _last_emit: float = dataclasses.field(init=False, default=0.0)  # clock() at the last progress line

  def __post_init__(self):
    self.every = max(1, (self.total_steps - 1) // PROGRESS_LINES)
    self._last_emit = self.clock()

  def feed(self, line: str) -> None:
    """Reads one log line; prints a progress line every `every` steps (or PROGRESS_SECONDS), at the last step and
    for each eval.

    Steps are maxtext's (0 .. total_steps - 1), the numbering of the eval lines and of the report.
    """
    if match := _TRAIN_LINE.search(line):
      step, seconds, loss = int(match[1]), float(match[2]), float(match[3])
      self.last_step, self.last_loss = step, loss
      self._losses.append(loss)
      if step > 0:  # step 0 includes compilation
        self._times.append(seconds)
      late = self.clock() - self._last_emit >= PROGRESS_SECONDS
      if (step > 0 and (step % self.every == 0 or late)) or step == self.total_steps - 1:
        self._last_emit = self.clock()
        speed = f", {sum(self._times) / len(self._times):.2f} s/step" if self._times else ""
        self.emit(
            f"  {self.name:<16} step {step:>4} ({100 * (step + 1) // self.total_steps:>3}%)  train loss {loss:6.3f}, "
            f"mean of the last {len(self._losses)}: {sum(self._losses) / len(self._losses):6.3f}{speed}"
        )
        self._losses, self._times = [], []
    elif match := _EVAL_LINE.search(line):
      self.last_eval = float(match[2])
      self.emit(f"  {self.name:<16} eval after step {match[1]}: loss {self.last_eval:.3f}")


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run: a precision, and the seed of a study (None: the config's seeds, the run named as the
  precision). A seeded run is named NAME@SEED, the form `python -m MaxText.compare` groups by precision and pairs
  by seed; its data order and initial weights both come from that seed."""

  precision: Precision
  seed: int | None = None

  @property
  def name(self) -> str:
    return self.precision.name if self.seed is None else f"{self.precision.name}@{self.seed}"

  def seed_overrides(self) -> tuple[str, ...]:
    return () if self.seed is None else (f"data_shuffle_seed={self.seed}", f"init_weights_seed={self.seed}")
