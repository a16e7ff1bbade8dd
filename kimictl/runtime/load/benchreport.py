"""Bench reports, one import away: summaries (summary), A/B comparison (ab), CSV and plots
(exports) and the whole bench run (bench); this module re-exports them."""

from __future__ import annotations

from kimictl.runtime.load.ab import AB_METRICS as AB_METRICS
from kimictl.runtime.load.ab import HEADLINE as HEADLINE
from kimictl.runtime.load.ab import NOT_MEASURED as NOT_MEASURED
from kimictl.runtime.load.ab import compare as compare
from kimictl.runtime.load.bench import BenchConfig as BenchConfig
from kimictl.runtime.load.bench import BenchOutcome as BenchOutcome
from kimictl.runtime.load.bench import resolve_models as resolve_models
from kimictl.runtime.load.bench import run_bench as run_bench
from kimictl.runtime.load.exports import write_csv as write_csv
from kimictl.runtime.load.exports import write_plots as write_plots
from kimictl.runtime.load.summary import PERCENTILES as PERCENTILES
from kimictl.runtime.load.summary import percentile as percentile
from kimictl.runtime.load.summary import slo_stats as slo_stats
from kimictl.runtime.load.summary import summarize as summarize
from kimictl.runtime.load.summary import summarize_run as summarize_run
