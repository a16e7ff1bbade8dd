"""Bench reports, one import away: summaries (summary), A/B comparison (ab), CSV and plots
(exports) and the whole bench run (bench); this module re-exports them."""

from __future__ import annotations

from kimictl.runtime.load.ab import AB_METRICS, HEADLINE, compare
from kimictl.runtime.load.bench import BenchConfig, BenchOutcome, resolve_models, run_bench
from kimictl.runtime.load.exports import write_csv, write_plots
from kimictl.runtime.load.summary import (
    PERCENTILES,
    percentile,
    slo_stats,
    summarize,
    summarize_run,
)

__all__ = [
    "AB_METRICS",
    "BenchConfig",
    "BenchOutcome",
    "HEADLINE",
    "PERCENTILES",
    "compare",
    "percentile",
    "resolve_models",
    "run_bench",
    "slo_stats",
    "summarize",
    "summarize_run",
    "write_csv",
    "write_plots",
]
