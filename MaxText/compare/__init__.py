# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Compare training runs against a baseline (`python -m MaxText.compare RUN ... --baseline NAME`).

Layers, one way: metrics (read JSONL/TensorBoard) -> analysis (maths) -> report (files, table) and plots; schema
holds report.json's pydantic models.
"""

from MaxText.compare.analysis import compare, summarize_run
from MaxText.compare.metrics import RunMetrics, load_run
from MaxText.compare.report import build_report, read_report, write_report
from MaxText.compare.schema import SCHEMA_VERSION, ComparisonSettings, Report

__all__ = [
    "SCHEMA_VERSION",
    "Report",
    "RunMetrics",
    "ComparisonSettings",
    "build_report",
    "compare",
    "load_run",
    "read_report",
    "summarize_run",
    "write_report",
]
