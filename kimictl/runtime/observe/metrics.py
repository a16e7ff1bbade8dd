"""vLLM /metrics, one import away: Prometheus text -> snapshots -> windowed figures -> pollers.

The parts live in names (metric families), prometheus (the text parser, histograms), snapshot,
window (the window math that `kimictl monitor` and `kimictl bench`'s server-side view share),
scrape (GET /metrics) and poller (endpoint state and the watch loop); this module re-exports them.
"""

from __future__ import annotations

from kimictl.runtime.observe.names import COUNTERS as COUNTERS
from kimictl.runtime.observe.names import E2E_LATENCY as E2E_LATENCY
from kimictl.runtime.observe.names import GAUGES as GAUGES
from kimictl.runtime.observe.names import GENERATION_TOKENS as GENERATION_TOKENS
from kimictl.runtime.observe.names import HISTOGRAMS as HISTOGRAMS
from kimictl.runtime.observe.names import INTER_TOKEN_LATENCY as INTER_TOKEN_LATENCY
from kimictl.runtime.observe.names import KV_CACHE_USAGE as KV_CACHE_USAGE
from kimictl.runtime.observe.names import NUM_PREEMPTIONS as NUM_PREEMPTIONS
from kimictl.runtime.observe.names import PROMPT_TOKENS as PROMPT_TOKENS
from kimictl.runtime.observe.names import REQUEST_QUEUE_TIME as REQUEST_QUEUE_TIME
from kimictl.runtime.observe.names import REQUEST_SUCCESS as REQUEST_SUCCESS
from kimictl.runtime.observe.names import REQUESTS_RUNNING as REQUESTS_RUNNING
from kimictl.runtime.observe.names import REQUESTS_WAITING as REQUESTS_WAITING
from kimictl.runtime.observe.names import SPEC_ACCEPTED_PER_POS as SPEC_ACCEPTED_PER_POS
from kimictl.runtime.observe.names import SPEC_ACCEPTED_TOKENS as SPEC_ACCEPTED_TOKENS
from kimictl.runtime.observe.names import SPEC_DRAFT_TOKENS as SPEC_DRAFT_TOKENS
from kimictl.runtime.observe.names import SPEC_DRAFTS as SPEC_DRAFTS
from kimictl.runtime.observe.names import TIME_PER_OUTPUT_TOKEN as TIME_PER_OUTPUT_TOKEN
from kimictl.runtime.observe.names import TIME_TO_FIRST_TOKEN as TIME_TO_FIRST_TOKEN
from kimictl.runtime.observe.poller import CHART_WINDOW_S as CHART_WINDOW_S
from kimictl.runtime.observe.poller import EndpointPoller as EndpointPoller
from kimictl.runtime.observe.poller import EndpointStatus as EndpointStatus
from kimictl.runtime.observe.poller import EndpointView as EndpointView
from kimictl.runtime.observe.poller import HistoryPoint as HistoryPoint
from kimictl.runtime.observe.poller import ab_pair_of as ab_pair_of
from kimictl.runtime.observe.poller import append_jsonl as append_jsonl
from kimictl.runtime.observe.poller import check_record_target as check_record_target
from kimictl.runtime.observe.poller import monitor_snapshot as monitor_snapshot
from kimictl.runtime.observe.poller import none_answered as none_answered
from kimictl.runtime.observe.poller import poll_all as poll_all
from kimictl.runtime.observe.poller import watch as watch
from kimictl.runtime.observe.prometheus import Histogram as Histogram
from kimictl.runtime.observe.prometheus import Sample as Sample
from kimictl.runtime.observe.prometheus import parse_prometheus_text as parse_prometheus_text
from kimictl.runtime.observe.scrape import FilterMode as FilterMode
from kimictl.runtime.observe.scrape import MetricsScraper as MetricsScraper
from kimictl.runtime.observe.scrape import metrics_url as metrics_url
from kimictl.runtime.observe.snapshot import MetricsSnapshot as MetricsSnapshot
from kimictl.runtime.observe.snapshot import merge_snapshots as merge_snapshots
from kimictl.runtime.observe.snapshot import snapshot_from_text as snapshot_from_text
from kimictl.runtime.observe.window import HIGHER_IS_BETTER as HIGHER_IS_BETTER
from kimictl.runtime.observe.window import WINDOWS_S as WINDOWS_S
from kimictl.runtime.observe.window import MetricsSeries as MetricsSeries
from kimictl.runtime.observe.window import WindowStats as WindowStats
from kimictl.runtime.observe.window import ab_ratios as ab_ratios
from kimictl.runtime.observe.window import compute_window as compute_window
from kimictl.runtime.observe.window import format_window as format_window
from kimictl.runtime.observe.window import parse_window as parse_window
