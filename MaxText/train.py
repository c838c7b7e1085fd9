# Copyright 2026 The MaxText NVFP4 plugin authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#    https://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""Pre-training entry point: maxtext's own trainer with the NVFP4 plugin registered.

Usage, exactly like maxtext's `python -m maxtext.trainers.pre_train.train`:
  python -m MaxText.train CONFIG.yml key=value ...
  python MaxText/train.py CONFIG.yml key=value ...      (the historic MaxText form)
A config that fails to load (unknown key, wrong type, invalid choice) prints one line on stderr and exits 2.
"""

import os
import sys
from collections.abc import Sequence

if __name__ == "__main__" and not __package__:
  # Run as a file: Python put MaxText/ itself first on sys.path, where our config.py / plugin.py / train.py
  # could shadow same-named top-level modules. Put the repository root there instead, so `MaxText` imports.
  sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# transformers (imported by maxtext) prints PyTorch/RoPE advisories at import that bury our one-line errors.
# A default only: a user's own TRANSFORMERS_VERBOSITY wins.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

EXIT_CONFIG_ERROR = 2  # The same status maxtext's pyconfig uses for a bad config.


def main(argv: Sequence[str]) -> None:
  """Registers the plugin, then runs maxtext's pre-training `main(argv)` (argv[0] is the program name)."""
  # pylint: disable=import-outside-toplevel
  from MaxText.config import ConfigError
  from MaxText.plugin import register

  register()
  from maxtext.trainers.pre_train import train as maxtext_train

  try:
    maxtext_train.main(argv)
  except ConfigError as e:
    print(f"MaxText.train: config error: {e}", file=sys.stderr)
    sys.exit(EXIT_CONFIG_ERROR)


if __name__ == "__main__":
  from absl import app  # maxtext's own runner: sets up absl flags and logging the way maxtext expects.

  app.run(main)
