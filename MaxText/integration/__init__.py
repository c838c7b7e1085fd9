# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The maxtext integration layer: the config schema, the one seam to maxtext, the quant object and its hooks.

`seam` declares every maxtext (and jax) symbol the plugin wraps and installs them in `register()`; `config` is
the pydantic schema of the nvfp4_* keys; `quant` is maxtext's quant object; `moe`, `steps` and `layers` are the
hooks' bodies; `plan` and `run_record` are what a training run writes.
"""
