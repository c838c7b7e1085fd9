# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The benchmark and validation scripts under scripts/ import, and every attribute they read from the package's
modules exists: they run for minutes (or only with a GPU), so no test runs them whole, and a name moved in the
package would otherwise break them silently."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pathlib
import sys

import pytest

from tests.helpers import REPO_ROOT

SCRIPTS = sorted((REPO_ROOT / "scripts").glob("*.py"))


def _package_aliases(tree: ast.Module) -> dict[str, str]:
  """Local name -> MaxText module, for `from MaxText.x import y` (y a module) and `import MaxText.x as y`."""
  aliases = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("MaxText"):
      for name in node.names:
        try:
          importlib.import_module(f"{node.module}.{name.name}")
        except ImportError:  # a class, function or constant, not a module
          continue
        aliases[name.asname or name.name] = f"{node.module}.{name.name}"
    elif isinstance(node, ast.Import):
      aliases.update({n.asname: n.name for n in node.names if n.name.startswith("MaxText") and n.asname})
  return aliases


def missing_attributes(path: pathlib.Path) -> list[str]:
  """`alias.attr` reads in the script whose package module has no `attr`."""
  tree = ast.parse(path.read_text(encoding="utf-8"))
  aliases = _package_aliases(tree)
  missing = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
      module = importlib.import_module(aliases[node.value.id])
      if not hasattr(module, node.attr):
        missing.append(f"{path.name}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
  return missing


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_a_script_imports_and_reads_only_names_the_package_has(path, monkeypatch):
  monkeypatch.syspath_prepend(str(path.parent))
  spec = importlib.util.spec_from_file_location(f"_script_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
  spec.loader.exec_module(module)
  assert not missing_attributes(path)


def test_a_moved_name_is_found(tmp_path):
  script = tmp_path / "s.py"
  script.write_text("from MaxText.preflight import programs\nprograms.no_such_name(None)\nprograms.COMPARISONS\n")
  assert missing_attributes(script) == ["s.py:2: MaxText.preflight.programs.no_such_name"]
