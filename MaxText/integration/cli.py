# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Our command lines' one-line errors (MaxText.train, MaxText.preflight, MaxText.selfcheck): a bad config, a bad
option, one line on stderr and exit 2. Stdlib only at import."""

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

EXIT_CONFIG_ERROR = 2  # The same status maxtext's pyconfig uses for a bad config.
#: Set to 1 to get the full traceback of a config error instead of the one-line form.
TRACEBACK_ENV = "NVFP4_CONFIG_TRACEBACK"
_TERMINATION_LOG = "/dev/termination-log"  # where maxtext's handler leaves the reason for Kubernetes


def one_line_config_errors(argv: Sequence[str], prog: str) -> Callable[[Exception], None]:
  """Our command lines' config-error handler: one line on stderr, prefixed by `prog`, and exit 2.

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
    print(f"{prog}: config error: {line}", file=sys.stderr)
    sys.exit(EXIT_CONFIG_ERROR)

  return handle


def not_overridden(overrides: Sequence[str], extra: Sequence[str]) -> list[str]:
  """`overrides` without the keys `extra` sets: maxtext refuses a key given twice, so a command that adds its own
  `key=value` overrides to a user's drops the user's for those keys first."""
  given = {e.split("=", 1)[0] for e in extra}
  return [o for o in overrides if o.split("=", 1)[0] not in given]


def fail(prog: str, line: str) -> NoReturn:
  """Bad input to one of our command lines: one line on stderr, prefixed by `prog`, and exit 2."""
  print(f"{prog}: {line}", file=sys.stderr)
  sys.exit(EXIT_CONFIG_ERROR)


class OneLineParser(argparse.ArgumentParser):
  """argparse for our command lines: a usage error is one line naming the usage (`fail`), not argparse's block."""

  def __init__(self, prog: str, usage_line: str, **kwargs) -> None:
    super().__init__(prog=f"python -m {prog}", **kwargs)
    self.name, self.usage_line = prog, usage_line

  def error(self, message: str) -> NoReturn:
    fail(self.name, f"{message} (usage: python -m {self.name} {self.usage_line})")
