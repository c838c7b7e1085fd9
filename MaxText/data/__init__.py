# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Local data for CPU runs: the deterministic Python-stdlib corpus (`python -m MaxText.data.corpus OUT_DIR`)."""
