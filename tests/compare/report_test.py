# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""report.json against its schema, report.md, the plots, and the CLI on hand-made metrics files."""

import json
import math

import numpy as np
import pytest

from MaxText.compare import __main__ as cli
from MaxText.compare.report import build_report, loss_table, read_report, write_report
from MaxText.compare.schema import SCHEMA_VERSION, ComparisonSettings, Report, Status

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _no_nan(text):
  """json.loads that fails on NaN/Infinity, which strict JSON (and many readers) reject."""

  def reject(token):
    raise AssertionError(f"non-standard JSON constant {token} in report.json")

  return json.loads(text, parse_constant=reject)


@pytest.fixture()
def three_runs(make_run, decaying_loss, warmup_cosine):
  n = 80
  base = decaying_loss(n)
  lrs = warmup_cosine(n, 8)
  diverged = base + 0.2
  diverged[50:] = math.nan
  return [
      make_run("bf16", base, step_times=[9.0] + [2.0] * (n - 1), lrs=lrs),
      make_run("nvfp4", base + 0.03, step_times=[9.0] + [1.0] * (n - 1), lrs=lrs),
      make_run("broken", diverged, lrs=lrs),
  ]


def test_report_files_validate_against_schema(tmp_path, three_runs):
  report = build_report(three_runs, "bf16", ComparisonSettings())
  paths = write_report(three_runs, report, tmp_path / "out")
  assert sorted(p.name for p in paths.values()) == ["loss.png", "report.json", "report.md", "throughput.png"]
  raw = _no_nan(paths["report.json"].read_text())
  assert raw["schema_version"] == SCHEMA_VERSION
  again = read_report(paths["report.json"])  # pydantic validation, extra keys forbidden
  assert again == report
  by_name = {c.candidate: c for c in again.comparisons}
  assert by_name["nvfp4"].loss_gap.mean_nats == pytest.approx(0.03)
  assert by_name["nvfp4"].speedup == pytest.approx(2.0)
  assert by_name["broken"].status is Status.CANDIDATE_DIVERGED and by_name["broken"].first_bad_step == 50
  assert {r.name: r.diverged for r in again.runs} == {"bf16": False, "nvfp4": False, "broken": True}
  for png in ("loss.png", "throughput.png"):
    data = paths[png].read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
  md = paths["report.md"].read_text()
  assert "| nvfp4 | ok |" in md and "candidate_diverged at step 50" in md and "![loss](loss.png)" in md


def test_schema_rejects_unknown_keys_and_versions(tmp_path, three_runs):
  report = build_report(three_runs[:2], "bf16", ComparisonSettings())
  raw = report.model_dump(mode="json")
  Report.model_validate(raw)
  with pytest.raises(ValueError):
    Report.model_validate({**raw, "unexpected": 1})
  with pytest.raises(ValueError):
    Report.model_validate({**raw, "schema_version": "0.9"})
  schema = Report.model_json_schema()
  assert set(schema["required"]) >= {"baseline", "settings", "runs", "comparisons"}
  assert {"LossGap", "Step0", "Comparison", "RunSummary"} <= set(schema["$defs"])


def test_baseline_must_name_a_run(three_runs):
  with pytest.raises(ValueError, match="'fp8' is not one of the runs"):
    build_report(three_runs, "fp8", ComparisonSettings())


def test_duplicate_names_are_rejected(make_run):
  a = make_run("x", np.full(3, 1.0))
  with pytest.raises(ValueError, match="NAME=PATH"):
    build_report([a, a], "x", ComparisonSettings())


def test_table_lists_baseline_first(three_runs):
  table = loss_table(build_report(three_runs, "nvfp4", ComparisonSettings()))
  rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| run")]
  assert rows[0].startswith("| nvfp4 | baseline")
  assert len(rows) == 3


def test_cli_writes_report_and_prints_table(tmp_path, three_runs, capsys):
  args = [f"{r.name}={r.path}" for r in three_runs]
  out = tmp_path / "cli"
  assert cli.main([*args, "--baseline", "bf16", "--out", str(out), "--smooth", "5", "--window-start", "10",
                   "--band-rel", "0.02", "--drift-rel", "0.05", "--contention-cores", "0.5"]) == 0  # fmt: skip
  printed = capsys.readouterr().out
  assert "| bf16 | baseline" in printed and "| nvfp4 | ok |" in printed
  assert "- **nvfp4**: ok: smoothed final training loss +0.030 nats" in printed and "2% band" in printed
  report = read_report(out / "report.json")
  assert report.settings.smooth == 5 and report.settings.window_start == 10
  assert (report.settings.band_rel, report.settings.drift_rel, report.settings.contention_cores) == (0.02, 0.05, 0.5)
  assert all(c.loss_gap.window_start_step == 10 for c in report.comparisons)


def test_cli_bad_input_exits_2(tmp_path, three_runs, capsys):
  args = [f"{r.name}={r.path}" for r in three_runs]
  assert cli.main([*args, "--baseline", "nope", "--out", str(tmp_path)]) == 2
  assert "nope" in capsys.readouterr().err
  assert cli.main([str(tmp_path / "missing"), args[0], "--baseline", "bf16"]) == 2
  assert cli.main([args[0], "--baseline", "bf16"]) == 2  # one run is not a comparison
  assert cli.main([*args, "--baseline", "bf16", "--smooth", "0", "--out", str(tmp_path)]) == 2
  capsys.readouterr()
  bands = ["--band-rel", "0.05", "--drift-rel", "0.01"]
  assert cli.main([*args, "--baseline", "bf16", *bands, "--out", str(tmp_path)]) == 2
  assert "drift_rel=0.01 must be >= band_rel=0.05" in capsys.readouterr().err


def test_cli_prints_schema(capsys):
  assert cli.main(["--print-schema"]) == 0
  assert json.loads(capsys.readouterr().out)["title"] == "Report"
