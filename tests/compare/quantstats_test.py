# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""A run's nvfp4/ statistics read back, ranked ("where NVFP4 loses most") and drawn as a heatmap per run."""

from __future__ import annotations

import pytest

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


def test_a_baseline_with_weight_gradient_shares_alone_gets_no_ranking_and_no_heatmap(tmp_path):
  """A BF16 baseline with nvfp4_stats_interval reports only its weight gradients' zero shares (`.../wgrad/zero`):
  read back as statistics, but nothing quantized to rank or draw; the NVFP4 run's report is unchanged."""
  runs = _runs(tmp_path)
  records = [maxtext_record(s, 5.0 - 0.01 * s, run_name="bf16") for s in range(12)]
  for s in (0, 5, 10):
    records[s].update({f"nvfp4/layer_{i:02d}/mlp/wo/wgrad/{c}": 0.0 for i in range(4) for c in ("zero", "zero_channels")})
  runs[0] = read_jsonl(write_lines(tmp_path / "bf16" / "metrics.jsonl", records))
  assert sorted(runs[0].quant_stats) == [0, 5, 10] and quantstats.summarize(runs[0]) is None
  report = build_report(runs, "bf16", ComparisonSettings())
  assert [q.run for q in report.quant_stats] == ["nvfp4"]
  paths = write_report(runs, report, tmp_path / "out")
  assert "stats_nvfp4.png" in paths and not (tmp_path / "out" / "stats_bf16.png").exists()


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


def _layer_means_report(tmp_path, means: dict[int, float]):
  """The report of a run whose every GEMM operand of layer L has relative error means[L] (so that is L's mean)."""
  stats = _stats(0, hot_layer=-1)
  for name in list(stats):
    if name.endswith("/rel_error"):
      stats[name] = means[int(name.split("/")[1].removeprefix("layer_"))]
  records = [maxtext_record(s, 5.0, run_name="run") for s in range(3)]
  records[0].update(stats)
  base = [maxtext_record(s, 5.0, run_name="b") for s in range(3)]
  runs = [read_jsonl(write_lines(tmp_path / "b" / "m.jsonl", base)),
          read_jsonl(write_lines(tmp_path / "run" / "m.jsonl", records))]
  report = build_report(runs, "b", ComparisonSettings())
  return report.quant_stats[0], markdown_report(report)


def test_a_layer_0_4_percent_above_the_others_is_no_finding_even_beyond_their_tiny_spread(tmp_path):
  """`make quickstart`'s report: layer 0 at 0.09839 against a median layer of 0.09804, the other layers spread over
  0.00039. It exceeds the others' median (0.09790) by more than that spread, but by 0.5%: no material excess, so no
  layer stands out and no key is advised; the report says why, with the margin."""
  summary, text = _layer_means_report(tmp_path, {0: 0.09839, 1: 0.09779, 2: 0.09790, 3: 0.09818})
  assert summary.median_layer_mean_rel_error == pytest.approx(0.09804)
  assert summary.others_spread == pytest.approx(0.00039) and summary.others_median == pytest.approx(0.09790)
  assert 0.09839 - 0.09790 > summary.others_spread  # the spread alone would have called it a finding
  assert summary.worst_layer == 0 and summary.stands_out is False and summary.try_key is None
  assert "No layer stands out: layer 0" in text and "0.5% above their median" in text
  assert "by more than their spread and by more than 10%" in text and "nvfp4_bf16_layers" not in text


@pytest.mark.parametrize(
    "means, stands_out",
    [({0: 0.09779, 1: 0.09790, 2: 0.115, 3: 0.09818}, True),  # 17% above the others, far beyond their spread
     ({0: 0.08, 1: 0.10, 2: 0.13, 3: 0.115}, False)],  # 30% above their median, but inside their 0.035 spread
)  # fmt: skip
def test_a_layer_stands_out_only_when_it_exceeds_the_others_both_by_their_spread_and_materially(tmp_path, means,
                                                                                                 stands_out):
  summary, text = _layer_means_report(tmp_path, means)
  assert summary.worst_layer == 2 and summary.stands_out is stands_out
  assert (summary.try_key == "nvfp4_bf16_layers=[2]") is stands_out and ("`nvfp4_bf16_layers=[2]`" in text) is stands_out
  assert ("Layer 2 has the largest mean relative error" in text) is stands_out


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
