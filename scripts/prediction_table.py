# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""docs/prediction.md's table of predicted step-time ratios over fp8, generated from the pre-flight's own JSON.

Why: the ratios recur (the table, the text around it, the README), and a figure typed twice drifts. Each cell comes
from one `python -m MaxText.preflight ... --predict --json FILE` output kept in docs/figures/prediction/ (its config,
overrides, target and the ratios it printed); this script writes the table from them, and tests/docs_test.py fails
when the doc's table is not what it writes.

  .venv/bin/python scripts/prediction_table.py           # print the table
  .venv/bin/python scripts/prediction_table.py --write   # put it into docs/prediction.md, between its markers

To refresh a figure, run the row's command (`--commands` prints them; .venv-gpu, about 3 minutes each on 2 cores)
and then `--write`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures" / "prediction"
DOC = ROOT / "docs" / "prediction.md"
BEGIN = "<!-- begin: scripts/prediction_table.py writes this table from docs/figures/prediction/ -->"
END = "<!-- end: scripts/prediction_table.py -->"
#: (target, devices, column title).
TARGETS = (("b200", 8, "8 x B200"), ("gb300", 4, "4 x GB300"))


@dataclasses.dataclass(frozen=True)
class Row:
  """One program of the table: what it is, and the pre-flight run whose JSON holds its ratio (`program`: the run's
  own NVFP4 program, or one of the programs it was predicted against, e.g. nvfp4_all, upstream's every GEMM)."""

  program: str
  attention: str
  config: str
  run: str  # docs/figures/prediction/<run>_<target>.json
  recipe: str
  overrides: tuple[str, ...] = ()
  against: tuple[str, ...] = ("fp8",)
  of: str | None = None  # None: the run's own program; else a program it was predicted against

  def command(self, target: str, devices: int) -> str:
    return (f".venv-gpu/bin/python -m MaxText.preflight {self.recipe} {' '.join(self.overrides)} --target {target} "
            f"--devices {devices} --predict --predict-against {','.join(self.against)} --no-overhead "
            f"--json {(FIGURES / f'{self.run}_{target}.json').relative_to(ROOT)}").replace("  ", " ")


_RECIPE = "configs/recipes/llama3_8b_te_nvfp4.yml"
ROWS = (
    Row("the recipe as published", "BF16", f"`{_RECIPE}`", "8b_recipe", _RECIPE, against=("fp8", "nvfp4_all")),
    Row("NVFP4 MLP, FP8 attention (the default pair)", "FP8", "`configs/recipes/llama3_8b_te_nvfp4_fp8attn.yml`",
        "8b_fp8attn", "configs/recipes/llama3_8b_te_nvfp4_fp8attn.yml"),
    Row("every GEMM NVFP4", "NVFP4", "upstream maxtext's `te_nvfp4` (`nvfp4_all` above)", "8b_recipe", _RECIPE,
        against=("fp8", "nvfp4_all"), of="nvfp4_all"),
    Row("every GEMM NVFP4, the plugin's", "NVFP4", "the recipe with `nvfp4_attention_precision=nvfp4`",
        "8b_attention", _RECIPE, ("nvfp4_attention_precision=nvfp4",), ("fp8", "nvfp4_all")),
    Row("the same with `fused_mlp=true`", "NVFP4", "and `fused_mlp=true` (fp8 fused too)", "8b_attention_fused_mlp",
        _RECIPE, ("nvfp4_attention_precision=nvfp4", "fused_mlp=true")),
)


def ratio(row: Row, target: str) -> float:
  """The row's predicted step-time ratio over fp8 on `target`, read from its run's JSON."""
  found = json.loads((FIGURES / f"{row.run}_{target}.json").read_text(encoding="utf-8"))
  if (found["config"], tuple(found["overrides"]), found["target"]) != (row.recipe, row.overrides, target):
    raise ValueError(f"{row.run}_{target}.json is the prediction of {found['config']} {found['overrides']} on "
                     f"{found['target']}, not of {row.recipe} {list(row.overrides)} on {target}")
  prediction = found["prediction"]
  if row.of is None:
    return float(prediction["speedup"]["fp8"])
  against = prediction["against"]
  return float(against["fp8"]["step_seconds"]) / float(against[row.of]["step_seconds"])


def table() -> str:
  """The markdown table, one row per program, one column per target."""
  lines = ["| NVFP4 program | attention projections | config | " + " | ".join(t for *_, t in TARGETS) + " |",
           "|---|---|---|" + "---:|" * len(TARGETS)]
  for row in ROWS:
    cells = [f"{ratio(row, target):.2f}x" for target, *_ in TARGETS]
    lines.append(f"| {row.program} | {row.attention} | {row.config} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def in_doc(text: str) -> str:
  """The table between the markers of a doc's text."""
  start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
  return text[start:end].strip()


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
  parser.add_argument("--write", action="store_true", help="rewrite the table in docs/prediction.md")
  parser.add_argument("--commands", action="store_true", help="print the pre-flight command of every JSON")
  args = parser.parse_args(argv)
  if args.commands:
    print("\n".join(dict.fromkeys(row.command(t, n) for row in ROWS for t, n, _ in TARGETS)))
    return 0
  generated = table()
  if args.write:
    text = DOC.read_text(encoding="utf-8")
    DOC.write_text(text.replace(in_doc(text), generated), encoding="utf-8")
  print(generated)
  return 0


if __name__ == "__main__":
  sys.exit(main())
