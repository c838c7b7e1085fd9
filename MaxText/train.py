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
from collections.abc import Sequence

if __name__ == "__main__" and not __package__:
  # Run as a file: Python put MaxText/ itself first on sys.path, where our subpackages (data/, compare/, ...) and
  # modules (train.py, quickstart.py) could shadow same-named top-level modules. Put the repository root there
  # instead, so `MaxText` imports (main() below registers the plugin through MaxText/integration/seam.py).
  sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# transformers (imported by maxtext) prints PyTorch/RoPE advisories at import that bury our one-line errors.
# A default only: a user's own TRANSFORMERS_VERBOSITY wins.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from MaxText.integration import seam  # pylint: disable=wrong-import-position  # stdlib only: cheap
from MaxText.integration.cli import one_line_config_errors  # pylint: disable=wrong-import-position  # stdlib only

#: Exit status of a run that nvfp4_audit_action=stop ended (a config error is 2, as maxtext's).
EXIT_AUDIT_STOP = 1


def main(argv: Sequence[str]) -> None:
  """Registers the plugin, then runs maxtext's pre-training `main(argv)` (argv[0] is the program name).

  A run that the NVFP4 audit stopped (nvfp4_audit_action=stop) ends with one line on stderr and exit 1, also where
  maxtext's GPU context wraps the error ("generator didn't stop after throw()" with ours in its chain).
  """
  seam.register()
  seam.install_cli_error_handler(one_line_config_errors(argv, "MaxText.train"))
  # pylint: disable-next=import-outside-toplevel  # import cost: as above
  from maxtext.trainers.pre_train import train as maxtext_train

  # pylint: disable-next=import-outside-toplevel  # import cost: as above
  from MaxText.integration.audit import AuditMismatch

  try:
    maxtext_train.main(argv)
  except Exception as e:  # pylint: disable=broad-exception-caught  # only our audit's stop is shortened
    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, AuditMismatch):
      cause = cause.__cause__ or cause.__context__
    if cause is None:
      raise
    print(f"MaxText.train: stopped by nvfp4_audit_action=stop: {cause}", file=sys.stderr)
    sys.exit(EXIT_AUDIT_STOP)


if __name__ == "__main__":
  from absl import app  # maxtext's own runner: sets up absl flags and logging the way maxtext expects.

  app.run(main)
