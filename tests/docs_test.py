# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The README and docs/ say only what exists: links (and their heading anchors), make targets, `python -m` modules and
repository paths; and the README stays short, with the install and the switch on its first screen.

Reads text only (no module of the package is imported), so it runs in well under a second.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import pathlib
import re
import sys

from tests.helpers import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
#: The README's budget, and what its first screen must show a user.
README_MAX_LINES = 200
FIRST_SCREEN_LINES = 40
FIRST_SCREEN = ("./setup.sh", "pip install --no-deps .", "./setup.sh --gpu", "python -m MaxText.train CONFIG.yml",
                "quantization=te_nvfp4", "MaxText.register()")

_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]+`")
_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
_PYTHON_M = re.compile(r"\bpython3?\s+-m\s+([A-Za-z_][\w.]*)")
#: A repository path in backticks: under one of these folders, optionally `::test` or `#anchor` after it.
_REPO_PATH = re.compile(r"^((?:MaxText|tests|configs|scripts|docs|\.ci)/[\w./-]*)(?:::[\w\[\]-]+|#[\w-]+)?$")


def pages() -> list[pathlib.Path]:
  return [README, *sorted(DOCS.glob("*.md"))]


def _rel(path: pathlib.Path) -> str:
  return path.resolve().relative_to(REPO_ROOT).as_posix()


def prose(text: str) -> str:
  """The text without fenced code blocks (whose lines are not headings or links)."""
  return _FENCE.sub("", text)


def github_anchor(heading: str) -> str:
  """GitHub's anchor of a heading's text: markup dropped, lower case, punctuation but `-` and `_` removed, spaces to
  hyphens (hyphens are not collapsed)."""
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays, its target goes
  text = re.sub(r"[`*]", "", text).strip().lower()
  return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
  """Every heading anchor of a Markdown file, duplicates numbered as GitHub does (-1, -2, ...)."""
  seen: dict[str, int] = {}
  out = set()
  for _, heading in _HEADING.findall(prose(path.read_text(encoding="utf-8"))):
    anchor = github_anchor(heading)
    count = seen.get(anchor, 0)
    seen[anchor] = count + 1
    out.add(anchor if count == 0 else f"{anchor}-{count}")
  return out


def broken_links(page: pathlib.Path) -> list[str]:
  """Each relative link of `page` whose file, or heading anchor in it, does not exist."""
  text = _INLINE_CODE.sub("", prose(page.read_text(encoding="utf-8")))
  broken = []
  for target in _LINK.findall(text):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
      continue
    file_part, _, anchor = target.partition("#")
    path = (page.parent / file_part).resolve() if file_part else page
    where = f"{_rel(page)}: ({target})"
    if not path.exists():
      broken.append(f"{where}: no such file")
      continue
    if anchor and (path.suffix != ".md" or anchor not in anchors(path)):
      broken.append(f"{where}: no heading with anchor #{anchor} in {_rel(path)}")
  return broken


def make_targets() -> set[str]:
  """The Makefile's targets (rules, not variable assignments)."""
  makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
  return {m for line in makefile.splitlines() for m in re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", line)}


def named_make_targets(text: str) -> set[str]:
  """The targets of the `make ...` commands a page shows: in inline code and as fenced command lines (not prose:
  "make it a multiple of 16")."""
  commands = [span.strip("`") for span in _INLINE_CODE.findall(prose(text))]
  for block in _FENCE.findall(text):
    commands += [line.strip() for line in block.splitlines()[1:-1]]
  return {m.group(1) for c in commands if (m := re.match(r"^make\s+([A-Za-z0-9_.-]+)(?=\s|$)", c))
          and "=" not in m.group(1)}


def module_exists(name: str) -> bool:
  """Whether `python -m name` finds a module (a package: with a __main__), without importing any of it or its
  parents: the top level through importlib's finders, each further part as a file or folder in its parent's folders
  (importlib's own finders would import the parents of a namespace package)."""
  top, *rest = name.split(".")
  spec = importlib.util.find_spec(top)
  if spec is None:
    return False
  if spec.submodule_search_locations is None:  # a plain module: nothing below it
    return not rest
  folders = [pathlib.Path(p) for p in spec.submodule_search_locations]
  for i, part in enumerate(rest):
    packages = [f / part for f in folders if (f / part).is_dir()]
    modules = [f for f in folders for suffix in importlib.machinery.all_suffixes() if (f / f"{part}{suffix}").is_file()]
    if i == len(rest) - 1 and modules and not packages:
      return True
    folders = packages
  return any((f / "__main__.py").is_file() for f in folders)  # a package runs its __main__


def named_paths(text: str) -> set[str]:
  """The repository paths a page names in backticks (globs and placeholders left out), with any #anchor."""
  out = set()
  for span in _INLINE_CODE.findall(prose(text)):
    m = _REPO_PATH.match(span.strip("`"))
    if m and not re.search(r"[*{}<>]", span):
      out.add(span.strip("`").split("::")[0])
  return out


def test_every_relative_link_resolves():
  broken = [b for page in pages() for b in broken_links(page)]
  assert not broken, "\n".join(broken)


def test_every_make_target_named_exists():
  targets = make_targets()
  missing = [f"{_rel(p)}: make {t}" for p in pages() for t in sorted(named_make_targets(p.read_text(encoding="utf-8")))
             if t not in targets]
  assert not missing, f"not a target of the Makefile ({sorted(targets)}):\n" + "\n".join(missing)


def test_every_python_m_module_named_is_importable():
  missing = [f"{_rel(p)}: python -m {m}" for p in pages() for m in sorted(set(_PYTHON_M.findall(p.read_text(
      encoding="utf-8")))) if not module_exists(m)]
  assert not missing, "no such module (or package without __main__) here:\n" + "\n".join(missing)


def test_every_repository_path_named_exists():
  missing = []
  for page in pages():
    for named in sorted(named_paths(page.read_text(encoding="utf-8"))):
      file_part, _, anchor = named.partition("#")
      path = REPO_ROOT / file_part
      if not path.exists():
        missing.append(f"{_rel(page)}: {named}")
      elif anchor and anchor not in anchors(path):
        missing.append(f"{_rel(page)}: {named} (no such heading)")
  assert not missing, "\n".join(missing)


def test_readme_is_short_and_its_first_screen_says_how_to_install_and_turn_it_on():
  lines = README.read_text(encoding="utf-8").splitlines()
  assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move the detail into docs/"
  first = "\n".join(lines[:FIRST_SCREEN_LINES])
  assert not [s for s in FIRST_SCREEN if s not in first], [s for s in FIRST_SCREEN if s not in first]


def test_the_readme_links_every_docs_page():
  linked = {(README.parent / t.partition("#")[0]).resolve() for t in _LINK.findall(prose(README.read_text(
      encoding="utf-8")))}
  unlinked = [_rel(p) for p in DOCS.glob("*.md") if p.resolve() not in linked]
  assert not unlinked, unlinked


def test_the_checks_catch_what_they_should(tmp_path):
  """The helpers above, on a hand-made page: a link to a missing anchor, a missing target, a missing module."""
  (tmp_path / "a.md").write_text("# Title `code`: here\n\n## Title `code`: here\n", encoding="utf-8")
  assert anchors(tmp_path / "a.md") == {"title-code-here", "title-code-here-1"}
  assert github_anchor("Pre-flight: will it fit?") == "pre-flight-will-it-fit"
  assert named_make_targets("Run `make study DEVICE=gpu`; make it so.\n```bash\nmake quickstart X=1\n```\n") == {
      "study", "quickstart"}
  assert module_exists("MaxText.compare") and module_exists("pytest")
  assert not module_exists("MaxText.nvfp4") and not module_exists("MaxText.no_such_module")  # no __main__; missing


def test_the_prediction_table_is_the_pre_flights_own_json():
  """docs/prediction.md's table of predicted ratios is what scripts/prediction_table.py writes from the pre-flight's
  JSON in docs/figures/prediction/: a figure edited in the doc alone, or a JSON replaced without `--write`, is red."""
  spec = importlib.util.spec_from_file_location("prediction_table", REPO_ROOT / "scripts" / "prediction_table.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # its dataclasses look their module up there
  spec.loader.exec_module(module)
  assert module.in_doc((REPO_ROOT / "docs" / "prediction.md").read_text(encoding="utf-8")) == module.table()
