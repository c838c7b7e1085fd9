# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""A run's nvfp4/ statistics read back, ranked ("where NVFP4 loses most") and drawn as a heatmap per run."""

from __future__ import annotations

from MaxText.compare import quantstats
from MaxText.compare.metrics import read_jsonl
from MaxText.compare.report import build_report, markdown_report, read_report, write_report
from MaxText.compare.schema import ComparisonSettings
from tests.compare.conftest import maxtext_record, write_lines

_OPERANDS = ("fprop_x", "fprop_w", "dgrad_dy", "wgrad_x", "wgrad_dy")


def _stats(step: int, hot_layer: int) -> dict[str, float]:
  """Statistics of 4 layers x (wi_0, wo) x 5 operands; `hot_layer`'s wo/dgrad_dy loses most."""
  out = {}
  for layer in range(4):
    for gemm in ("wi_0", "wo"):
      for i, operand in enumerate(_OPERANDS):
        rel = 0.09 + 0.001 * i + (0.2 if (layer, gemm, operand) == (hot_layer, "wo", "dgrad_dy") else 0.0)
        base = f"nvfp4/layer_{layer:02d}/mlp/{gemm}/{operand}"
        out.update({f"{base}/rel_error": rel + 0.0001 * step, f"{base}/underflow": 0.05, f"{base}/amax": 3.0,
                    f"{base}/subnormal_scales": 0.0})
  return out


def _runs(tmp_path):
  base = write_lines(tmp_path / "bf16" / "metrics.jsonl",
                     [maxtext_record(s, 5.0 - 0.01 * s, run_name="bf16") for s in range(12)])
  records = [maxtext_record(s, 5.0 - 0.01 * s, run_name="nvfp4") for s in range(12)]
  for s in (0, 5, 10):
    records[s].update(_stats(s, hot_layer=2))
  cand = write_lines(tmp_path / "nvfp4" / "metrics.jsonl", records)
  return [read_jsonl(base), read_jsonl(cand)]


def test_statistics_are_read_per_statistics_step(tmp_path):
  base, cand = _runs(tmp_path)
  assert not base.quant_stats and sorted(cand.quant_stats) == [0, 5, 10]
  assert len(cand.quant_stats[10]) == 4 * 2 * 5 * 4
  assert quantstats.parse_name("nvfp4/layer_03/mlp/wo/wgrad_dy/underflow") == (3, "mlp/wo", "wgrad_dy", "underflow")
  assert quantstats.parse_name("learning/loss") is None


def test_where_nvfp4_loses_most_names_the_layer_and_the_key_to_try(tmp_path):
  runs = _runs(tmp_path)
  report = build_report(runs, "bf16", ComparisonSettings())
  (summary,) = report.quant_stats
  assert (summary.run, summary.step, summary.statistics) == ("nvfp4", 10, 160)
  top = summary.worst[0]
  assert (top.layer, top.gemm, top.operand) == (2, "mlp/wo", "dgrad_dy") and top.underflow == 0.05
  assert summary.worst_layer == 2 and summary.try_key == "nvfp4_bf16_layers=[2]"
  text = markdown_report(report)
  assert "## Where NVFP4 loses most" in text and "`nvfp4_bf16_layers=[2]`" in text
  assert "| 2 | mlp/wo | dgrad_dy | 0.2930 | 5.00% |" in text
  paths = write_report(runs, report, tmp_path / "out")
  heatmap = paths["stats_nvfp4.png"]
  assert heatmap.stat().st_size > 10_000 and not (tmp_path / "out" / "stats_bf16.png").exists()
  assert read_report(paths["report.json"]).quant_stats[0].worst_layer == 2


def test_no_layer_is_recommended_when_none_stands_out(tmp_path):
  """Layers whose mean relative errors differ by less than their own spread (layer 3 0.4% above the median, as the
  quickstart's layer 0 was): the report says no layer stands out and recommends no key."""
  records = [maxtext_record(s, 5.0, run_name="flat") for s in range(3)]
  stats = _stats(0, hot_layer=-1)
  for name in list(stats):
    if name.endswith("/rel_error"):
      layer = int(name.split("/")[1].removeprefix("layer_"))
      stats[name] += 0.0004 * layer  # layer 3 the worst, by 0.0004 over the median, inside the 0.0008 spread
  records[0].update(stats)
  base = [maxtext_record(s, 5.0, run_name="b") for s in range(3)]
  runs = [read_jsonl(write_lines(tmp_path / "b" / "m.jsonl", base)),
          read_jsonl(write_lines(tmp_path / "flat" / "m.jsonl", records))]
  report = build_report(runs, "b", ComparisonSettings())
  (summary,) = report.quant_stats
  assert summary.worst_layer == 3 and summary.stands_out is False and summary.try_key is None
  assert summary.others_spread is not None and summary.others_spread > 0
  assert "No layer stands out: layer 3" in markdown_report(report) and "nvfp4_bf16_layers" not in markdown_report(report)


def test_with_two_layers_no_layer_is_judged_to_stand_out(tmp_path):
  """Two layers, one far worse: with a single other layer there is no spread to judge a difference by, so the report
  neither says the layer stands out nor recommends a key."""
  records = [maxtext_record(s, 5.0, run_name="two") for s in range(3)]
  records[0].update({name: value for name, value in _stats(0, hot_layer=1).items()
                     if name.startswith(("nvfp4/layer_00/", "nvfp4/layer_01/"))})
  base = [maxtext_record(s, 5.0, run_name="b") for s in range(3)]
  runs = [read_jsonl(write_lines(tmp_path / "b" / "m.jsonl", base)),
          read_jsonl(write_lines(tmp_path / "two" / "m.jsonl", records))]
  (summary,) = build_report(runs, "b", ComparisonSettings()).quant_stats
  assert summary.worst_layer == 1 and summary.others_spread is None
  assert summary.stands_out is None and summary.try_key is None
