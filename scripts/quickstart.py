#!/usr/bin/env python3
# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0.
"""`make quickstart`: bf16, fp8, te_nvfp4 and te_nvfp4_no_rht on the local corpus, then the comparison.

  .venv/bin/python scripts/quickstart.py [--out results/quickstart] [--smoke] [--steps N] [--precisions ...]
      [--set KEY=VALUE ...] [--set-baseline KEY=VALUE ...] [--set-all KEY=VALUE ...]

--smoke writes to <out>-smoke; --set changes the candidates only, --set-baseline the bf16 baseline, --set-all both.

Thin on purpose: the logic lives in MaxText/quickstart.py, where the tests reach it.
"""

import os
import sys

# Run as a file, Python puts scripts/ first on sys.path; the repository root is what makes `MaxText` importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from MaxText.quickstart import main  # pylint: disable=wrong-import-position

if __name__ == "__main__":
  sys.exit(main())
