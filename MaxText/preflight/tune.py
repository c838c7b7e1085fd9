# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""`--tune`: each program's fastest layout that fits, found by compiling a few and estimating the rest.

For the run and for each program it is compared with (`--predict-against`), separately, since a comparison where
only one side is tuned is not a fair one:
  1. compile the program at the run's own layout (the reference) and predict it (MaxText.preflight.predict);
  2. estimate every candidate layout (MaxText.preflight.layouts) from that reference (MaxText.preflight.estimate):
     step seconds per token and peak bytes, no compile;
  3. compile the candidates in order of estimated seconds per token, skipping those estimated not to fit by more
     than MEMORY_SLACK, until the next one's estimate is more than TOLERANCE slower than the best compiled one that
     fits, or `budget` compiles are spent: branch and bound on the estimate, the compile deciding. The first
     candidate compiled of another partitioning family than the reference's (tensor parallel, pipelined:
     MaxText.preflight.estimate.partitioning) becomes that family's reference: its rows are estimated again from
     it, and the order follows.
The best is the compiled candidate that fits with the fewest predicted seconds per token (the summed step; with a
per-device batch that varies, per token is what compares). A layout maxtext refuses, or one that does not compile,
is a row with the reason. The speedup of the run over a program is best against best, per token.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from MaxText.integration import seam
from MaxText.integration.config import format_config_error, is_config_error
from MaxText.integration.flops import training_flops
from MaxText.integration.shapes import LayoutFacts, layout_facts, mlp_widths
from MaxText.preflight import estimate as estimate_lib
from MaxText.preflight import kernels as kernels_lib
from MaxText.preflight import layouts, library, predict, programs, report
from MaxText.preflight.targets import TARGETS, Target

__all__ = ["BUDGET", "MEMORY_SLACK", "TOLERANCE", "Compiled", "Refused", "Row", "Search", "Tuned", "search", "tune"]

#: A candidate estimated to need up to this much more than jax may use still compiles: the estimate of temporaries
#: is the roughest of its rules.
MEMORY_SLACK = 0.10
#: A candidate is compiled while its estimated seconds per token are within this share of the best compiled one's.
TOLERANCE = 0.10
#: Compiles per program beside its reference, unless --tune-compiles says otherwise.
BUDGET = 6
#: The pipeline stages searched (maxtext's stage axis; each must divide the decoder layers: Llama 3.1 405B's 126
#: take 2, Llama 3 8B's 32 take 2, 4 and 8).
PIPELINE_STAGES = (1, 2, 4, 8)
#: The approximation every tuned prediction carries, printed and in the JSON.
APPROXIMATION = ("each layout compiles as one process over all GPUs, every mesh axis the product of its ici_ and dcn_ "
                 "parts, devices laid out domain after domain as jax's hybrid mesh lays them (the across-domain part "
                 "on the outermost axis); a collective whose GPUs lie in more than one NVLink domain is timed on the "
                 "scale-out network")


class Refused(Exception):
  """maxtext refused a candidate's config (its one-line reason)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Compiled:
  """A candidate as compiled and predicted."""

  prediction: predict.Prediction
  memory: report.Memory
  tokens: float  # per GPU and optimizer step

  @property
  def seconds_per_token(self) -> float:
    return self.prediction.step_seconds / self.tokens

  def as_dict(self) -> dict[str, Any]:
    return {"step_seconds": self.prediction.step_seconds, "step_interval_seconds": list(self.prediction.interval),
            "peak_bytes": self.memory.peak, "fits": self.memory.fits, "tokens_per_gpu": self.tokens,
            "model_tflops_per_gpu": self.prediction.tflops_per_gpu,
            "seconds": {g.value: s for g, s in self.prediction.seconds.items()}}


@dataclasses.dataclass(kw_only=True)
class Row:
  """One candidate of one program: its estimate, and its compile when it was compiled or refused."""

  program: str
  layout: layouts.Layout
  estimate: estimate_lib.Estimate
  compiled: Compiled | None = None
  reason: str = ""  # why it was refused or did not compile
  reference: bool = False
  estimated_from: str = ""  # the compiled layout its estimate moved, when not the run's own (search's)

  @property
  def status(self) -> str:
    if self.reason:
      return "refused"
    if self.compiled is None:
      return "estimated"
    return "fits" if self.compiled.memory.fits else "does not fit"

  def as_dict(self) -> dict[str, Any]:
    est = self.estimate
    return {"program": self.program, "layout": self.layout.label(), "overrides": self.layout.compiled(),
            "reference": self.reference, "status": self.status, "estimated_from": self.estimated_from or None,
            "reason": self.reason,
            "estimate": {"step_seconds": est.step_seconds, "unhidden_seconds": est.unhidden_seconds,
                         "peak_bytes": est.peak_bytes, "tokens_per_gpu": est.tokens,
                         "model_tflops_per_gpu": est.tflops_per_gpu},
            "compiled": self.compiled.as_dict() if self.compiled else None}


@dataclasses.dataclass(kw_only=True)
class Search:
  """One program's search: every row, in the order estimated, and the best compiled row that fits."""

  program: str
  rows: list[Row]

  @property
  def best(self) -> Row | None:
    fitting = [r for r in self.rows if r.compiled is not None and r.compiled.memory.fits]
    return min(fitting, key=lambda r: r.compiled.seconds_per_token) if fitting else None  # type: ignore[union-attr]

  @property
  def compiles(self) -> int:
    """Rows compiled (a refusal costs a config load, seconds, and is not counted)."""
    return sum(1 for r in self.rows if r.compiled is not None)


def search(reference: Row, others: Sequence[Row], compile_row: Callable[[Row], None], device_bytes: int,
           budget: int, exhaustive: bool = False,
           estimator_from: Callable[[Row], Callable[[layouts.Layout], estimate_lib.Estimate]] | None = None) -> Search:
  """Branch and bound over `others` (estimated, not compiled) given the compiled `reference` (module docstring):
  `compile_row` fills a row's `compiled` or `reason`; `budget` compiles at most beside the reference. `exhaustive`:
  compile every row, no pruning (what the pruning is tested against). `estimator_from(row)`: the estimate made from
  a compiled row; the first row of a partitioning family (estimate_lib.partitioning) the reference is not of that
  compiles becomes its family's reference, and the family's rows not yet compiled are estimated again from it."""
  if exhaustive:
    for row in others:
      compile_row(row)
    return Search(program=reference.program, rows=[reference, *sorted(others, key=_per_token)])
  found = Search(program=reference.program, rows=[reference])
  families = {estimate_lib.partitioning(reference.layout)}
  pending = sorted(others, key=_per_token)
  while pending:
    row = pending.pop(0)
    found.rows.append(row)
    if found.compiles > budget:
      break
    if row.estimate.peak_bytes > device_bytes * (1 + MEMORY_SLACK):
      continue
    best = found.best
    if best is not None and row.estimate.seconds_per_token * (1 - TOLERANCE) > best.compiled.seconds_per_token:
      break  # in order: every row left is estimated slower still
    compile_row(row)
    family = estimate_lib.partitioning(row.layout)
    if estimator_from is not None and row.compiled is not None and family not in families:
      families.add(family)
      moved = estimator_from(row)
      for other in pending:
        if estimate_lib.partitioning(other.layout) == family:
          other.estimate, other.estimated_from = moved(other.layout), row.layout.label()
      pending.sort(key=_per_token)
  found.rows.extend(pending)
  return found


def _per_token(row: Row) -> float:
  return row.estimate.seconds_per_token


def _facts(facts: LayoutFacts) -> estimate_lib.ModelFacts:
  """The model's sizes of the config's facts: every field ModelFacts has, by name."""
  return estimate_lib.ModelFacts(**{f.name: getattr(facts, f.name) for f in dataclasses.fields(estimate_lib.ModelFacts)})


def _layout_of(facts: LayoutFacts) -> layouts.Layout:
  """The run's own layout as a candidate (every axis's size in `ici`); an axis --tune does not search is refused."""
  others = {axis: size for axis, size in facts.mesh.items()
            if axis not in (*layouts.AXES, "stage") and size > 1}
  if others:
    raise Refused(f"--tune searches {', '.join(layouts.AXES)} and pipeline (stage) parallelism; the run also sets "
                  f"{', '.join(f'{a}={s}' for a, s in others.items())}")
  ici = tuple(facts.mesh.get(axis, 1) for axis in layouts.AXES)
  stages = facts.mesh.get("stage", 1)
  return layouts.Layout(ici=ici, dcn=(1, 1, 1, 1), per_device_batch=facts.per_device_batch,  # type: ignore[arg-type]
                        accumulation=facts.accumulation, remat=facts.remat, stages=stages,
                        microbatches=max(facts.microbatches, stages) if stages > 1 else 0)


def _raise_refused(exc: Exception) -> None:
  """A config error as a Refused row's reason (maxtext's message in one line); anything else as it is."""
  if is_config_error(exc):
    raise Refused(format_config_error(exc)) from exc
  raise exc


def _one_line(e: BaseException) -> str:
  """An exception as the reason of a row that did not compile."""
  return f"{type(e).__name__}: {' '.join(str(e).split())[:240]}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Program:
  """A program searched: its name, its overrides over the run's config, and the block it compiles in."""

  name: str
  overrides: tuple[str, ...]
  comparison: programs.Comparison | None = None

  def context(self) -> contextlib.AbstractContextManager[None]:
    return self.comparison.context() if self.comparison else contextlib.nullcontext()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tuned:
  """Every program's search, the report's lines and its JSON."""

  results: dict[str, Search]
  lines: list[str]
  payload: dict[str, Any]


def tune(config_path: str, overrides: Sequence[str], target_name: str, devices: int, *, fraction: float,
         against: Sequence[str], global_batch: int | None = None, budget: int = BUDGET, space: layouts.Space | None = None,
         exhaustive: bool = False, log: Callable[[str], None] = print) -> Tuned:
  """Searches the run's layouts and each comparison's (names of programs.COMPARISONS).

  Args:
    budget: compiles per program beside its reference.
    space: the candidates (default: layouts.Space for the devices, the target's domains and `global_batch`).
    exhaustive: compile every candidate (search's).

  Call it inside `environment.answering(library.target_environment(target, devices))`, as the pre-flight.
  """
  from MaxText.preflight.compile import compile_train_step  # pylint: disable=import-outside-toplevel  # TE, maxtext

  start = time.perf_counter()
  target = TARGETS[target_name]
  seam.register()
  base = layout_facts(library.load_config(config_path, overrides, devices))  # a config error: one line, exit 2
  facts = _facts(base)
  try:
    own = _layout_of(base)
  except Refused as e:
    library.fail(str(e))
  space = space or layouts.Space(devices=devices, domain=target.peaks.domain_gpus(devices),
                                 global_batch=global_batch, sequence=facts.sequence,
                                 context=layouts.Space.context if base.context_parallel else (1,),
                                 stages=PIPELINE_STAGES, layers=facts.layers)
  candidates = [c for c in layouts.candidates(space) if c != own]
  searched = [Program(name="run", overrides=tuple(overrides))] + [
      Program(name=name, overrides=tuple(programs.overrides_for(overrides, programs.COMPARISONS[name])),
              comparison=programs.COMPARISONS[name]) for name in against]

  def compile_layout(program: Program, layout: layouts.Layout) -> tuple[Compiled, list[kernels_lib.Kernel]]:
    theirs = programs.replaced(program.overrides, layout.compiled())
    with program.context():
      with seam.config_errors_raised():
        try:
          config = library.load_config(config_path, theirs, devices)
        except Exception as e:  # pylint: disable=broad-exception-caught  # a config error is a refusal; others raise
          _raise_refused(e)
      compiled = compile_train_step(config, target_name, devices,
                                    log=lambda line: log(f"{line}: {program.name}, {layout.label()}"))
    found = kernels_lib.kernels(compiled.as_text())
    memory = report.Memory.of(compiled, target, fraction)
    del compiled
    prediction = predict.predict(found, target, mlp_widths(config),
                                 training_flops(config)["tflops_per_device_step"] * 1e12)
    tokens = layout.per_device_batch * facts.sequence * layout.accumulation
    return Compiled(prediction=prediction, memory=memory, tokens=tokens), found

  results: dict[str, Search] = {}
  for program in searched:
    try:
      compiled, found = compile_layout(program, own)
    except Refused as e:
      library.fail(f"{program.name} at the run's own layout: {e}")
    except Exception as e:  # pylint: disable=broad-exception-caught  # the reference must compile: one line
      library.fail(f"{program.name} does not compile at the run's own layout on {devices} x {target_name}: "
                   f"{_one_line(e)}")
    ref = estimate_lib.Reference.of(own, found, compiled.prediction, compiled.memory, target.peaks)
    try:
      reference = Row(program=program.name, layout=own, compiled=compiled, reference=True,
                      estimate=estimate_lib.estimate(own, ref, facts, target.peaks, devices))
      rows = [Row(program=program.name, layout=c, estimate=estimate_lib.estimate(c, ref, facts, target.peaks, devices))
              for c in candidates]
    except estimate_lib.UnknownRemat as e:
      library.fail(str(e))

    kept: dict[layouts.Layout, estimate_lib.Reference] = {}

    def compile_row(row: Row, program: Program = program, kept: dict = kept) -> None:
      try:
        row.compiled, found = compile_layout(program, row.layout)
        kept[row.layout] = estimate_lib.Reference.of(row.layout, found, row.compiled.prediction, row.compiled.memory,
                                                     target.peaks)
      except Refused as e:
        row.reason = f"maxtext refuses it: {e}"
      except Exception as e:  # pylint: disable=broad-exception-caught  # one row, not a crash
        row.reason = f"does not compile: {_one_line(e)}"

    def estimator_from(row: Row, kept: dict = kept) -> Callable[[layouts.Layout], estimate_lib.Estimate]:
      return lambda layout: estimate_lib.estimate(layout, kept[row.layout], facts, target.peaks, devices)

    results[program.name] = search(reference, rows, compile_row, int(target.memory_bytes * fraction), budget,
                                   exhaustive, estimator_from)
  seconds = time.perf_counter() - start
  lines = _lines(results, target, devices, seconds, space, int(target.memory_bytes * fraction))
  return Tuned(results=results, lines=lines,
               payload=_payload(results, seconds, space, target.gpus_per_node))


def _speedups(results: dict[str, Search]) -> dict[str, float | None]:
  run = results["run"].best
  out: dict[str, float | None] = {}
  for name, found in results.items():
    if name == "run":
      continue
    best = found.best
    out[name] = (best.compiled.seconds_per_token / run.compiled.seconds_per_token  # type: ignore[union-attr]
                 if run is not None and best is not None else None)
  return out


def _payload(results: dict[str, Search], seconds: float, space: layouts.Space, per_node: int) -> dict[str, Any]:
  best = {}
  for name, found in results.items():
    row = found.best
    best[name] = None if row is None else {
        "overrides": row.layout.compiled(), "overrides_one_slice_per_node": row.layout.overrides(per_node),
        "layout": row.layout.label(),
        "step_seconds": row.compiled.prediction.step_seconds,  # type: ignore[union-attr]
        "step_interval_seconds": list(row.compiled.prediction.interval),  # type: ignore[union-attr]
        "peak_bytes": row.compiled.memory.peak,  # type: ignore[union-attr]
        "tokens_per_gpu": row.compiled.tokens,  # type: ignore[union-attr]
        "model_tflops_per_gpu": row.compiled.prediction.tflops_per_gpu}  # type: ignore[union-attr]
  return {"tune": {"candidates": [row.as_dict() for found in results.values() for row in found.rows],
                   "best": best, "speedup": _speedups(results), "seconds": seconds,
                   "compiles": {name: found.compiles for name, found in results.items()},
                   "global_batch": space.global_batch, "approximation": APPROXIMATION,
                   "estimate": "MaxText/preflight/estimate.py", "memory_slack": MEMORY_SLACK, "tolerance": TOLERANCE}}


def _lines(results: dict[str, Search], target: Target, devices: int, seconds: float, space: layouts.Space,
           device_bytes: int) -> list[str]:
  """The table: per program, every compiled or refused row and the next three estimated to fit that the search did
  not compile (the bound stopped it), the best marked."""
  batch = (f"global batch fixed at {space.global_batch} sequences (gradient accumulation varies)"
           if space.global_batch else "per-device batch free (compared per token)")
  lines = [f"tuned layouts on {devices} x {target.name} ({batch}; NVLink domains of "
           f"{target.peaks.domain_gpus(devices)} GPUs; {seconds / 60:.1f} min):"]
  for name, found in results.items():
    best = found.best
    lines.append(f"  {name}: {len(found.rows)} candidates, {found.compiles} compiled")
    lines.append(f"    {'':2}{'layout':58} {'status':13} {'peak GiB':>9} {'step ms':>9} {'no overlap':>10} "
                 f"{'ms/ktok':>8} {'TFLOP/s':>8}")
    shown = [r for r in found.rows if r.compiled is not None or r.reason]
    shown += [r for r in found.rows[1:] if r.compiled is None and not r.reason
              and r.estimate.peak_bytes <= device_bytes * (1 + MEMORY_SLACK)][:3]
    for row in shown:
      mark = "* " if row is best else "  "
      if row.compiled is not None:
        p, peak = row.compiled.prediction, row.compiled.memory.peak
        numbers = (f"{peak / report.GIB:9.1f} {p.step_seconds * 1e3:9.1f} {p.interval[1] * 1e3:10.1f} "
                   f"{row.compiled.seconds_per_token * 1e6:8.3f} {p.tflops_per_gpu:8,.0f}")
      else:
        e = row.estimate
        numbers = (f"{e.peak_bytes / report.GIB:9.1f} {e.step_seconds * 1e3:9.1f} {e.unhidden_seconds * 1e3:10.1f} "
                   f"{e.seconds_per_token * 1e6:8.3f} {e.tflops_per_gpu:8,.0f}")
      status = row.status + (" (run's)" if row.reference else "")
      lines.append(f"    {mark}{row.layout.label():58} {status:13} {numbers if not row.reason else ''}")
      if row.reason:
        lines.append(f"        {row.reason}")
    if best is None:
      lines.append("    no compiled layout fits")
    else:
      lines.append(f"    best, on one jax slice (as compiled here): {' '.join(best.layout.compiled())}")
      per_node = best.layout.overrides(target.gpus_per_node)
      if per_node != best.layout.compiled():
        lines.append(f"    the same with one jax slice per node of {target.gpus_per_node} (jax's default on GPUs): "
                     f"{' '.join(per_node)}")
  for name, ratio in _speedups(results).items():
    lines.append(f"  run over {name}, best against best, per token: " + (f"{ratio:.2f}x" if ratio else "n/a"))
  lines.append("  rows marked 'estimated' did not compile: their figures are MaxText/preflight/estimate.py's; the "
               "others are the compiled step's prediction. " + APPROXIMATION)
  return lines
