# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""`make quickstart`: one tiny Llama trained in four precisions on the local corpus, then compared with bf16.

What runs: the stdlib corpus is built (unless an intact one is there); `python -m MaxText.train
configs/quickstart.yml` trains the bf16 baseline, fp8, te_nvfp4 and te_nvfp4_no_rht one after the other with the
same seeds, each in its own process; `python -m MaxText.compare` writes report.md/report.json/loss.png/
throughput.png into the output dir. Why the baseline is `te_nvfp4` with `nvfp4_mlp_precision=bf16` and not
`quantization=''`: any maxtext quant object changes how parameters are initialized, so only a baseline that also has
one starts from the same weights as the quantized runs (the report's step-0 column checks it).

Why the comparison reads TensorBoard events: the runs evaluate, and maxtext rewrites `metrics_file` whenever it
logs a record with step 0, which every eval pass does; the compare module then falls back to the TensorBoard
events, which hold every training step (it records the source it used in report.json).

Layout of the output dir: runs/<name>/ (train.log, metrics.jsonl, tensorboard/, precision_plan.json, machine.json),
jax_cache/, and the report files. A rerun first deletes the previous report files and every run folder it is not
about to retrain, so nothing stale mixes into the new report; `--smoke` writes to `<out>-smoke` so it never replaces
a full run's report. machine.json records the machine load around each run (MaxText/compare/runinfo.py), which the
report uses to say whether step times were measured on a busy machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from MaxText.compare import report as compare_report
from MaxText.compare import runinfo
from MaxText.data import corpus
from MaxText.integration.cli import not_overridden
from MaxText.study import ALL_PRECISIONS, BASELINE, PRECISION_NAMES, STUDY_NAMES, Precision, Run, RunProgress, format_seconds

#: The configs shipped with the package (MaxText/configs: in a checkout a link to configs/, in a wheel the files), so
#: `python -m MaxText.quickstart` finds them from any directory, in an installed copy too.
PACKAGE_CONFIGS = Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = PACKAGE_CONFIGS / "quickstart.yml"
#: `--device gpu`: the same study, larger (configs/study_gpu.yml chains to the quickstart's YAML).
GPU_CONFIG = PACKAGE_CONFIGS / "study_gpu.yml"
DEFAULT_OUT = Path("results/quickstart")
STUDY_OUT = Path("results/study")
#: `--study` without --seeds: three seeds per precision, the fewest that give a spread and a t-interval.
STUDY_SEEDS = (0, 1, 2)
DEFAULT_CORPUS = Path("results/corpus")
#: Lines of a failed run's log repeated on the terminal.
FAILURE_TAIL_LINES = 25


#: Per `--device`: the maxtext keys that say where the runs train (configs/tiny.yml says hardware: cpu).
DEVICE_OVERRIDES: dict[str, tuple[str, ...]] = {"cpu": (), "gpu": ("hardware=gpu",)}

#: `--smoke`: the whole machinery in about a minute (two precisions, a few short steps, evals included so the
#: TensorBoard fallback is exercised). Not a measurement.
SMOKE_STEPS = 4
SMOKE_PRECISIONS = (BASELINE, "te_nvfp4")
SMOKE_OVERRIDES = ("max_target_length=64", "per_device_batch_size=2", "eval_interval=2", "eval_steps=1")
#: `--smoke` writes to `<out>` + this suffix (results/quickstart -> results/quickstart-smoke).
SMOKE_SUFFIX = "-smoke"



class QuickstartError(Exception):
  """A step of the quickstart failed; the message is one line that says which and where to look."""


def corpus_is_built(corpus_dir: Path) -> bool:
  """True when `corpus_dir` holds a corpus of this format version whose files match their manifest hashes.

  Why hashes and not just existence: a build killed halfway, or a file edited by hand, must be rebuilt rather than
  silently train every precision on something else than the documented corpus.
  """
  try:
    manifest = json.loads((corpus_dir / corpus.MANIFEST_NAME).read_text(encoding="utf-8"))
    if manifest.get("format_version") != corpus.CORPUS_FORMAT_VERSION:
      return False
    return all(
        hashlib.sha256((corpus_dir / info["file"]).read_bytes()).hexdigest() == info["sha256"]
        for info in [*manifest["splits"].values(), manifest["tokenizer"]]
    )
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return False


def _run_dir_overrides(name: str, runs_dir: Path, jax_cache: Path) -> list[str]:
  return [
      f"run_name={name}",
      f"base_output_directory={runs_dir}",
      f"metrics_file={runs_dir / name / 'metrics.jsonl'}",
      f"jax_cache_dir={jax_cache}",
  ]


def train(
    run: Run,
    *,
    config: Path,
    runs_dir: Path,
    jax_cache: Path,
    steps: int,
    extra: Sequence[str],
    corpus_dir: Path,
    emit: Callable[[str], None],
    device: str = "cpu",
) -> RunProgress:
  """Runs `python -m MaxText.train` for one precision, streaming its log into runs/<name>/train.log.

  The run dir is emptied first: maxtext appends to metrics_file and adds TensorBoard event files, so a previous
  run's records would mix into this one's.

  Raises:
    QuickstartError: the run exited non-zero (its log tail has been printed).
  """
  run_dir = runs_dir / run.name
  shutil.rmtree(run_dir, ignore_errors=True)
  run_dir.mkdir(parents=True)  # maxtext does not create metrics_file's folder
  cmd = [
      sys.executable, "-m", "MaxText.train", str(config),
      *_run_dir_overrides(run.name, runs_dir, jax_cache),
      f"steps={steps}",
      *corpus.corpus_overrides(corpus_dir),
      *not_overridden((*run.precision.overrides_for(steps), *run.seed_overrides(), *DEVICE_OVERRIDES[device]), extra),
      *extra,
  ]  # fmt: skip
  env = dict(os.environ)
  env.setdefault("JAX_PLATFORMS", device if device == "cpu" else "cuda")  # never a silent fall back to the CPU
  progress = RunProgress(name=run.name, total_steps=steps, emit=emit)
  log_path = run_dir / "train.log"
  before, start = runinfo.machine_sample(), time.monotonic()
  with log_path.open("w", encoding="utf-8") as log:
    log.write(" ".join(cmd) + "\n")
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
      assert proc.stdout is not None  # for the type checker: stdout=PIPE
      tail: list[str] = []
      for line in proc.stdout:
        log.write(line)
        tail = (tail + [line.rstrip()])[-FAILURE_TAIL_LINES:]
        progress.feed(line)
  machine = runinfo.machine_record(before, runinfo.machine_sample(), time.monotonic() - start)
  (run_dir / runinfo.MACHINE_FILE).write_text(json.dumps(machine, indent=2) + "\n", encoding="utf-8")
  if proc.returncode != 0:
    for line in tail:
      emit(f"    | {line}")
    raise QuickstartError(f"the {run.name} run failed (exit {proc.returncode}); full log: {log_path}")
  return progress


def compare(
    names: Sequence[str], runs_dir: Path, out_dir: Path, emit: Callable[[str], None], baseline: str = BASELINE
) -> None:
  """Runs `python -m MaxText.compare` on the run dirs against the baseline, echoing its table.

  Raises:
    QuickstartError: the comparison exited non-zero.
  """
  cmd = [sys.executable, "-m", "MaxText.compare", *(str(runs_dir / n) for n in names), "--baseline", baseline,
         "--out", str(out_dir)]  # fmt: skip
  emit("quickstart: python " + " ".join(_shown(arg) for arg in cmd[1:]))
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  emit(proc.stdout.rstrip())
  if proc.returncode != 0:
    raise QuickstartError(f"the comparison failed (exit {proc.returncode}): {proc.stderr.strip()}")


def _shown(arg: str) -> str:
  """An absolute path under the working dir as a relative one, for the progress lines; anything else as is."""
  if os.path.isabs(arg) and Path(arg).is_relative_to(Path.cwd()):
    return os.path.relpath(arg)
  return arg


def _parse_args(argv: Iterable[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m MaxText.quickstart",
      description="Train the tiny Llama on the local corpus in bf16, fp8, te_nvfp4 and te_nvfp4_no_rht (CPU), "
      "then compare them with the bf16 baseline: report.md, report.json, loss.png, throughput.png.",
  )
  parser.add_argument("--out", type=Path, default=None,
                      help=f"output dir (default: {DEFAULT_OUT}, with --study {STUDY_OUT}; with --smoke "
                      f"OUT{SMOKE_SUFFIX})")  # fmt: skip
  parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help=f"corpus dir, built if needed ({DEFAULT_CORPUS})")
  parser.add_argument("--config", type=Path, default=None,
                      help="model/schedule YAML (default: configs/quickstart.yml; --device gpu: configs/study_gpu.yml)")
  parser.add_argument("--steps", type=int, default=None, help="training steps per run (default: the config's)")
  parser.add_argument(
      "--precisions", nargs="+", choices=tuple(x.name for x in ALL_PRECISIONS), default=None,
      help=f"runs to train; {BASELINE} (the baseline) is always one (default: the first four; --study: the six of "
      "make study; make study-attention names its five)",
  )  # fmt: skip
  parser.add_argument("--study", action="store_true",
                      help=f"`make study`: all six precisions, each over --seeds (default: "
                      f"{' '.join(map(str, STUDY_SEEDS))}), runs named NAME@SEED, one report with the spread across "
                      "seeds")  # fmt: skip
  parser.add_argument("--seeds", nargs="+", type=int, default=None, metavar="SEED",
                      help="train every precision once per seed (data_shuffle_seed = init_weights_seed = SEED)")
  parser.add_argument("--device", choices=tuple(DEVICE_OVERRIDES), default="cpu",
                      help="where the runs train: cpu (JAX_PLATFORMS=cpu) or gpu (JAX_PLATFORMS=cuda, hardware=gpu, "
                      "the larger configs/study_gpu.yml; run from .venv-gpu)")  # fmt: skip
  parser.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                      help=f"maxtext overrides for the candidates only (every run but {BASELINE})")  # fmt: skip
  parser.add_argument("--set-baseline", dest="baseline_overrides", nargs="+", default=[], metavar="KEY=VALUE",
                      help=f"maxtext overrides for the {BASELINE} baseline only")  # fmt: skip
  parser.add_argument("--set-all", dest="all_overrides", nargs="+", default=[], metavar="KEY=VALUE",
                      help="maxtext overrides for every run, baseline included (e.g. learning_rate=1e-3)")  # fmt: skip
  parser.add_argument("--smoke", action="store_true",
                      help=f"check the machinery (1.5-3 min on a busy 2-core machine): {SMOKE_STEPS} steps, "
                      f"{' and '.join(SMOKE_PRECISIONS)}; writes to OUT{SMOKE_SUFFIX} "
                      f"(results/quickstart{SMOKE_SUFFIX}), never over a full run")  # fmt: skip
  return parser.parse_args(None if argv is None else list(argv))


def planned_runs(args: argparse.Namespace) -> list[Run]:
  """The runs to train, seed by seed (a study cut short still has whole seeds), the baseline first in each.

  Raises:
    QuickstartError: a seed given twice, or --seeds with --smoke.
  """
  seeds = args.seeds if args.seeds is not None else (STUDY_SEEDS if args.study else None)
  if seeds is not None and len(set(seeds)) != len(seeds):
    raise QuickstartError(f"--seeds {' '.join(map(str, seeds))} names a seed twice; each seed is one run per precision")
  if seeds is not None and args.smoke:
    raise QuickstartError("--smoke checks the machinery on one seed; drop --seeds/--study")
  default = SMOKE_PRECISIONS if args.smoke else (STUDY_NAMES if args.study else PRECISION_NAMES)
  wanted = set(args.precisions or default) | {BASELINE}
  precisions = [p for p in ALL_PRECISIONS if p.name in wanted]
  if seeds is None:
    return [Run(p) for p in precisions]
  return [Run(p, seed) for seed in seeds for p in precisions]


def config_path(args: argparse.Namespace) -> Path:
  """--config, else the device's default YAML."""
  if args.config is not None:
    return args.config
  return GPU_CONFIG if args.device == "gpu" else DEFAULT_CONFIG


def run_overrides(precision: Precision, args: argparse.Namespace) -> list[str]:
  """The user's overrides for one run: --set-all, then --set (candidates) or --set-baseline (the baseline).

  Why split: an override meant to change the precision under test (say `nvfp4_attention_precision=fp8`) must not
  change the baseline it is measured against; one meant for the experiment as a whole goes in --set-all.
  """
  own = args.baseline_overrides if precision.name == BASELINE else args.overrides
  return [*args.all_overrides, *own]


def output_dir(args: argparse.Namespace) -> Path:
  """--out (default: results/quickstart, or results/study), or with --smoke `<out>-smoke`: a smoke check never
  replaces a full run's report."""
  out = args.out if args.out is not None else (STUDY_OUT if args.study else DEFAULT_OUT)
  return out.with_name(out.name + SMOKE_SUFFIX) if args.smoke else out


def clear_stale(out_dir: Path, keep: Sequence[str]) -> list[str]:
  """Deletes the previous report files and every run folder under out_dir/runs not named in `keep`.

  Returns the names of the run folders deleted. The folders in `keep` are emptied by `train` just before they run.
  """
  for name in (compare_report.REPORT_JSON, compare_report.REPORT_MD, compare_report.LOSS_PNG,
               compare_report.THROUGHPUT_PNG):  # fmt: skip
    (out_dir / name).unlink(missing_ok=True)
  runs_dir = out_dir / "runs"
  stale = sorted(p.name for p in runs_dir.iterdir() if p.is_dir() and p.name not in keep) if runs_dir.is_dir() else []
  for name in stale:
    shutil.rmtree(runs_dir / name)
  return stale


def _config_steps(config: Path) -> int:
  """The `steps:` of the quickstart YAML, read without maxtext (the progress lines need the total up front)."""
  match = re.search(r"^steps:\s*(\d+)", config.read_text(encoding="utf-8"), flags=re.MULTILINE)
  if not match:
    raise QuickstartError(f"{config} sets no 'steps:'; pass --steps N")
  return int(match[1])


def main(argv: Iterable[str] | None = None, emit: Callable[[str], None] | None = None) -> int:
  """CLI: exit 0 when the report was written, 1 when a run or the comparison failed, 2 for bad arguments."""
  args = _parse_args(argv)
  emit = emit or (lambda text: print(text, flush=True))
  start = time.monotonic()
  try:
    config = config_path(args)
    if not config.is_file():
      raise QuickstartError(f"config {config} does not exist")
    if args.steps is not None:
      steps = args.steps
    else:
      steps = SMOKE_STEPS if args.smoke else _config_steps(config)
    if steps < 1:
      raise QuickstartError(f"--steps must be >= 1, got {steps}")
    runs = planned_runs(args)
  except QuickstartError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  try:
    corpus_dir = args.corpus.resolve()
    if corpus_is_built(corpus_dir):
      emit(f"quickstart: corpus {args.corpus} is built and intact")
    else:
      corpus.build_corpus(corpus_dir)
      emit(f"quickstart: built the corpus in {args.corpus} ({format_seconds(time.monotonic() - start)})")
    out_dir = output_dir(args).resolve()
    runs_dir = out_dir / "runs"
    stale = clear_stale(out_dir, [r.name for r in runs])
    if stale:
      emit(f"quickstart: removed run folders of an earlier run that this one does not retrain: {', '.join(stale)}")
    emit(f"quickstart: {len(runs)} runs of {steps} steps ({args.device}), one after the other, into "
         f"{_shown(str(out_dir))}")
    durations: list[float] = []
    for i, run in enumerate(runs, 1):
      run_start = time.monotonic()
      extra = [*(SMOKE_OVERRIDES if args.smoke else ()), *run_overrides(run.precision, args)]
      shown = f" + {' '.join(extra)}" if extra else ""
      emit(f"quickstart: [{i}/{len(runs)}] {run.name}: {run.precision.description}; {steps} steps{shown}")
      progress = train(
          run, config=config.resolve(), runs_dir=runs_dir, jax_cache=out_dir / "jax_cache",
          steps=steps, extra=extra, corpus_dir=corpus_dir, emit=emit, device=args.device,
      )  # fmt: skip
      durations.append(time.monotonic() - run_start)
      left = len(runs) - i
      eta = f"; about {format_seconds(left * sum(durations) / len(durations))} left for {left} more" if left else ""
      emit(
          f"quickstart: [{i}/{len(runs)}] {run.name} finished in {format_seconds(durations[-1])}: "
          f"last train loss {progress.last_loss:.3f}, last eval loss {progress.last_eval:.3f} "
          f"(elapsed {format_seconds(time.monotonic() - start)}{eta})"
      )
    compare([r.name for r in runs], runs_dir, out_dir, emit, baseline=runs[0].name)
  except (QuickstartError, ValueError) as e:
    print(f"quickstart: error: {e}", file=sys.stderr)
    return 1
  emit(f"quickstart: done in {format_seconds(time.monotonic() - start)}; report: {output_dir(args) / 'report.md'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
