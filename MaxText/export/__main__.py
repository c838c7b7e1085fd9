# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""python -m MaxText.export CONFIG.yml [key=value ...] --out DIR [--format compressed-tensors|modelopt|bf16]
[--activations none|calibrate] [--calibration-steps N] [--force]

Reads the run's config as MaxText.train does; the checkpoint is `load_parameters_path=` or the run's own latest
(base_output_directory/run_name). Writes a Hugging Face model directory whose NVFP4 MLP weights are the training
forward's own operands (docs/export.md); with --activations calibrate also each NVFP4 GEMM's input global scale,
from its input amax over N steps of the run's own data (W4A4). Offline: downloads nothing. Bad input: one line on
stderr, exit 2, nothing written.
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile
from collections.abc import Sequence

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # as MaxText.train: keep our one-line errors readable

from MaxText.export import PROG  # pylint: disable=wrong-import-position
from MaxText.export.layouts import FORMAT_NAMES, Format  # pylint: disable=wrong-import-position
from MaxText.integration import seam  # pylint: disable=wrong-import-position
from MaxText.integration.cli import OneLineParser, fail, one_line_config_errors  # pylint: disable=wrong-import-position

_USAGE = ("CONFIG.yml [key=value ...] --out DIR [--format compressed-tensors|modelopt|bf16] "
          "[--activations none|calibrate] [--calibration-steps N] [--force]")


def _parser() -> OneLineParser:
  p = OneLineParser(PROG, _USAGE, description=__doc__.split("\n\n", 1)[1].strip())
  p.add_argument("config", help="the run's config file, as given to MaxText.train")
  p.add_argument("overrides", nargs="*", help="key=value overrides, as given to MaxText.train")
  p.add_argument("--out", required=True, type=pathlib.Path, help="the directory to write (must be empty or absent)")
  p.add_argument("--format", default=Format.COMPRESSED_TENSORS.value, choices=FORMAT_NAMES,
                 help="compressed-tensors (vLLM, transformers), modelopt (TensorRT-LLM, vLLM) or bf16 (unquantized)")
  p.add_argument("--activations", default="none", choices=("none", "calibrate"),
                 help="none: weight-only NVFP4 (W4A16); calibrate: also each NVFP4 GEMM's input global scale (W4A4)")
  p.add_argument("--calibration-steps", type=int, default=8,
                 help="with --activations calibrate: training steps of the run's data to take the input amax over, at "
                 "learning_rate=0 (default 8)")
  p.add_argument("--force", action="store_true", help="replace a non-empty --out")
  return p


def main(argv: Sequence[str]) -> None:
  args = _parser().parse_intermixed_args(argv[1:])  # key=value overrides may follow the options
  bad = [o for o in args.overrides if "=" not in o]
  if bad:
    fail(PROG, f"{bad[0]!r} is not key=value (usage: python -m {PROG} {_USAGE})")
  seam.register()
  seam.install_cli_error_handler(one_line_config_errors([PROG, args.config], PROG))
  # pylint: disable-next=import-outside-toplevel  # import cost: jax and maxtext load once the arguments are good
  from MaxText.export import run, source
  from MaxText.export.calibrate import calibrate  # pylint: disable=import-outside-toplevel  # import cost: as above
  from MaxText.export.mapping import ExportError  # pylint: disable=import-outside-toplevel  # import cost: as above

  config = source.load_config(args.config, args.overrides)
  with tempfile.TemporaryDirectory(prefix="nvfp4-calibration-") as workdir:
    measure = None if args.activations == "none" else (
        lambda checkpoint: calibrate(config, args.config, args.overrides, checkpoint.path, args.calibration_steps,
                                     pathlib.Path(workdir)))
    try:
      summary = run.export(config, args.out, Format(args.format), force=args.force, calibrate=measure)
    except ExportError as e:
      fail(PROG, str(e))
  print(f"{PROG}: {summary.line}")
  print(f"{PROG}: {len(summary.nvfp4)} NVFP4 weights, {len(summary.ignore)} Linear weights unquantized; "
        f"{summary.tokenizer}")
  print(f"{PROG}: wrote {args.format} to {summary.out} from {summary.source}, step {summary.step}")


if __name__ == "__main__":
  main(sys.argv)
