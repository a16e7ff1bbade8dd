"""Window math: figures from the difference of two cumulative snapshots, restarts stitched out.

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

import bisect
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kimictl.core.errors import InputError
from kimictl.runtime.observe.names import (
    E2E_LATENCY,
    GAUGES,
    GENERATION_TOKENS,
    HISTOGRAMS,
    INTER_TOKEN_LATENCY,
    KV_CACHE_USAGE,
    NUM_PREEMPTIONS,
    PROMPT_TOKENS,
    REQUEST_QUEUE_TIME,
    REQUEST_SUCCESS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    SPEC_ACCEPTED_TOKENS,
    SPEC_DRAFT_TOKENS,
    SPEC_DRAFTS,
    TIME_PER_OUTPUT_TOKEN,
    TIME_TO_FIRST_TOKEN,
)
from kimictl.runtime.observe.prometheus import Histogram
from kimictl.runtime.observe.resolution import unresolved_figures
from kimictl.runtime.observe.snapshot import MetricsSnapshot

__all__ = [
    "HIGHER_IS_BETTER",
    "HISTOGRAM_FIGURES",
    "MetricsSeries",
    "WINDOWS_S",
    "WindowStats",
    "ab_ratios",
    "compute_window",
    "format_window",
    "join_windows",
    "percentile",
    "parse_window",
]
# Families a vLLM server always exposes; absent ones are reported in `WindowStats.missing`.
# (The spec-decode counters exist only when speculation is configured: not "missing" otherwise.)
_EXPECTED = (*GAUGES, PROMPT_TOKENS, GENERATION_TOKENS, REQUEST_SUCCESS, *HISTOGRAMS)


# --- windows ------------------------------------------------------------------------------------
# Per-request figures: the histogram family each is read from (the trace path computes the same
# keys exactly, observe.otlp). Token rates, gauges and spec figures come from /metrics only.
HISTOGRAM_FIGURES: dict[str, str] = {
    "interactivity_p10": TIME_PER_OUTPUT_TOKEN,
    "interactivity_p50": TIME_PER_OUTPUT_TOKEN,
    "interactivity_p90": TIME_PER_OUTPUT_TOKEN,
    "tpot_p10_ms": TIME_PER_OUTPUT_TOKEN,
    "tpot_p50_ms": TIME_PER_OUTPUT_TOKEN,
    "tpot_p90_ms": TIME_PER_OUTPUT_TOKEN,
    "tpot_mean_ms": TIME_PER_OUTPUT_TOKEN,
    "ttft_p50_ms": TIME_TO_FIRST_TOKEN,
    "ttft_p90_ms": TIME_TO_FIRST_TOKEN,
    "ttft_p99_ms": TIME_TO_FIRST_TOKEN,
    "e2e_p50_ms": E2E_LATENCY,
    "e2e_p90_ms": E2E_LATENCY,
    "queue_p50_ms": REQUEST_QUEUE_TIME,
    "queue_p90_ms": REQUEST_QUEUE_TIME,
}


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
    queue_p50_ms: float | None = None
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
    # figures the buckets cannot resolve (set to None above) -> bound + bucket (observe.resolution)
    unresolved: Mapping[str, Any] = field(default_factory=dict)
    # per-request figure -> where it comes from ("histograms" or "traces") and how many requests
    # are behind it (observe.otlp replaces the histogram figures when traced requests arrived)
    sources: Mapping[str, str] = field(default_factory=dict)
    counts: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, float) and not math.isfinite(value):
                value = None
            elif isinstance(value, Mapping):
                value = dict(value)
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
    stats = WindowStats(
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
        queue_p50_ms=_ms(q(REQUEST_QUEUE_TIME, 0.50)),
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
    unresolved = unresolved_figures(delta.histograms)
    cleared: dict[str, Any] = dict.fromkeys(unresolved)  # a bound, never a confident number
    sources: dict[str, str] = {}
    counts: dict[str, int] = {}
    for key, family in HISTOGRAM_FIGURES.items():
        h = delta.histograms.get(family)
        if h is not None:
            sources[key] = "histograms"
            counts[key] = round(h.count)
    return replace(stats, unresolved=unresolved, sources=sources, counts=counts, **cleared)


def compute_window(old: MetricsSnapshot, new: MetricsSnapshot) -> WindowStats:
    """Figures between two scrapes of the same endpoint (e.g. before and after a bench run).

    A restart between them (counters went down, or a new process start time) makes the deltas
    count from zero at the restart: what happened before the restart in the window is lost, and
    `resets` is 1. For many scrapes in a row, `MetricsSeries` keeps every restart's counts.
    """
    delta, reset = _delta_snapshot(old, new)
    return _stats_from_delta(delta, new, new.monotonic - old.monotonic, 1 if reset else 0)


def join_windows(
    pairs: Sequence[tuple[MetricsSnapshot, MetricsSnapshot]],
) -> tuple[MetricsSnapshot, MetricsSnapshot]:
    """Several (before, after) scrapes of one endpoint as one pair for `compute_window`: the deltas
    are the sum of each pair's and the span the sum of their spans, so the time between the pairs
    (another target's turn of an A/B) counts neither as load nor as idle time."""
    old, new = pairs[0]
    for before, after in pairs[1:]:
        delta, _ = _delta_snapshot(before, after)
        span = after.monotonic - before.monotonic
        new = replace(
            _add_delta(new, delta),
            monotonic=new.monotonic + span,
            process_start=new.process_start,  # a restart between pairs is in the delta already
        )
    return old, new


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


def ab_ratios(tuned: WindowStats | None, stock: WindowStats | None) -> dict[str, float | None]:
    """tuned / stock for each figure of HIGHER_IS_BETTER (None where either side has no data)."""
    out: dict[str, float | None] = {}
    for key in HIGHER_IS_BETTER:
        a = getattr(tuned, key, None) if tuned is not None else None
        b = getattr(stock, key, None) if stock is not None else None
        out[key] = a / b if a is not None and b else None
    return out


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


def percentile(values: Sequence[float], p: float) -> float | None:
    """Per-request samples' percentile: linear interpolation between order statistics
    (numpy.percentile's default, as `vllm bench serve`); None for no samples."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
