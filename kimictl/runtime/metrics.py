"""vLLM /metrics: Prometheus text -> typed samples -> snapshots -> windowed figures.

The single source of truth for vLLM metric family names (the constants below) and for the window
math that `kimictl monitor` and `kimictl bench`'s server-side view share.

Every figure is WINDOWED: the difference of two cumulative snapshots (counters and histogram
buckets), never a since-server-start average. Quantiles are read from the bucket deltas with
Prometheus' `histogram_quantile` interpolation, so they are only as fine as vLLM's bucket bounds.

Interactivity (tokens/s/user) is 1 / TPOT per request, so its percentiles mirror TPOT's:
`interactivity_p10 = 1 / tpot_p90` (the slow tail an SLO protects) and
`interactivity_p90 = 1 / tpot_p10` (the optimistic tail).

Several engines (label `engine`) or replicas are merged by summing counters and buckets, never by
averaging percentiles. A counter that goes down means the server restarted: the delta of that pair
is the new value (counted from zero), and the window says `resets > 0`.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import os
import re
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

import httpx

from kimictl.runtime.errors import EndpointError, InputError

__all__ = [
    "CHART_WINDOW_S",
    "COUNTERS",
    "E2E_LATENCY",
    "GAUGES",
    "GENERATION_TOKENS",
    "HISTOGRAMS",
    "INTER_TOKEN_LATENCY",
    "KV_CACHE_USAGE",
    "NUM_PREEMPTIONS",
    "PROMPT_TOKENS",
    "REQUESTS_RUNNING",
    "REQUESTS_WAITING",
    "REQUEST_QUEUE_TIME",
    "REQUEST_SUCCESS",
    "SPEC_ACCEPTED_PER_POS",
    "SPEC_ACCEPTED_TOKENS",
    "SPEC_DRAFTS",
    "SPEC_DRAFT_TOKENS",
    "TIME_PER_OUTPUT_TOKEN",
    "TIME_TO_FIRST_TOKEN",
    "HIGHER_IS_BETTER",
    "WINDOWS_S",
    "append_jsonl",
    "check_record_target",
    "format_window",
    "parse_window",
    "REFUSED",
    "REFUSED_GIVE_UP_S",
    "EndpointPoller",
    "EndpointStatus",
    "EndpointView",
    "Histogram",
    "HistoryPoint",
    "MetricsSeries",
    "MetricsSnapshot",
    "Sample",
    "WindowStats",
    "ab_pair_of",
    "ab_ratios",
    "compute_window",
    "merge_snapshots",
    "metrics_url",
    "none_answered",
    "monitor_snapshot",
    "parse_prometheus_text",
    "poll_all",
    "scrape",
    "watch",
    "snapshot_from_text",
]

# --- vLLM (V1, 0.33) metric families: the one place these names live ------------------------
# Gauges.
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # a fraction 0..1 despite the name
# Counters (exposed with a `_total` suffix).
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"  # label finished_reason; summed
NUM_PREEMPTIONS = "vllm:num_preemptions"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"  # label position
# Histograms (seconds).
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
TIME_PER_OUTPUT_TOKEN = "vllm:request_time_per_output_token_seconds"  # per request: 1/interactivity
E2E_LATENCY = "vllm:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME = "vllm:request_queue_time_seconds"

GAUGES = (REQUESTS_RUNNING, REQUESTS_WAITING, KV_CACHE_USAGE)
COUNTERS = (
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    REQUEST_SUCCESS,
    NUM_PREEMPTIONS,
    SPEC_DRAFTS,
    SPEC_DRAFT_TOKENS,
    SPEC_ACCEPTED_TOKENS,
)
HISTOGRAMS = (
    TIME_TO_FIRST_TOKEN,
    INTER_TOKEN_LATENCY,
    TIME_PER_OUTPUT_TOKEN,
    E2E_LATENCY,
    REQUEST_QUEUE_TIME,
)
# Families a vLLM server always exposes; absent ones are reported in `WindowStats.missing`.
# (The spec-decode counters exist only when speculation is configured: not "missing" otherwise.)
_EXPECTED = (*GAUGES, PROMPT_TOKENS, GENERATION_TOKENS, REQUEST_SUCCESS, *HISTOGRAMS)
_PROCESS_START = "process_start_time_seconds"


# --- Prometheus text exposition -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sample:
    """One line of Prometheus text: `name{labels} value [timestamp_ms]`."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str, default: str = "") -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return default


_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r"\\[\\\"n]")


def _parse_value(text: str) -> float:
    # float() already accepts NaN, +Inf, -Inf, Inf
    return float(text)


def _parse_line(line: str) -> Sample | None:
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        close = line.rfind("}")
        if close < brace:
            return None
        body = line[brace + 1 : close]
        rest = line[close + 1 :].split()
        labels: list[tuple[str, str]] = []
        pos = 0
        while pos < len(body):
            match = _LABEL_RE.match(body, pos)
            if match is None:
                if body[pos:].strip():
                    return None
                break
            value = match.group(2)
            if "\\" in value:
                value = _ESCAPE_RE.sub(lambda m: _UNESCAPE[m.group(0)], value)
            labels.append((match.group(1), value))
            pos = match.end()
        label_tuple = tuple(labels)
    else:
        parts = line.split()
        if len(parts) < 2:
            return None
        name, rest = parts[0], parts[1:]
        label_tuple = ()
    if not rest:
        return None
    try:
        value = _parse_value(rest[0])
    except ValueError:
        return None
    return Sample(name, label_tuple, value)


def parse_prometheus_text(
    text: str, *, prefixes: tuple[str, ...] | None = None
) -> tuple[list[Sample], dict[str, str]]:
    """Parse Prometheus text format 0.0.4 into samples and `# TYPE` declarations.

    Malformed lines are skipped (a scrape is never lost to one odd line). With `prefixes`, only
    samples whose name starts with one of them are parsed (the fast path of the poller).
    """
    samples: list[Sample] = []
    types: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        if prefixes is not None and not line.startswith(prefixes):
            continue
        sample = _parse_line(line)
        if sample is not None:
            samples.append(sample)
    return samples, types


# --- histograms ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative bucket counts (`le` upper bounds, ascending, last = +Inf), count and sum."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float
    sum: float

    def minus(self, older: Histogram) -> Histogram:
        """Bucket-wise difference (caller has ruled out a reset)."""
        return Histogram(
            self.bounds,
            tuple(a - b for a, b in zip(self.cumulative, older.cumulative, strict=True)),
            self.count - older.count,
            self.sum - older.sum,
        )

    def plus(self, other: Histogram) -> Histogram:
        if other.bounds != self.bounds:
            raise ValueError("cannot add histograms with different bucket bounds")
        return Histogram(
            self.bounds,
            tuple(a + b for a, b in zip(self.cumulative, other.cumulative, strict=True)),
            self.count + other.count,
            self.sum + other.sum,
        )

    def went_down(self, older: Histogram) -> bool:
        if self.count < older.count:
            return True
        return any(a < b for a, b in zip(self.cumulative, older.cumulative, strict=True))

    def quantile(self, q: float) -> float | None:
        """Prometheus `histogram_quantile`: linear interpolation inside the bucket.

        None when the histogram is empty. A quantile in the +Inf bucket returns the largest finite
        bound (the true value is somewhere above it).
        """
        total = self.cumulative[-1] if self.cumulative else 0.0
        if total <= 0 or not 0.0 <= q <= 1.0:
            return None
        rank = q * total
        idx = bisect.bisect_left(self.cumulative, rank)
        idx = min(idx, len(self.cumulative) - 1)
        upper = self.bounds[idx]
        if math.isinf(upper):
            finite = [b for b in self.bounds if not math.isinf(b)]
            return finite[-1] if finite else None
        lower = self.bounds[idx - 1] if idx > 0 else 0.0
        below = self.cumulative[idx - 1] if idx > 0 else 0.0
        in_bucket = self.cumulative[idx] - below
        if in_bucket <= 0:
            return upper
        if idx == 0 and upper <= 0:
            return upper
        return lower + (upper - lower) * (rank - below) / in_bucket

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


# --- snapshots --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One scrape of one endpoint, engines merged. Cumulative values as the server reported them.

    `taken_at` is wall-clock (for display and records), `monotonic` orders and times windows.
    Absent families are absent from the mappings (never zero-filled).
    """

    taken_at: float
    monotonic: float
    gauges: Mapping[str, float]
    counters: Mapping[str, float]
    histograms: Mapping[str, Histogram]
    accepted_per_pos: tuple[float, ...] = ()
    process_start: float | None = None
    engines: int = 1
    models: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "taken_at": self.taken_at,
            "gauges": dict(self.gauges),
            "counters": dict(self.counters),
            "histograms": {
                k: {
                    "bounds": list(h.bounds),
                    "cumulative": list(h.cumulative),
                    "count": h.count,
                    "sum": h.sum,
                }
                for k, h in self.histograms.items()
            },
            "engines": self.engines,
            "models": list(self.models),
        }


# Only the samples a snapshot uses get parsed (vLLM exposes ~900 lines; about 130 are needed).
_SNAPSHOT_PREFIXES = (
    _PROCESS_START,
    *(g + "{" for g in GAUGES),
    *(g + " " for g in GAUGES),
    *(c + "_total" for c in (*COUNTERS, SPEC_ACCEPTED_PER_POS)),
    *(h + "_bucket" for h in HISTOGRAMS),
    *(h + "_count" for h in HISTOGRAMS),
    *(h + "_sum" for h in HISTOGRAMS),
)


_LINE_RE = re.compile(r"([^{\s]+)(?:\{(.*)\})?\s+(\S+)")
_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class _Fast:
    name: str
    labels: dict[str, str]
    value: float


def _wanted_samples(text: str) -> list[_Fast]:
    """The samples a snapshot needs, parsed with two C-level regex calls per line (the poller's
    hot path: ~130 of ~900 lines, see benchmarks/RESULTS.md#monitor)."""
    out: list[_Fast] = []
    for line in text.splitlines():
        if not line.startswith(_SNAPSHOT_PREFIXES):
            continue
        match = _LINE_RE.match(line)
        if match is None:
            continue
        name, body, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        labels: dict[str, str] = {}
        if body:
            for key, val in _PAIR_RE.findall(body):
                if "\\" in val:
                    val = _ESCAPE_RE.sub(lambda m: _UNESCAPE[m.group(0)], val)
                labels[key] = val
        out.append(_Fast(name, labels, value))
    return out


def snapshot_from_text(
    text: str,
    *,
    taken_at: float | None = None,
    monotonic: float | None = None,
    model: str | None = None,
) -> MetricsSnapshot:
    """Build a snapshot from /metrics text, summing over engines (and finished_reason etc.).

    `model` keeps only samples whose `model_name` label equals it (samples without the label stay).
    """
    samples = _wanted_samples(text)
    gauge_sum: dict[str, float] = {}
    gauge_n: dict[str, int] = {}
    counters: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    h_count: dict[str, float] = {}
    h_sum: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    engines: set[str] = set()
    models: set[str] = set()
    process_start: float | None = None
    gauge_names = set(GAUGES)
    counter_names = {c + "_total": c for c in COUNTERS}
    hist_names = set(HISTOGRAMS)
    per_pos_name = SPEC_ACCEPTED_PER_POS + "_total"

    for s in samples:
        name = s.name
        if name == _PROCESS_START:
            process_start = s.value
            continue
        if model is not None:
            m = s.labels.get("model_name", model)
            if m != model:
                continue
        if math.isnan(s.value):
            continue
        engine = s.labels.get("engine", "")
        if engine:
            engines.add(engine)
        mn = s.labels.get("model_name", "")
        if mn:
            models.add(mn)
        if name in gauge_names:
            gauge_sum[name] = gauge_sum.get(name, 0.0) + s.value
            gauge_n[name] = gauge_n.get(name, 0) + 1
        elif name in counter_names:
            fam = counter_names[name]
            counters[fam] = counters.get(fam, 0.0) + s.value
        elif name == per_pos_name:
            try:
                pos = int(s.labels.get("position", "-1"))
            except ValueError:
                continue
            if pos >= 0:
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
        elif name.endswith("_bucket"):
            fam = name[: -len("_bucket")]
            if fam in hist_names:
                le = s.labels.get("le", "")
                try:
                    bound = float(le)
                except ValueError:
                    continue
                fb = buckets.setdefault(fam, {})
                fb[bound] = fb.get(bound, 0.0) + s.value
        elif name.endswith("_count"):
            fam = name[: -len("_count")]
            if fam in hist_names:
                h_count[fam] = h_count.get(fam, 0.0) + s.value
        elif name.endswith("_sum"):
            fam = name[: -len("_sum")]
            if fam in hist_names:
                h_sum[fam] = h_sum.get(fam, 0.0) + s.value

    gauges = {}
    for g, total in gauge_sum.items():
        # KV usage is a per-engine fraction: merged as the mean; request counts add up.
        gauges[g] = total / gauge_n[g] if g == KV_CACHE_USAGE else total
    histograms = {}
    for fam, fb in buckets.items():
        bounds = tuple(sorted(fb))
        cumulative = tuple(fb[b] for b in bounds)
        count = h_count.get(fam, cumulative[-1] if cumulative else 0.0)
        histograms[fam] = Histogram(bounds, cumulative, count, h_sum.get(fam, 0.0))
    accepted = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return MetricsSnapshot(
        taken_at=time.time() if taken_at is None else taken_at,
        monotonic=time.monotonic() if monotonic is None else monotonic,
        gauges=gauges,
        counters=counters,
        histograms=histograms,
        accepted_per_pos=accepted,
        process_start=process_start,
        engines=max(1, len(engines)),
        models=tuple(sorted(models)),
    )


def merge_snapshots(snapshots: Sequence[MetricsSnapshot]) -> MetricsSnapshot:
    """Merge replicas scraped at (about) the same time: sum counters, buckets and request gauges.

    KV cache usage becomes the mean. Histograms whose bucket bounds differ between replicas
    cannot be summed and are dropped (they then show up as missing).
    """
    if not snapshots:
        raise ValueError("merge_snapshots needs at least one snapshot")
    if len(snapshots) == 1:
        return snapshots[0]
    gauges: dict[str, float] = {}
    kv: list[float] = []
    counters: dict[str, float] = {}
    histograms: dict[str, Histogram] = {}
    dropped: set[str] = set()
    per_pos: list[float] = []
    for snap in snapshots:
        for k, v in snap.gauges.items():
            if k == KV_CACHE_USAGE:
                kv.append(v)
            else:
                gauges[k] = gauges.get(k, 0.0) + v
        for k, v in snap.counters.items():
            counters[k] = counters.get(k, 0.0) + v
        for k, h in snap.histograms.items():
            if k in dropped:
                continue
            if k not in histograms:
                histograms[k] = h
            elif histograms[k].bounds == h.bounds:
                histograms[k] = histograms[k].plus(h)
            else:
                dropped.add(k)
                del histograms[k]
        for i, v in enumerate(snap.accepted_per_pos):
            if i >= len(per_pos):
                per_pos.append(0.0)
            per_pos[i] += v
    if kv:
        gauges[KV_CACHE_USAGE] = sum(kv) / len(kv)
    starts = [s.process_start for s in snapshots if s.process_start is not None]
    return MetricsSnapshot(
        taken_at=max(s.taken_at for s in snapshots),
        monotonic=max(s.monotonic for s in snapshots),
        gauges=gauges,
        counters=counters,
        histograms=histograms,
        accepted_per_pos=tuple(per_pos),
        # a restart of any replica changes the sum of start times (reset detection)
        process_start=sum(starts) if len(starts) == len(snapshots) else None,
        engines=sum(s.engines for s in snapshots),
        models=tuple(sorted({m for s in snapshots for m in s.models})),
    )


# --- windows ------------------------------------------------------------------------------------
def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _inv(seconds: float | None) -> float | None:
    if seconds is None or seconds <= 0:
        return None
    return 1.0 / seconds


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Figures over one window (between two snapshots). None = no data in the window.

    interactivity_pXX are tokens/s/user percentiles over the requests that FINISHED in the window:
    interactivity_p10 = 1 / tpot_p90 (the slow tail), interactivity_p90 = 1 / tpot_p10.
    Gauges (running, waiting, kv_cache_usage) are the newest snapshot's values.
    """

    window_s: float
    ended_at: float
    tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    request_rate: float | None = None
    requests_finished: float | None = None
    interactivity_p10: float | None = None
    interactivity_p50: float | None = None
    interactivity_p90: float | None = None
    tpot_p10_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p90_ms: float | None = None
    tpot_mean_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p90_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p90_ms: float | None = None
    queue_p90_ms: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    preemptions: float | None = None
    spec_acceptance_length: float | None = None
    spec_acceptance_rate: float | None = None
    spec_acceptance_per_pos: tuple[float, ...] = ()
    resets: int = 0
    missing: tuple[str, ...] = ()
    engines: int = 1

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, float) and not math.isfinite(value):
                value = None
            out[name] = value
        return out


def _counter_delta(
    old: MetricsSnapshot, new: MetricsSnapshot, name: str, reset: bool
) -> float | None:
    if name not in new.counters:
        return None
    if reset:
        return new.counters[name]
    if name not in old.counters:
        return None
    d = new.counters[name] - old.counters[name]
    return new.counters[name] if d < 0 else d


def _is_reset(old: MetricsSnapshot, new: MetricsSnapshot) -> bool:
    """A server restart between the two scrapes: start time changed or any counter went down."""
    if old.process_start is not None and new.process_start is not None:
        if new.process_start != old.process_start:
            return True
    for k, v in new.counters.items():
        if k in old.counters and v < old.counters[k]:
            return True
    for k, h in new.histograms.items():
        o = old.histograms.get(k)
        if o is not None and o.bounds == h.bounds and h.went_down(o):
            return True
    return False


def _hist_delta(
    old: MetricsSnapshot, new: MetricsSnapshot, name: str, reset: bool
) -> Histogram | None:
    h = new.histograms.get(name)
    if h is None:
        return None
    if reset:
        return h
    o = old.histograms.get(name)
    if o is None:
        return None
    if o.bounds != h.bounds:
        return h  # new bucket layout: the server changed under us; count from zero
    return h.minus(o)


def _delta_snapshot(
    old: MetricsSnapshot, new: MetricsSnapshot, *, detect_reset: bool = True
) -> tuple[MetricsSnapshot, bool]:
    """The cumulative-looking difference new - old (reset-aware), as a snapshot."""
    reset = detect_reset and _is_reset(old, new)
    counters = {}
    for k in new.counters:
        d = _counter_delta(old, new, k, reset)
        if d is not None:
            counters[k] = d
    histograms = {}
    for k in new.histograms:
        dh = _hist_delta(old, new, k, reset)
        if dh is not None:
            histograms[k] = dh
    if reset or len(old.accepted_per_pos) != len(new.accepted_per_pos):
        per_pos = new.accepted_per_pos
    else:
        per_pos = tuple(
            max(0.0, a - b) for a, b in zip(new.accepted_per_pos, old.accepted_per_pos, strict=True)
        )
    snap = replace(new, counters=counters, histograms=histograms, accepted_per_pos=per_pos)
    return snap, reset


def _stats_from_delta(
    delta: MetricsSnapshot, newest: MetricsSnapshot, window_s: float, resets: int
) -> WindowStats:
    def rate(name: str) -> float | None:
        v = delta.counters.get(name)
        if v is None or window_s <= 0:
            return None
        return v / window_s

    def q(name: str, quant: float) -> float | None:
        h = delta.histograms.get(name)
        return None if h is None else h.quantile(quant)

    tpot = delta.histograms.get(TIME_PER_OUTPUT_TOKEN)
    tpot_p10 = q(TIME_PER_OUTPUT_TOKEN, 0.10)
    tpot_p50 = q(TIME_PER_OUTPUT_TOKEN, 0.50)
    tpot_p90 = q(TIME_PER_OUTPUT_TOKEN, 0.90)

    drafts = delta.counters.get(SPEC_DRAFTS)
    draft_tokens = delta.counters.get(SPEC_DRAFT_TOKENS)
    accepted = delta.counters.get(SPEC_ACCEPTED_TOKENS)
    spec_len = 1.0 + accepted / drafts if drafts and accepted is not None else None
    spec_rate = accepted / draft_tokens if draft_tokens and accepted is not None else None
    per_pos = tuple(a / drafts for a in delta.accepted_per_pos) if drafts else ()

    missing = tuple(
        f
        for f in _EXPECTED
        if f not in newest.gauges and f not in newest.counters and f not in newest.histograms
    )
    return WindowStats(
        window_s=window_s,
        ended_at=newest.taken_at,
        tokens_per_s=rate(GENERATION_TOKENS),
        prompt_tokens_per_s=rate(PROMPT_TOKENS),
        request_rate=rate(REQUEST_SUCCESS),
        requests_finished=delta.counters.get(REQUEST_SUCCESS),
        interactivity_p10=_inv(tpot_p90),
        interactivity_p50=_inv(tpot_p50),
        interactivity_p90=_inv(tpot_p10),
        tpot_p10_ms=_ms(tpot_p10),
        tpot_p50_ms=_ms(tpot_p50),
        tpot_p90_ms=_ms(tpot_p90),
        tpot_mean_ms=_ms(tpot.mean) if tpot is not None else None,
        ttft_p50_ms=_ms(q(TIME_TO_FIRST_TOKEN, 0.50)),
        ttft_p90_ms=_ms(q(TIME_TO_FIRST_TOKEN, 0.90)),
        ttft_p99_ms=_ms(q(TIME_TO_FIRST_TOKEN, 0.99)),
        itl_p50_ms=_ms(q(INTER_TOKEN_LATENCY, 0.50)),
        itl_p90_ms=_ms(q(INTER_TOKEN_LATENCY, 0.90)),
        itl_p99_ms=_ms(q(INTER_TOKEN_LATENCY, 0.99)),
        e2e_p50_ms=_ms(q(E2E_LATENCY, 0.50)),
        e2e_p90_ms=_ms(q(E2E_LATENCY, 0.90)),
        queue_p90_ms=_ms(q(REQUEST_QUEUE_TIME, 0.90)),
        running=newest.gauges.get(REQUESTS_RUNNING),
        waiting=newest.gauges.get(REQUESTS_WAITING),
        kv_cache_usage=newest.gauges.get(KV_CACHE_USAGE),
        preemptions=delta.counters.get(NUM_PREEMPTIONS),
        spec_acceptance_length=spec_len,
        spec_acceptance_rate=spec_rate,
        spec_acceptance_per_pos=per_pos,
        resets=resets,
        missing=missing,
        engines=newest.engines,
    )


def compute_window(old: MetricsSnapshot, new: MetricsSnapshot) -> WindowStats:
    """Figures between two scrapes of the same endpoint (e.g. before and after a bench run).

    A restart between them (counters went down, or a new process start time) makes the deltas
    count from zero at the restart: what happened before the restart in the window is lost, and
    `resets` is 1. For many scrapes in a row, `MetricsSeries` keeps every restart's counts.
    """
    delta, reset = _delta_snapshot(old, new)
    return _stats_from_delta(delta, new, new.monotonic - old.monotonic, 1 if reset else 0)


def _add_delta(base: MetricsSnapshot, delta: MetricsSnapshot) -> MetricsSnapshot:
    counters = dict(base.counters)
    for k, v in delta.counters.items():
        counters[k] = counters.get(k, 0.0) + v
    histograms = dict(base.histograms)
    for k, h in delta.histograms.items():
        b = histograms.get(k)
        histograms[k] = h if b is None or b.bounds != h.bounds else b.plus(h)
    if len(base.accepted_per_pos) == len(delta.accepted_per_pos):
        per_pos = tuple(
            a + b for a, b in zip(base.accepted_per_pos, delta.accepted_per_pos, strict=True)
        )
    else:
        per_pos = delta.accepted_per_pos
    return replace(delta, counters=counters, histograms=histograms, accepted_per_pos=per_pos)


@dataclass
class MetricsSeries:
    """Scrapes of one endpoint over time, with restarts stitched out.

    Each ingested scrape is turned into a monotonic "continuous" snapshot (previous continuous +
    reset-aware delta), so any window is one subtraction of two stored snapshots, however many
    restarts lie between them. Keeps `keep_s` seconds of history.
    """

    keep_s: float = 330.0
    _raw_last: MetricsSnapshot | None = None
    _points: deque[tuple[MetricsSnapshot, int]] = field(default_factory=deque)
    _resets: int = 0

    def ingest(self, snap: MetricsSnapshot) -> None:
        if self._raw_last is None or not self._points:
            self._points.append((snap, self._resets))
        else:
            delta, reset = _delta_snapshot(self._raw_last, snap)
            if reset:
                self._resets += 1
            cont = _add_delta(self._points[-1][0], delta)
            self._points.append((cont, self._resets))
        self._raw_last = snap
        horizon = snap.monotonic - self.keep_s
        while len(self._points) > 2 and self._points[1][0].monotonic <= horizon:
            self._points.popleft()

    @property
    def latest(self) -> MetricsSnapshot | None:
        return self._raw_last

    @property
    def span_s(self) -> float:
        """Seconds between the oldest and the newest kept scrape."""
        if len(self._points) < 2:
            return 0.0
        return self._points[-1][0].monotonic - self._points[0][0].monotonic

    def __len__(self) -> int:
        return len(self._points)

    def window(self, seconds: float) -> WindowStats | None:
        """Figures over the last `seconds` (less while history is short); None before 2 scrapes."""
        if len(self._points) < 2:
            return None
        newest, r_new = self._points[-1]
        target = newest.monotonic - seconds
        # the newest stored point at or before the window start, else the oldest we have
        idx = bisect.bisect_right(self._points, target + 1e-6, key=lambda p: p[0].monotonic) - 1
        idx = max(0, min(idx, len(self._points) - 2))
        oldest, r_old = self._points[idx]
        # continuous points never go down: no reset detection between them
        delta, _ = _delta_snapshot(oldest, newest, detect_reset=False)
        return _stats_from_delta(delta, newest, newest.monotonic - oldest.monotonic, r_new - r_old)


# --- polling endpoints (shared by the TUI and headless `kimictl monitor`) -------------------------
CHART_WINDOW_S = 10.0  # each history point is the figure over the 10 s before it
MAX_BACKOFF_S = 10.0
# The reason of a scrape nothing listens to (refused, or a name that does not resolve).
REFUSED = "connection refused or host unreachable"
# --once gives up this soon (one retry) when every endpoint refuses: nothing will answer.
REFUSED_GIVE_UP_S = 1.0


def scrape_timeout(interval: float) -> float:
    """A loaded server can take a while to render /metrics: allow 2 intervals (2-10 s)."""
    return max(2.0, min(2 * interval, 10.0))


STALE_AFTER_INTERVALS = 2.5
HISTORY_POINTS = 900

# Direction of "better" for the A/B ratio (tuned / stock): True = higher is better.
HIGHER_IS_BETTER: dict[str, bool] = {
    "tokens_per_s": True,
    "request_rate": True,
    "interactivity_p10": True,
    "interactivity_p50": True,
    "interactivity_p90": True,
    "spec_acceptance_length": True,
    "spec_acceptance_rate": True,
    "tpot_p50_ms": False,
    "tpot_p90_ms": False,
    "ttft_p50_ms": False,
    "ttft_p90_ms": False,
    "ttft_p99_ms": False,
    "itl_p50_ms": False,
    "itl_p90_ms": False,
    "itl_p99_ms": False,
    "e2e_p90_ms": False,
}


def metrics_url(base_url: str) -> str:
    base = base_url.rstrip("/").removesuffix("/v1")
    return base if base.endswith("/metrics") else base + "/metrics"


def _api_headers() -> dict[str, str]:
    key = os.environ.get("VLLM_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


async def scrape(
    client: httpx.AsyncClient, base_url: str, *, timeout: float, model: str | None = None
) -> MetricsSnapshot:
    """GET /metrics once and parse it. Raises EndpointError with a one-line reason."""
    url = metrics_url(base_url)
    try:
        reply = await client.get(url, timeout=timeout, headers=_api_headers())
    except httpx.ConnectError as exc:
        raise EndpointError(f"{url}: {REFUSED}") from exc
    except httpx.TimeoutException as exc:
        raise EndpointError(f"{url}: no answer within {timeout:g} s") from exc
    except httpx.HTTPError as exc:
        raise EndpointError(f"{url}: {type(exc).__name__}: {exc}") from exc
    if reply.status_code != 200:
        raise EndpointError(f"{url}: HTTP {reply.status_code}")
    snap = snapshot_from_text(reply.text, model=model)
    if not snap.gauges and not snap.counters and not snap.histograms:
        raise EndpointError(f"{url}: answered, but with no vllm: metrics (is it a vLLM server?)")
    return snap


class _KeepAliveGet:
    """A minimal keep-alive HTTP/1.1 GET for plain-http /metrics.

    httpx spends ~3 ms of CPU per 56 KB vLLM scrape; this spends a fraction of that, which keeps
    a 4-endpoint monitor at 1 Hz inside its CPU budget (benchmarks/RESULTS.md#monitor). It reads
    Content-Length, chunked, or to-EOF bodies; https endpoints use httpx instead.
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def get(self, timeout: float) -> tuple[int, bytes]:
        async with asyncio.timeout(timeout):
            for attempt in (0, 1):
                fresh = self._writer is None
                if fresh:
                    self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
                try:
                    return await self._exchange()
                except (ConnectionError, asyncio.IncompleteReadError):
                    self.close()
                    if fresh or attempt:  # a reused keep-alive socket may have been closed
                        raise
        raise ConnectionError("unreachable")  # pragma: no cover

    async def _exchange(self) -> tuple[int, bytes]:
        assert self._reader is not None and self._writer is not None
        extra = "".join(f"{k}: {v}\r\n" for k, v in _api_headers().items())
        self._writer.write(
            f"GET {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Accept: text/plain\r\n{extra}\r\n".encode("latin-1")
        )
        await self._writer.drain()
        status_line = await self._reader.readline()
        if not status_line:
            raise ConnectionResetError("closed before answering")
        version, _, rest = status_line.decode("latin-1").partition(" ")
        status = int(rest.split(" ", 1)[0])
        headers: dict[str, str] = {}
        while True:
            line = await self._reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks = []
            while True:
                size = int((await self._reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await self._reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(await self._reader.readexactly(size))
                await self._reader.readexactly(2)
            body = b"".join(chunks)
        elif "content-length" in headers:
            body = await self._reader.readexactly(int(headers["content-length"]))
        else:
            body = await self._reader.read()
            keep = False
        if not keep:
            self.close()
        return status, body


async def scrape_keepalive(
    conn: _KeepAliveGet, url: str, *, timeout: float, model: str | None = None
) -> MetricsSnapshot:
    """scrape() through a `_KeepAliveGet`: same result and same EndpointError reasons."""
    try:
        status, body = await conn.get(timeout)
    except TimeoutError as exc:
        conn.close()
        raise EndpointError(f"{url}: no answer within {timeout:g} s") from exc
    except (OSError, asyncio.IncompleteReadError) as exc:
        conn.close()
        if isinstance(
            exc, ConnectionRefusedError | socket.gaierror
        ) or "Connect call failed" in str(exc):
            raise EndpointError(f"{url}: {REFUSED}") from exc
        raise EndpointError(f"{url}: connection lost ({type(exc).__name__})") from exc
    except ValueError as exc:
        conn.close()
        raise EndpointError(f"{url}: answered something that is not HTTP") from exc
    if status != 200:
        raise EndpointError(f"{url}: HTTP {status}")
    snap = snapshot_from_text(body.decode("utf-8", "replace"), model=model)
    if not snap.gauges and not snap.counters and not snap.histograms:
        raise EndpointError(f"{url}: answered, but with no vllm: metrics (is it a vLLM server?)")
    return snap


class EndpointStatus(StrEnum):
    CONNECTING = "CONNECTING"  # no scrape answered yet
    UP = "UP"
    DOWN = "DOWN"


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    taken_at: float
    tokens_per_s: float | None
    interactivity_p10: float | None
    interactivity_p50: float | None


@dataclass(frozen=True, slots=True)
class EndpointView:
    """What a screen or a record needs about one endpoint at one moment (no live handles)."""

    name: str
    url: str
    status: EndpointStatus
    reason: str | None
    stale_since: float | None
    last_ok_at: float | None
    next_try_in_s: float | None
    stats: WindowStats | None
    history: tuple[HistoryPoint, ...]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "url": self.url,
            "status": self.status.value,
            "reason": self.reason,
            "stale": self.stale_since is not None,
            "stale_since": self.stale_since,
            "last_ok_at": self.last_ok_at,
        }
        if self.stats is not None:
            out.update(self.stats.to_json())
        else:  # same keys before the second scrape, all null: consumers need not guess
            out.update({name: None for name in WindowStats.__dataclass_fields__})
        return out


@dataclass
class EndpointPoller:
    """One endpoint's scrapes, UP/DOWN state and reconnect backoff. History survives outages."""

    name: str
    url: str
    model: str | None = None
    series: MetricsSeries = field(default_factory=MetricsSeries)
    status: EndpointStatus = EndpointStatus.CONNECTING
    reason: str | None = None
    failures: int = 0
    last_ok_at: float | None = None
    last_ok_mono: float | None = None
    next_try_mono: float = 0.0
    history: deque[HistoryPoint] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    keepalive: bool = True  # plain-http scrapes through _KeepAliveGet (False: the httpx client)
    _conn: _KeepAliveGet | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        try:
            _ = urlsplit(self.url).port  # the property raises on a port out of range
        except ValueError as error:
            raise InputError(
                f"endpoint {self.name}: {self.url!r} is not a valid URL ({error})."
            ) from None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @property
    def never_listened(self) -> bool:
        """Never answered, and refused at the last try: nothing listens at this URL."""
        return self.last_ok_mono is None and self.reason == REFUSED

    def due(self, now_mono: float) -> bool:
        return now_mono >= self.next_try_mono

    async def poll(self, client: httpx.AsyncClient, *, interval: float) -> bool:
        """Scrape if due (not backing off). Returns True when a new scrape was ingested."""
        now = time.monotonic()
        if not self.due(now):
            return False
        timeout = scrape_timeout(interval)
        try:
            if self.keepalive and self.url.startswith("http://"):
                if self._conn is None:
                    self._conn = _KeepAliveGet(metrics_url(self.url))
                snap = await scrape_keepalive(
                    self._conn, metrics_url(self.url), timeout=timeout, model=self.model
                )
            else:
                snap = await scrape(client, self.url, timeout=timeout, model=self.model)
        except EndpointError as exc:
            self.failures += 1
            self.status = EndpointStatus.DOWN
            self.reason = exc.message.split(": ", 1)[-1]
            backoff = min(MAX_BACKOFF_S, interval * 2 ** (self.failures - 1))
            self.next_try_mono = time.monotonic() + backoff
            return False
        self.failures = 0
        self.status = EndpointStatus.UP
        self.reason = None
        self.last_ok_at = snap.taken_at
        self.last_ok_mono = snap.monotonic
        self.next_try_mono = 0.0
        self.series.ingest(snap)
        chart = self.series.window(CHART_WINDOW_S)
        if chart is not None:
            self.history.append(
                HistoryPoint(
                    snap.taken_at,
                    chart.tokens_per_s,
                    chart.interactivity_p10,
                    chart.interactivity_p50,
                )
            )
        return True

    def view(self, window_s: float, *, interval: float) -> EndpointView:
        now = time.monotonic()
        stale_since = None
        if self.last_ok_mono is not None and (
            self.status is EndpointStatus.DOWN
            or now - self.last_ok_mono > STALE_AFTER_INTERVALS * interval
        ):
            stale_since = self.last_ok_at
        return EndpointView(
            name=self.name,
            url=self.url,
            status=self.status,
            reason=self.reason,
            stale_since=stale_since,
            last_ok_at=self.last_ok_at,
            next_try_in_s=max(0.0, self.next_try_mono - now) if self.failures else None,
            stats=self.series.window(window_s),
            history=tuple(self.history),
        )


def none_answered(pollers: Sequence[EndpointPoller]) -> EndpointError | None:
    """The error of a `--once` where no endpoint ever answered /metrics (None if one did)."""
    if any(p.last_ok_mono is not None for p in pollers):
        return None
    where = ", ".join(p.url for p in pollers)
    if all(p.never_listened for p in pollers):
        return EndpointError(
            f"nothing listens at {where}: {REFUSED} on every try for {REFUSED_GIVE_UP_S:g} s.",
            hint="start a server (`kimictl serve`), or check the URL (`kimictl ps` lists "
            "the servers kimictl launched).",
        )
    reasons = "; ".join(f"{p.url}: {p.reason or 'no answer'}" for p in pollers)
    return EndpointError(f"no endpoint answered /metrics during the window ({reasons}).")


async def poll_all(
    pollers: Sequence[EndpointPoller], client: httpx.AsyncClient, *, interval: float
) -> None:
    """Scrape every due endpoint concurrently (one slow endpoint never delays the others)."""
    await asyncio.gather(*(p.poll(client, interval=interval) for p in pollers))


def ab_ratios(tuned: WindowStats | None, stock: WindowStats | None) -> dict[str, float | None]:
    """tuned / stock for each figure of HIGHER_IS_BETTER (None where either side has no data)."""
    out: dict[str, float | None] = {}
    for key in HIGHER_IS_BETTER:
        a = getattr(tuned, key, None) if tuned is not None else None
        b = getattr(stock, key, None) if stock is not None else None
        out[key] = a / b if a is not None and b else None
    return out


def monitor_snapshot(
    views: Sequence[EndpointView],
    *,
    window_s: float,
    ab: tuple[str, str] | None = None,
    gpus: Any = None,
) -> dict[str, Any]:
    """The JSON document of `--once --json`, `--record` lines and the TUI's export."""
    doc: dict[str, Any] = {
        "taken_at": time.time(),
        "window_s": window_s,
        "endpoints": {v.name: v.to_json() for v in views},
    }
    if ab is not None:
        by_name = {v.name: v for v in views}
        tuned, stock = by_name.get(ab[0]), by_name.get(ab[1])
        doc["ab"] = {
            "tuned": ab[0],
            "stock": ab[1],
            "ratio": ab_ratios(tuned.stats if tuned else None, stock.stats if stock else None),
            "higher_is_better": HIGHER_IS_BETTER,
        }
    if gpus is not None:
        doc["gpus"] = gpus
    return doc


WINDOWS_S: tuple[float, ...] = (10.0, 60.0, 300.0)  # the TUI's window switch cycles these


def parse_window(text: str, *, option: str = "--window") -> float:
    """'10s', '1m', '5m', '90' (seconds) -> seconds. Raises InputError naming the option."""
    raw = text.strip().lower()
    scale = 1.0
    if raw.endswith("ms"):
        raw, scale = raw[:-2], 0.001
    elif raw.endswith("s"):
        raw = raw[:-1]
    elif raw.endswith("m"):
        raw, scale = raw[:-1], 60.0
    try:
        seconds = float(raw) * scale
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or seconds <= 0:
        raise InputError(
            f"{option} '{text}' is not a duration: use seconds or a suffix, e.g. 10s, 1m, 5m."
        )
    return seconds


def format_window(seconds: float) -> str:
    return f"{seconds / 60:g}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"


def check_record_target(path: str | os.PathLike[str]) -> None:
    """Refuse a `--record` FILE that would lose or mangle something: a missing folder, a folder,
    or an existing file that is not JSON lines (appending to a TOML or log would corrupt it)."""
    from kimictl.runtime.outputs import check_new_file

    target = os.fspath(path)
    check_new_file(target, flag="--record", overwrite=True)  # appending is no overwrite
    if not os.path.isfile(target):
        return
    with open(target, "rb") as fh:
        first = fh.readline(1 << 20).strip()
    if not first:
        return
    import orjson

    try:
        ok = isinstance(orjson.loads(first), dict)
    except orjson.JSONDecodeError:
        ok = False
    if not ok:
        raise InputError(
            f"--record {target}: the file exists and is not a JSON-lines record; "
            "kimictl appends only to its own records.",
            hint="choose another file name",
        )


def append_jsonl(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> None:
    """Append one JSON line (the `--record` time series)."""
    import orjson

    with open(path, "ab") as fh:
        fh.write(orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS) + b"\n")


def ab_pair_of(names: Sequence[str]) -> tuple[str, str] | None:
    """The (tuned, stock) names for the ratio column: endpoints named tuned and stock, else the
    first and second of exactly two endpoints; None otherwise."""
    if "tuned" in names and "stock" in names:
        return "tuned", "stock"
    if len(names) == 2:
        return names[0], names[1]
    return None


async def watch(
    pollers: Sequence[EndpointPoller],
    *,
    interval: float,
    window_s: float,
    duration_s: float | None,
    on_tick: Callable[[dict[str, Any]], None],
    gpu_sampler: Callable[[], Any] | None = None,
    full_window: bool = False,
) -> dict[str, Any]:
    """Headless monitor loop: poll every `interval`, call `on_tick(snapshot)` after each round,
    stop after `duration_s` (None = until cancelled). Returns the last snapshot.

    With `full_window`, stop as soon as every answering endpoint's scrapes span `window_s` (a
    slow first scrape does not shorten the window), giving up `duration_s` after the start."""
    async with httpx.AsyncClient() as client:
        try:
            return await _watch_loop(
                pollers, client, interval, window_s, duration_s, on_tick, gpu_sampler, full_window
            )
        finally:
            for p in pollers:
                p.close()


async def _watch_loop(
    pollers: Sequence[EndpointPoller],
    client: httpx.AsyncClient,
    interval: float,
    window_s: float,
    duration_s: float | None,
    on_tick: Callable[[dict[str, Any]], None],
    gpu_sampler: Callable[[], Any] | None,
    full_window: bool,
) -> dict[str, Any]:
    ab = ab_pair_of([p.name for p in pollers])

    def snapshot() -> dict[str, Any]:
        views = [p.view(window_s, interval=interval) for p in pollers]
        gpus = gpu_sampler().to_json() if gpu_sampler is not None else None
        return monitor_snapshot(views, window_s=window_s, ab=ab, gpus=gpus)

    start = time.monotonic()
    # a hard stop one scrape timeout past --duration: whatever an await does (a socket that
    # ignores its own timeout, a stalled loop), --once and --duration always end
    deadline = None
    if duration_s is not None:
        deadline = asyncio.get_running_loop().time() + duration_s + scrape_timeout(interval) + 1
    tick = 0
    try:
        async with asyncio.timeout_at(deadline):
            while True:
                await poll_all(pollers, client, interval=interval)
                last = snapshot()
                on_tick(last)
                tick += 1
                if full_window:
                    answering = [p for p in pollers if p.series.latest is not None]
                    if answering and all(p.series.span_s >= window_s for p in answering):
                        return last
                    if all(p.never_listened for p in pollers):
                        # retry once at REFUSED_GIVE_UP_S (a server may be binding), then stop
                        if time.monotonic() - start >= REFUSED_GIVE_UP_S:
                            return last
                        await asyncio.sleep(start + REFUSED_GIVE_UP_S - time.monotonic())
                        for p in pollers:
                            p.next_try_mono = 0.0
                        continue
                if duration_s is not None and time.monotonic() - start >= duration_s:
                    return last
                # stay on the start + k * interval grid (a slow scrape does not drift the schedule)
                next_at = start + tick * interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    except TimeoutError:
        return snapshot()
