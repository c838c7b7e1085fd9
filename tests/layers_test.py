# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The package's layers: imports only point downward, no module imports one that imports it back, and a
function-local import says why it is one (an optional heavy dependency or import cost)."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import subprocess
import sys

import grimp
import pytest

from tests.helpers import REPO_ROOT

_PACKAGE = REPO_ROOT / "MaxText"


def test_the_layers_contract_holds():
  """import-linter's contracts in pyproject.toml (layers; numerics free of maxtext and flax; the light modules free of
  jax, flax and maxtext)."""
  lint = pathlib.Path(sys.executable).with_name("lint-imports")
  proc = subprocess.run([str(lint), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 0 and "0 broken" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_light_modules_load_without_jax():
  """What import-linter's "light modules" contract says, at run time (package __init__ files included): the
  comparison tool, the run record's schema and the tap registry load in a fresh interpreter without jax, flax or
  maxtext (a regression put jax there once: precision/keys.py -> taps.py -> the numerics)."""
  code = ("import sys; import MaxText.compare, MaxText.compare.__main__, MaxText.integration.artifacts, "
          "MaxText.precision.keys, MaxText.precision.taps, MaxText.study; "
          "print(sorted(m for m in ('jax', 'flax', 'maxtext') if m in sys.modules))")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                        check=False)
  assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


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


#: The declared tables through which the package replaces another module's attributes, each checked before it is
#: applied: the seam (maxtext's and jax's symbols) and the pre-flight's answers to TransformerEngine's device queries.
_DECLARED = {_PACKAGE / "integration" / "seam.py", _PACKAGE / "preflight" / "deviceless.py"}


def _is_module(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError):  # a parent that is not a package: `name` is an attribute, not a module
    return False


def _module_names(tree: ast.Module) -> set[str]:
  """Names a module binds to imported modules (`import a.b` binds a; `import a.b as c` binds c; `from a import b`
  binds b when a.b is a module)."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names |= {alias.asname or alias.name for alias in node.names if _is_module(f"{node.module}.{alias.name}")}
  return names


def _root(node: ast.expr) -> str | None:
  while isinstance(node, ast.Attribute):
    node = node.value
  return node.id if isinstance(node, ast.Name) else None


def test_other_modules_attributes_are_set_only_through_the_declared_tables():
  """No module of the package assigns to another module's attribute (`jax.lax.x = ...`, `setattr(module, ...)`)
  outside the seam and the deviceless answers."""
  found = []
  for path in sorted(_PACKAGE.rglob("*.py")):
    if path in _DECLARED:
      continue
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = _module_names(tree)
    for node in ast.walk(tree):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) \
          else []
      found += [(path.name, node.lineno) for t in targets if isinstance(t, ast.Attribute) and _root(t) in modules]
      if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
          and node.args and _root(node.args[0]) in modules:
        found.append((path.name, node.lineno))
  assert not found, found


#: Names the package gives maxtext's config object (a parameter or local of that name is maxtext's config).
_CONFIG_NAMES = {"config", "cfg", "maxtext_config"}


def _config_key_reads(tree: ast.Module, keys: set[str]) -> list[int]:
  """Lines of `tree` that read a maxtext config key: `config.<key>`, or `getattr(config, ...)` of any name."""
  lines = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and node.attr in keys and isinstance(node.value, ast.Name) \
        and node.value.id in _CONFIG_NAMES:
      lines.append(node.lineno)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"getattr", "hasattr"} \
        and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in _CONFIG_NAMES:
      lines.append(node.lineno)
  return lines


def test_maxtext_config_keys_are_read_only_in_the_integration_layer():
  """maxtext's config keys are read in MaxText/integration/ and nowhere else; the layers below receive plain numbers
  and Settings, so import-linter's contract also covers what they know of maxtext (docs/development.md)."""
  from maxtext.configs import types  # pylint: disable=import-outside-toplevel  # maxtext: only this test needs it

  keys = set(types.MaxTextConfig.model_fields)
  assert {"mlp_dim", "attention", "ici_tensor_parallelism", "logical_axis_rules"} <= keys
  found = []
  for path in sorted(_PACKAGE.rglob("*.py")):
    if path.is_relative_to(_PACKAGE / "integration"):
      continue
    found += [(str(path.relative_to(_PACKAGE)), line)
              for line in _config_key_reads(ast.parse(path.read_text(encoding="utf-8")), keys)]
  assert not found, found
  assert _config_key_reads(ast.parse("getattr(config, 'attention')\nconfig.mlp_dim\nconfig.read_text()"), keys) \
      == [1, 2]


def test_a_key_a_config_may_lack_is_read_in_one_place():
  """`getattr(config, ...)` (a key read with a fallback) only in the builders: MaxText/integration/run_keys.py
  (maxtext's keys: RunKeys, MaxtextKeys) and settings.py (the plugin's); everything else asks what they built."""
  builders = {_PACKAGE / "integration" / "run_keys.py", _PACKAGE / "integration" / "settings.py"}
  found = []
  for path in sorted(_PACKAGE.rglob("*.py")):
    if path in builders:
      continue
    found += [(str(path.relative_to(_PACKAGE)), node.lineno) for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in _CONFIG_NAMES]
  assert not found, found
