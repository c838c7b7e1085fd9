# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The one way our tools load a run's config: maxtext's `pyconfig.initialize`, as MaxText.train calls it, with the
plugin registered first (its nvfp4_* keys). The pre-flight, the self-check and the export call it; each adds only its
own default keys and program name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from MaxText.integration import seam

__all__ = ["load_config"]


def load_config(config_path: str, overrides: Sequence[str], *, prog: str, defaults: Mapping[str, str] | None = None,
                devices: int | None = None) -> Any:
  """maxtext's config of `config_path` with `overrides`, as MaxText.train loads it.

  Args:
    config_path: the run's YAML.
    overrides: its key=value overrides.
    prog: argv[0] of the load (maxtext reads it only for a config path that does not end in .yml).
    defaults: keys set unless `overrides` set them (maxtext refuses a key given twice).
    devices: compile for this many GPUs that are not here (maxtext's internal_compile, as the pre-flight does);
      None: for this node's devices.

  Raises what maxtext raises for a bad config (its exception types; only our command lines shorten them).
  """
  seam.register()  # the plugin's keys
  from maxtext.configs import pyconfig  # pylint: disable=import-outside-toplevel  # after register(), as maxtext's

  given = {o.split("=", 1)[0] for o in overrides}
  extra = [f"{k}={v}" for k, v in (defaults or {}).items() if k not in given]
  compile_only = [] if devices is None else ["internal_compile=true", f"internal_compile_num_devices={devices}"]
  return pyconfig.initialize([prog, config_path, *extra, *overrides, *compile_only])
