# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""maxtext's own Hugging Face -> maxtext conversion (`maxtext.checkpoint_conversion.to_maxtext`) of a tiny model:
run with .venv's Python (maxtext, jax), in a process of its own, as a user runs the conversion.

  python to_maxtext_side.py CONFIG.yml model_name=... key=value ... --hf_model_path=DIR [--flag=value ...]

The one difference from `python -m maxtext.checkpoint_conversion.to_maxtext`: maxtext's conversion takes the Hugging
Face config of `model_name` from its catalogue (`HF_MODEL_CONFIGS`), sized for the published model (Llama 3.1 8B:
32 layers), and has no flag to size it down. Here the catalogue entry is sized from the MaxText config first, by
maxtext's own rule for that (`to_huggingface._validate_or_update_architecture`, its `--override_model_architecture`),
as the export does (MaxText.export.mapping.model_of). A real Llama 3.1 8B needs none of this.
"""

from __future__ import annotations

import copy
import sys

import MaxText


def main(argv: list[str]) -> None:
  MaxText.register()  # the test's configs (configs/tiny.yml) carry the plugin's keys
  # pylint: disable-next=import-outside-toplevel  # maxtext after register(), as MaxText.train imports it
  from maxtext.checkpoint_conversion import to_huggingface, to_maxtext
  from maxtext.configs import pyconfig  # pylint: disable=import-outside-toplevel

  args = ["to_maxtext", *argv]
  config = pyconfig.initialize([a for a in args if not a.startswith("--")])
  hf_config = copy.deepcopy(to_maxtext.HF_MODEL_CONFIGS[config.model_name])
  to_huggingface._validate_or_update_architecture(hf_config, config, override=True)  # pylint: disable=protected-access
  to_maxtext.HF_MODEL_CONFIGS[config.model_name] = hf_config
  to_maxtext.main(args)


if __name__ == "__main__":
  main(sys.argv[1:])
