# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The numerics package depends on jax/numpy/scipy/ml_dtypes only: never on maxtext, flax or TE."""

import ast
import pathlib

_FORBIDDEN = ("maxtext", "flax", "transformer_engine")


def test_numerics_import_nothing_from_maxtext_or_flax():
  package = pathlib.Path(__file__).resolve().parents[2] / "MaxText" / "nvfp4"
  offenders = []
  for path in sorted(package.glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
          [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in _FORBIDDEN]
      offenders += [f"{path.name}: {n}" for n in names if n.startswith("MaxText.") and not n.startswith("MaxText.nvfp4")]
  assert not offenders, offenders
