# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""MaxText NVFP4 plugin: `quantization=te_nvfp4` / `te_nvfp4_no_rht` for maxtext, installed by `register()`.

Importing the package is cheap (no maxtext, no jax); `register()` imports maxtext and installs the hooks
(MaxText.integration.seam). The layers, each importing only those below it (import-linter checks it):
numerics (`nvfp4`) <- `precision` <- `backends` <- `integration` <- entry points (`train`, `quickstart`,
`preflight`), with the tools (`compare`, `data`) beside the entry points.
"""

from MaxText.integration.seam import register

__all__ = ["register"]
