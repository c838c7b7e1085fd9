# Copyright 2026 The NVFP4-for-MaxText Authors. Licensed under the Apache License, Version 2.0.
"""Local data for CPU runs: the deterministic Python-stdlib corpus (`python -m MaxText.data.corpus OUT_DIR`)."""
