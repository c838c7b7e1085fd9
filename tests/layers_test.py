# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The package's layers: imports only point downward, no module imports one that imports it back, and a
function-local import says why it is one (an optional heavy dependency or import cost)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import grimp
import pytest

from tests.helpers import REPO_ROOT

_PACKAGE = REPO_ROOT / "MaxText"


def test_the_layers_contract_holds():
  """import-linter's contracts in pyproject.toml (layers; numerics free of maxtext and flax)."""
  lint = pathlib.Path(sys.executable).with_name("lint-imports")
  proc = subprocess.run([str(lint), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 0 and "0 broken" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_no_import_cycles():
  """No module imports (directly or through others) a module that imports it back, function-local imports included."""
  graph = grimp.build_graph("MaxText", cache_dir=None)
  cycles = sorted(f"{a} -> {b} -> ... -> {a}" for a in graph.modules for b in graph.find_modules_directly_imported_by(a)
                  if graph.chain_exists(importer=b, imported=a))
  assert not cycles, cycles


def _local_imports() -> list[tuple[pathlib.Path, int, list[str]]]:
  found = []
  for path in sorted(_PACKAGE.rglob("*.py")):
    lines = path.read_text(encoding="utf-8").splitlines()
    for node in ast.walk(ast.parse("\n".join(lines))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        found += [(path, n.lineno, lines[max(n.lineno - 2, 0):n.lineno]) for n in ast.walk(node)
                  if isinstance(n, (ast.Import, ast.ImportFrom))]
  return found


@pytest.mark.parametrize("path,line,text", _local_imports(), ids=lambda v: v if isinstance(v, int) else None)
def test_function_local_imports_give_a_reason(path, line, text):
  """A function-local import carries `import-outside-toplevel  # <reason>` on its line or the line above."""
  reasons = [t.split("import-outside-toplevel", 1)[1] for t in text if "import-outside-toplevel" in t]
  assert any(r.strip().startswith("#") and len(r.split()) >= 3 for r in reasons), \
      f"{path.relative_to(REPO_ROOT)}:{line}: say why this import is local (optional dependency, import cost)"
