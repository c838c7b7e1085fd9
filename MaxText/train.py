# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""Pre-training entry point: maxtext's own trainer with the NVFP4 plugin registered.

Usage, exactly like maxtext's `python -m maxtext.trainers.pre_train.train`:
  python -m MaxText.train CONFIG.yml key=value ...
  python MaxText/train.py CONFIG.yml key=value ...      (the historic MaxText form)
A config that fails to load (unknown key, wrong type, invalid choice, a GEMM dim NVFP4 cannot block) prints one
line on stderr and exits 2; NVFP4_CONFIG_TRACEBACK=1 prints the full traceback before it.
"""

import os
import sys
import traceback
from collections.abc import Callable, Sequence

if __name__ == "__main__" and not __package__:
  # Run as a file: Python put MaxText/ itself first on sys.path, where our config.py / plugin.py / train.py
  # could shadow same-named top-level modules. Put the repository root there instead, so `MaxText` imports.
  sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# transformers (imported by maxtext) prints PyTorch/RoPE advisories at import that bury our one-line errors.
# A default only: a user's own TRANSFORMERS_VERBOSITY wins.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from MaxText.integration import seam  # pylint: disable=wrong-import-position  # stdlib only: cheap

EXIT_CONFIG_ERROR = 2  # The same status maxtext's pyconfig uses for a bad config.
#: Set to 1 to get the full traceback of a config error instead of the one-line form.
TRACEBACK_ENV = "NVFP4_CONFIG_TRACEBACK"
_TERMINATION_LOG = "/dev/termination-log"  # where maxtext's handler leaves the reason for Kubernetes


def one_line_config_errors(argv: Sequence[str]) -> Callable[[Exception], None]:
  """Our command line's config-error handler: one line on stderr and exit 2.

  Replaces maxtext's `pyconfig._handle_config_exception` for this process (the seam's "cli" entry; library users of
  `register()` keep maxtext's handler). Like maxtext's handler it writes the reason to /dev/termination-log and
  exits 2; unlike it, the message is one line (maxtext's for an unknown key lists all ~1500 keys). Exceptions that
  are not config errors are re-raised with their traceback.
  """
  # pylint: disable-next=import-outside-toplevel  # import cost: maxtext and jax load once the command runs
  from MaxText.integration.config import format_config_error, is_config_error, missing_config_file

  def handle(exc: Exception) -> None:
    if not is_config_error(exc):
      raise exc
    if isinstance(exc, FileNotFoundError):
      line = missing_config_file(str(argv[1])) if len(argv) > 1 else f"config file not found: {exc.filename}"
    else:
      line = format_config_error(exc)
    try:
      with open(_TERMINATION_LOG, "w", encoding="utf-8") as f:
        f.write(f"MAXTEXT CONFIG ERROR: {line}")
    except OSError:
      pass
    if os.environ.get(TRACEBACK_ENV) == "1":
      traceback.print_exception(exc)
    print(f"MaxText.train: config error: {line}", file=sys.stderr)
    sys.exit(EXIT_CONFIG_ERROR)

  return handle


def main(argv: Sequence[str]) -> None:
  """Registers the plugin, then runs maxtext's pre-training `main(argv)` (argv[0] is the program name)."""
  seam.register()
  seam.install_cli_error_handler(one_line_config_errors(argv))
  # pylint: disable-next=import-outside-toplevel  # import cost: as above
  from maxtext.trainers.pre_train import train as maxtext_train

  maxtext_train.main(argv)


if __name__ == "__main__":
  from absl import app  # maxtext's own runner: sets up absl flags and logging the way maxtext expects.

  app.run(main)
