# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""`python -m MaxText.preflight CONFIG.yml [key=value ...] --target b200|gb200|gb300|h100 --devices N [--predict]
[--predict-against fp8,bf16,nvfp4_all] [--json PATH]`

Compiles the run's train step (maxtext's own, with the plugin registered) for N target GPUs with XLA's GPU compiler,
on this machine, without a GPU (`.venv-gpu`: the CUDA jax plugin and TransformerEngine), and prints:
  - per-device memory: arguments, temporaries, peak, against the GPU's memory: fits or not, by how much;
  - the kernels in the step and TransformerEngine's among them (its FP4 GEMMs, quantizations, RHT amaxes);
  - for an NVFP4 run on TE, what the plugin adds around TE's kernels: the same step compiled again without the
    non-finite guard, the statistics tap and the audit, and the difference in bytes per group of kernels;
  - for each periodic tap the run has on (nvfp4_stats_interval, nvfp4_audit_interval), the run compiled once more
    without it: what it adds on the steps it runs, and averaged over its interval (bytes, and seconds with --predict);
  - with --predict, the step time predicted from the compiled kernels (MaxText.preflight.predict) for this run and
    for the same config as maxtext's fp8, as bf16 and as upstream maxtext's te_nvfp4 (--predict-against narrows
    them): model TFLOP/s per GPU, speedups, where the time goes, the Amdahl ceiling.
Python warnings and WARNING log lines raised while loading and compiling come after the report. Exit status: 0 when
it fits; 2 with one line on stderr for a config error, an unknown target or comparison, a device count the config's
parallelism cannot use, a comparison program that does not compile, or a step that does not fit. The answers a GPU
would give TE at trace time come from MaxText.preflight.deviceless; what that leaves out (cuDNN's attention
workspace) is said in the output.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import pathlib
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the compile-only GPUs come from the CUDA plugin's topology API
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # XLA's INFO lines (its scheduler's, per computation) bury the report

# pylint: disable=wrong-import-position  # after the environment above
from MaxText.backends import environment
from MaxText.integration import cli, seam, shapes
from MaxText.integration.settings import settings_of
from MaxText.precision.modes import Backend
from MaxText.precision.policy import Precision
from MaxText.preflight import deviceless, programs, report
from MaxText.preflight import kernels as kernels_lib
from MaxText.preflight.targets import TARGETS

PROG = "MaxText.preflight"
#: The keys switched off for the comparison program: everything the plugin adds around TE's dense that is not
#: the recipe itself (the switches and BF16 layers are the recipe a user chose, so they stay).
BARE_OVERRIDES = ("nvfp4_nonfinite_check=false", *programs.TAPS_OFF)


def fail(line: str) -> NoReturn:
  """Bad input: one line on stderr and exit 2."""
  cli.fail(PROG, line)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  parser = cli.OneLineParser(PROG, f"CONFIG.yml [key=value ...] --target {'|'.join(TARGETS)} --devices N",
                             description=__doc__.split("\n\n")[1])
  parser.add_argument("config", help="the run's YAML config, as MaxText.train takes it")
  parser.add_argument("overrides", nargs="*", help="key=value overrides, as MaxText.train takes them")
  parser.add_argument("--target", required=True, help=f"the GPU: {', '.join(TARGETS)}")
  parser.add_argument("--devices", required=True, type=int, help="how many GPUs the run uses")
  parser.add_argument("--json", type=pathlib.Path, help="also write the report as JSON to this path")
  parser.add_argument("--no-overhead", action="store_true",
                      help="skip the second compile that measures what the plugin adds around TE's kernels")
  parser.add_argument("--predict", action="store_true",
                      help="predict the step time, also for the programs --predict-against names (one compile each)")
  parser.add_argument("--predict-against", metavar="NAMES",
                      help="comma-separated programs to compare with (implies --predict; default: all that run on the "
                           f"target): {', '.join(f'{c.name} ({c.what})' for c in programs.COMPARISONS.values())}")
  args = parser.parse_intermixed_args(argv)  # key=value overrides may come after the options
  if args.target not in TARGETS:
    fail(f"--target {args.target!r} is not a GPU the plugin describes; valid: {', '.join(sorted(TARGETS))}")
  try:
    args.against = programs.against(args.predict_against, TARGETS[args.target])
  except ValueError as e:
    fail(str(e))
  args.predict = args.predict or args.predict_against is not None
  if args.devices < 1:
    fail(f"--devices {args.devices}: give the number of GPUs the run uses (1 or more)")
  bad = [o for o in args.overrides if "=" not in o]
  if bad:
    fail(f"{bad[0]!r} is not key=value; overrides look like per_device_batch_size=2")
  return args


def target_environment(target: str, devices: int) -> environment.Environment:
  """What the backend choice sees on `devices` GPUs of `target`: TE imported without a driver (if installed) with its
  device queries answered for the target (MaxText.preflight.deviceless), and TE's own NVFP4 verdict there."""
  capability = TARGETS[target].capability[0] + TARGETS[target].capability[1] / 10
  if deviceless.te_installed():
    deviceless.import_transformer_engine()
    return deviceless.target_environment(capability, devices)
  return environment.Environment(te_error="transformer_engine_jax is not installed (./setup.sh --gpu)",
                                 gpu_capabilities=(capability,) * devices)


def load_config(config: str, overrides: Sequence[str], devices: int) -> Any:
  """maxtext's config with the plugin registered, for `devices` GPUs (maxtext's internal_compile device count)."""
  seam.register()  # the plugin's keys (idempotent)
  from maxtext.configs import pyconfig  # pylint: disable=import-outside-toplevel  # after register(), as maxtext's

  given = {o.split("=", 1)[0] for o in overrides}
  extra = [f"{k}={v}" for k, v in (("base_output_directory", "/tmp/maxtext-preflight"),) if k not in given]
  return pyconfig.initialize([PROG, config, *extra, *overrides, "internal_compile=true",
                              f"internal_compile_num_devices={devices}"])


def compile_step(config: Any, target: str, devices: int, program: str = "") -> Any:
  """The compiled step; its compile line says which `program` it is (when named). A device count the config's
  parallelism cannot use is one line, exit 2."""
  # pylint: disable-next=import-outside-toplevel  # maxtext and TE's modules: after register() and the answers
  from MaxText.preflight.compile import compile_train_step

  try:
    return compile_train_step(config, target, devices,
                              log=lambda line: print(f"{line}: {program}" if program else line, flush=True))
  except (AssertionError, ValueError) as e:
    message = " ".join(str(e).split())
    if "mesh" in message.lower() or "devices" in message.lower() or "parallelism" in message.lower():
      message = re.sub(r"NamedSharding\(mesh=Mesh\(.*?\), spec=(P\([^)]*\))[^)]*\)", r"\1", message)
      fail(f"{devices} x {target}: the config's parallelism cannot use this device count: {message[:500]}")
    raise


def mem_fraction() -> float:
  """The share of a GPU jax's allocator may use: XLA_PYTHON_CLIENT_MEM_FRACTION as the run will see it, else jax's
  default; a value that is not a fraction in (0, 1] is one line, exit 2."""
  given = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
  if given is None:
    return report.DEFAULT_MEM_FRACTION
  try:
    fraction = float(given)
  except ValueError:
    fraction = -1.0
  if not 0 < fraction <= 1:
    fail(f"XLA_PYTHON_CLIENT_MEM_FRACTION={given!r}: give the share of GPU memory jax may use, e.g. 0.9")
  return fraction


def _te_nvfp4(config: Any) -> bool:
  """Whether the run's MLP GEMMs are NVFP4 on TransformerEngine (nvfp4_backend resolved for the target)."""
  settings = settings_of(config)
  return (settings.nvfp4 and settings.mlp is Precision.NVFP4
          and environment.resolve_backend(settings.backend, environment.current()) is Backend.TE)


def main(argv: Sequence[str]) -> int:
  args = parse_args(argv)
  fraction = mem_fraction()
  seam.register()
  seam.install_cli_error_handler(cli.one_line_config_errors([PROG, args.config], PROG))
  with _after_the_report():
    with environment.answering(target_environment(args.target, args.devices)):
      return _report(args, fraction)


class _Held(logging.Handler):
  """Holds log records (WARNING and above) instead of printing them."""

  def __init__(self) -> None:
    super().__init__(logging.WARNING)
    self.lines: list[str] = []

  def emit(self, record: logging.LogRecord) -> None:
    self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


@contextlib.contextmanager
def _after_the_report() -> Iterator[None]:
  """Python warnings and WARNING log records raised in the block (maxtext's, TE's, jax's, while configs load and
  programs compile) are printed after it, each distinct line once with how often it came, so they do not bury the
  report. Python's warning filters stay as they are; the root logger's handlers are back after the block."""
  root = logging.getLogger()
  handlers, held = root.handlers[:], _Held()
  root.handlers = [held]
  try:
    with warnings.catch_warnings(record=True) as caught:
      yield
  finally:
    root.handlers = handlers + [h for h in root.handlers if h is not held]
    lines = [f"{w.category.__name__}: {w.message}" for w in caught] + held.lines
    counts = collections.Counter(" ".join(line.split())[:300] for line in lines)
    if counts:
      print(f"warnings and log messages while loading and compiling, held until now ({len(counts)} distinct):")
      for line, count in counts.items():
        print(f"  {count} x {line}" if count > 1 else f"  {line}")


def _comparison_kernels(args: argparse.Namespace, comparison: programs.Comparison,
                        memories: dict[str, report.Memory] | None = None) -> list[kernels_lib.Kernel]:
  """The kernels of one comparison program (its memory into `memories`, by name); one that does not load or compile
  is one line, exit 2."""
  overrides = programs.overrides_for(args.overrides, comparison)
  try:
    with comparison.context():
      compiled = compile_step(load_config(args.config, overrides, args.devices), args.target, args.devices,
                              f"{comparison.name} ({' '.join(comparison.overrides)}), to compare with")
    if memories is not None:
      memories[comparison.name] = report.Memory.of(compiled, TARGETS[args.target], mem_fraction())
    return kernels_lib.kernels(compiled.as_text())
  except Exception as e:  # pylint: disable=broad-exception-caught  # any failure of that program is one line
    fail(f"the comparison program {comparison.name} ({' '.join(comparison.overrides)}) does not compile for "
         f"{args.devices} x {args.target}: {type(e).__name__}: {' '.join(str(e).split())[:300]}")


def _without_taps(args: argparse.Namespace, config: Any) -> list[tuple[programs.Tap, list[kernels_lib.Kernel]]]:
  """For each periodic tap the run has on, the run's kernels compiled without it (one more compile each)."""
  out = []
  for tap in programs.taps(settings_of(config)):
    compiled = compile_step(load_config(args.config, programs.replaced(args.overrides, [tap.off]), args.devices),
                            args.target, args.devices, f"the run without {tap.what} ({tap.off}), to count what it adds")
    out.append((tap, kernels_lib.kernels(compiled.as_text())))
    del compiled
  return out


def _report(args: argparse.Namespace, fraction: float) -> int:
  """The pre-flight of `args` once the target's environment is being answered."""
  target = TARGETS[args.target]
  config = load_config(args.config, args.overrides, args.devices)
  compiled = compile_step(config, args.target, args.devices, "this run")
  memory = report.Memory.of(compiled, target, fraction)
  found = kernels_lib.kernels(compiled.as_text())
  del compiled  # the comparison programs compile next; keep one executable at a time
  lines = [*report.memory_lines(memory, target, args.devices), *report.kernel_lines(found)]
  if shapes.fused_attention_on_te(config):
    lines.append("not counted: cuDNN's fused-attention workspace (cuDNN sizes it on the GPU; the pre-flight "
                 "answers 0 bytes)")
  payload: dict[str, Any] = {"config": args.config, "overrides": list(args.overrides), "target": args.target,
                             "devices": args.devices, "memory": memory.as_dict(),
                             "te_kernels": kernels_lib.counts(kernels_lib.te_kernels(found))}
  overhead_wanted = not args.no_overhead and _te_nvfp4(config)
  without = _without_taps(args, config) if overhead_wanted or args.predict else []
  predicted = None
  memories = {"this run": memory}
  if args.predict:
    try:
      predicted = programs.predict_all(config, found, target, args.against,
                                       lambda comparison: _comparison_kernels(args, comparison, memories), without)
    except ValueError as e:
      fail(f"cannot predict the step on {args.devices} x {target.name}: {e}")
  taps = tuple(report.TapCost(tap=tap, step_bytes=kernels_lib.total_bytes(found) - kernels_lib.total_bytes(kernels),
                              seconds=predicted.tap_seconds[tap.key] if predicted else None)
               for tap, kernels in without)
  if overhead_wanted:
    bare = compile_step(load_config(args.config, programs.replaced(args.overrides, BARE_OVERRIDES), args.devices),
                        args.target, args.devices, f"the overhead comparison ({' '.join(BARE_OVERRIDES)})")
    overhead = report.Overhead.between(found, kernels_lib.kernels(bare.as_text()), taps)
    lines += report.overhead_lines(overhead, "against the same step with " + " ".join(BARE_OVERRIDES))
    payload["overhead"] = overhead.as_dict()
  if predicted is not None:
    lines += report.prediction_lines(predicted.run, predicted.against, target, args.devices, taps, memories)
    payload["prediction"] = {**predicted.as_dict(), "fits": {name: m.fits for name, m in memories.items()},
                             "peak_bytes": {name: m.peak for name, m in memories.items()}}
  print("\n".join(lines))
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")
  if not memory.fits:
    fail(f"does not fit: {report.gib(memory.peak)} per device > {report.gib(memory.device)} jax may use on a "
         f"{target.name} ({memory.fraction:.0%}) by {report.gib(-memory.margin)}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
