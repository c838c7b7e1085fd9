# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Reads one training run's per-step metrics from maxtext's `metrics_file` JSONL, or from its TensorBoard events.

Why two sources: `metrics_file` is the exact record (one JSON object per logged step, keys below), but maxtext
truncates it whenever it writes a record whose step is 0, and its running-eval records start at step 0, so a run
with `eval_interval > 0` loses the training lines written before the first eval. The TensorBoard events in
`<run_dir>/tensorboard/` carry the same scalars. When both exist, the source with more training steps wins
(the JSONL on a tie), and the choice is recorded in the report.

Training records are the ones with `learning/loss`; eval records (`eval/...`) are kept separately. The running eval
records (one per eval batch: the running mean loss and token count so far) give each batch's own mean loss, from which
the comparison builds paired intervals (MaxText.compare.analysis.paired_eval_gap). Only the JSONL has them (maxtext
does not write running evals to TensorBoard), and only for the last eval pass (the truncation above).
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from pathlib import Path

import numpy as np

from MaxText.compare.runinfo import RunInfo, read_info
from MaxText.compare.schema import MetricsSource
from MaxText.integration import artifacts

LOSS_KEY = "learning/loss"
STEP_TIME_KEY = "perf/step_time_seconds"
TFLOPS_KEY = "perf/per_device_tflops_per_sec"
TOKENS_KEY = "perf/per_device_tokens_per_sec"
LR_KEY = "learning/current_learning_rate"
#: The final eval record of an eval pass has `eval/total_loss`; the running ones (per eval step) do not.
EVAL_LOSS_KEY = "eval/avg_loss"
EVAL_FINAL_MARKER = "eval/total_loss"
EVAL_WEIGHTS_KEY = "eval/total_weights"
TRAIN_KEYS = (LOSS_KEY, STEP_TIME_KEY, TFLOPS_KEY, TOKENS_KEY, LR_KEY)
#: File names a metrics_file gets in this project's scripts, tried first when a run dir holds several *.jsonl.
PREFERRED_JSONL_NAMES = ("metrics.jsonl", "metrics.txt")
TB_GLOB = "events.out.tfevents.*"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunMetrics:
  """One run's training scalars on its own step grid (sorted, unique); a missing value is NaN.

  Invariant: every array has the length of `steps`.
  """

  name: str
  source: MetricsSource
  path: str
  steps: np.ndarray  # int64
  loss: np.ndarray  # float64, nats
  step_time: np.ndarray  # seconds
  tflops: np.ndarray  # TFLOP/s/device, maxtext's model-FLOP count
  tokens_per_sec: np.ndarray  # tokens/s/device
  learning_rate: np.ndarray
  eval_steps: np.ndarray  # int64, train steps after which a complete eval pass was logged
  eval_loss: np.ndarray
  skipped_lines: int = 0  # unparsable JSONL lines (e.g. a line cut by a killed run)
  #: Per eval batch (mean loss in nats, tokens) of the eval passes whose running records the JSONL holds, by the
  #: train step the pass followed: {step: ((loss, tokens), ...)}.
  eval_batches: dict[int, tuple[tuple[float, float], ...]] = dataclasses.field(default_factory=dict)
  #: nvfp4/ quantization statistics (nvfp4_stats_interval) by statistics step: {step: {metric name: value}}.
  quant_stats: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
  info: RunInfo = RunInfo()  # backend, config and machine load, from the files next to the metrics

  def __post_init__(self):
    n = len(self.steps)
    for field in ("loss", "step_time", "tflops", "tokens_per_sec", "learning_rate"):
      if len(getattr(self, field)) != n:
        raise ValueError(f"run {self.name!r}: {field} has {len(getattr(self, field))} values for {n} steps")
    if len(self.eval_steps) != len(self.eval_loss):
      raise ValueError(f"run {self.name!r}: {len(self.eval_steps)} eval steps but {len(self.eval_loss)} eval losses")


def _as_float(value) -> float:
  try:
    return float(value)
  except (TypeError, ValueError):
    return math.nan


def batches_from_running(running: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
  """Each eval batch's (mean loss, tokens) from maxtext's running records (running mean loss, running token count):
  the batch's loss sum is the difference of running sums (mean x tokens). maxtext divides by tokens + 1e-8, which
  moves a batch's loss by less than 1e-8 / tokens relative."""
  batches, prev_sum, prev_tokens = [], 0.0, 0.0
  for mean, tokens in running:
    loss_sum = mean * tokens
    added = tokens - prev_tokens
    batches.append(((loss_sum - prev_sum) / added if added > 0 else math.nan, added))
    prev_sum, prev_tokens = loss_sum, tokens
  return tuple(batches)


def _from_records(
    name, source, path, train: dict[int, dict], evals: dict[int, float], skipped=0, info=RunInfo(),
    eval_batches: dict[int, tuple[tuple[float, float], ...]] | None = None,
) -> RunMetrics:
  """Builds the arrays; when a step was logged twice (a resumed run appends), the last record wins."""
  steps = np.array(sorted(train), dtype=np.int64)
  cols = {k: np.array([_as_float(train[s].get(k)) for s in steps], dtype=np.float64) for k in TRAIN_KEYS}
  eval_steps = np.array(sorted(evals), dtype=np.int64)
  return RunMetrics(
      name=name,
      source=source,
      path=str(path),
      steps=steps,
      loss=cols[LOSS_KEY],
      step_time=cols[STEP_TIME_KEY],
      tflops=cols[TFLOPS_KEY],
      tokens_per_sec=cols[TOKENS_KEY],
      learning_rate=cols[LR_KEY],
      eval_steps=eval_steps,
      eval_loss=np.array([evals[s] for s in eval_steps], dtype=np.float64),
      skipped_lines=skipped,
      info=info,
      eval_batches=dict(eval_batches or {}),
      quant_stats={int(s): stats for s in steps if (stats := {k: _as_float(v) for k, v in train[s].items()
                                                          if artifacts.parse_stat_name(k) is not None})},
  )


def read_jsonl(path: str | Path, name: str | None = None) -> RunMetrics:
  """Parses a maxtext metrics_file. NaN/Infinity literals (a diverged run) are read as floats, not rejected.

  Args:
    path: the JSONL file.
    name: the run's name; default: the `run_name` field of its records, else the file stem.
  """
  path = Path(path)
  train: dict[int, dict] = {}
  evals: dict[int, float] = {}
  batches: dict[int, tuple[tuple[float, float], ...]] = {}
  running: list[tuple[float, float]] = []  # the current eval pass's running records, in order
  skipped = 0
  run_name = None
  with path.open(encoding="utf-8") as f:
    for line in f:
      if not line.strip():
        continue
      try:
        record = json.loads(line)
        step = int(float(record["step"]))
      except (ValueError, KeyError, TypeError):
        skipped += 1
        continue
      run_name = record.get("run_name", run_name)
      if LOSS_KEY in record:
        train[step] = record
      elif EVAL_FINAL_MARKER in record and EVAL_LOSS_KEY in record:
        evals[step] = _as_float(record[EVAL_LOSS_KEY])
        if running:
          batches[step] = batches_from_running(running)
        running = []
      elif EVAL_LOSS_KEY in record and EVAL_WEIGHTS_KEY in record:  # a running record: step = the eval batch index
        running = running if step == len(running) else []  # a pass starts at batch 0
        if step == len(running):
          running.append((_as_float(record[EVAL_LOSS_KEY]), _as_float(record[EVAL_WEIGHTS_KEY])))
  info = read_info(path.parent)
  return _from_records(name or run_name or path.stem, MetricsSource.JSONL, path, train, evals, skipped, info,
                       batches)


def _iter_tfrecords(path: Path):
  """Yields the payloads of a TFRecord file (u64 length, u32 crc, data, u32 crc); stops at a torn tail."""
  with path.open("rb") as f:
    while True:
      header = f.read(12)
      if len(header) < 12:
        return
      (length,) = struct.unpack("<Q", header[:8])
      data = f.read(length)
      if len(data) < length or len(f.read(4)) < 4:
        return
      yield data


def _summary_value(value) -> float:
  if value.HasField("simple_value"):
    return float(value.simple_value)
  tensor = value.tensor
  if tensor.float_val:
    return float(tensor.float_val[0])
  if tensor.double_val:
    return float(tensor.double_val[0])
  if tensor.tensor_content:
    dtype = {1: np.float32, 2: np.float64}.get(tensor.dtype)
    if dtype is not None:
      return float(np.frombuffer(tensor.tensor_content, dtype=dtype)[0])
  return math.nan


def read_tensorboard(event_files: list[Path], name: str, run_dir: Path | None = None) -> RunMetrics:
  """Reads scalars, and maxtext's config from the text summaries, with tensorboardX's protobuf (no TensorFlow).

  `run_dir` is where the precision plan and machine.json are looked for (default: none).

  Raises:
    ValueError: tensorboardX is not installed.
  """
  try:
    # pylint: disable-next=import-outside-toplevel  # import cost: protobuf, only where events are read
    from tensorboardX.proto import event_pb2
  except ImportError as e:
    raise ValueError("reading TensorBoard events needs tensorboardX (in requirements.txt); pass the run's JSONL") from e
  by_step: dict[int, dict] = {}
  texts: dict[str, str] = {}
  for path in sorted(event_files):
    for payload in _iter_tfrecords(path):
      event = event_pb2.Event()
      event.ParseFromString(payload)
      if not event.HasField("summary"):
        continue
      for value in event.summary.value:
        if value.metadata.plugin_data.plugin_name == "text":
          texts[value.tag] = b"".join(value.tensor.string_val[:1]).decode("utf-8", "replace")
          continue
        by_step.setdefault(int(event.step), {})[value.tag] = _summary_value(value)
  train = {s: r for s, r in by_step.items() if LOSS_KEY in r}
  evals = {s: r[EVAL_LOSS_KEY] for s, r in by_step.items() if EVAL_LOSS_KEY in r}
  info = read_info(run_dir, texts)
  return _from_records(name, MetricsSource.TENSORBOARD, event_files[0].parent, train, evals, info=info)


def _find_jsonl(run_dir: Path) -> Path | None:
  candidates = sorted(p for p in run_dir.rglob("*.jsonl") if p.is_file())
  candidates += [p for n in PREFERRED_JSONL_NAMES if (p := run_dir / n).is_file() and p not in candidates]
  if not candidates:
    return None
  for preferred in PREFERRED_JSONL_NAMES:
    for p in candidates:
      if p.name == preferred:
        return p
  if len(candidates) > 1:
    listed = ", ".join(str(p) for p in candidates)
    raise ValueError(f"run dir {str(run_dir)!r} holds several JSONL files ({listed}); pass the metrics file itself")
  return candidates[0]


def load_run(path: str | Path, name: str | None = None) -> RunMetrics:
  """Loads a run from a metrics .jsonl file or from a run dir (`<base_output_directory>/<run_name>`).

  In a run dir: the metrics JSONL (metrics.jsonl preferred, else the only *.jsonl below it) and the TensorBoard
  event files below it; the one with more training steps is used.

  Args:
    path: a .jsonl file or a run directory.
    name: the run's name in the report; default: the run dir's basename (for a file: its `run_name` field).

  Raises:
    ValueError: nothing readable, or no training records (the message lists what was looked for).
  """
  path = Path(path)
  if path.is_file():
    run = read_jsonl(path, name)
  elif path.is_dir():
    name = name or path.resolve().name
    jsonl = _find_jsonl(path)
    events = sorted(p for p in path.rglob(TB_GLOB) if p.is_file())
    options = []
    from_tb = read_tensorboard(events, name, path) if events else None
    if jsonl is not None:
      # The JSONL holds no config; the plan and machine.json are read from the run dir, the config from TensorBoard.
      from_jsonl = read_jsonl(jsonl, name)
      info = from_tb.info if from_tb is not None else read_info(path)
      options.append(dataclasses.replace(from_jsonl, info=info))
    if from_tb is not None:
      options.append(from_tb)
    if not options:
      raise ValueError(
          f"run dir {str(path)!r} has no metrics: expected a *.jsonl (maxtext metrics_file=...) or "
          f"TensorBoard {TB_GLOB} files below it"
      )
    run = max(options, key=lambda r: len(r.steps))  # max() keeps the first (the JSONL) on a tie
    if jsonl is not None and not run.eval_batches:  # the per-batch eval losses exist only in the JSONL
      run = dataclasses.replace(run, eval_batches=options[0].eval_batches)
  else:
    raise ValueError(f"{str(path)!r} does not exist; pass a run dir (<base_output_directory>/<run_name>) or a .jsonl")
  if len(run.steps) == 0:
    raise ValueError(f"{run.path!r} holds no training records (no {LOSS_KEY!r} key)")
  return run
