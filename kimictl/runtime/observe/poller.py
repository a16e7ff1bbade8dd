"""Polling endpoints (shared by the TUI and headless `kimictl monitor`): UP/DOWN state, backoff,
views, the watch loop and the `--record` file."""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from kimictl.core.errors import EndpointError, InputError
from kimictl.runtime.observe.otlp import TraceStore, apply_traces
from kimictl.runtime.observe.scrape import REFUSED, MetricsScraper, scrape_timeout
from kimictl.runtime.observe.window import HIGHER_IS_BETTER, MetricsSeries, WindowStats, ab_ratios

__all__ = [
    "CHART_WINDOW_S",
    "EndpointPoller",
    "EndpointStatus",
    "EndpointView",
    "HISTORY_POINTS",
    "HistoryPoint",
    "MAX_BACKOFF_S",
    "REFUSED_GIVE_UP_S",
    "SCRAPE_BUDGET",
    "STALE_AFTER_INTERVALS",
    "ab_pair_of",
    "append_jsonl",
    "check_record_target",
    "monitor_snapshot",
    "none_answered",
    "poll_all",
    "watch",
]


# --- polling endpoints (shared by the TUI and headless `kimictl monitor`) -------------------------
CHART_WINDOW_S = 10.0  # each history point is the figure over the 10 s before it
MAX_BACKOFF_S = 10.0
# --once gives up this soon (one retry) when every endpoint refuses: nothing will answer.
REFUSED_GIVE_UP_S = 1.0


STALE_AFTER_INTERVALS = 2.5
# A scrape costs the server its render time in the API-server process, which also streams the
# tokens (docs/results.md). When answers come slowly (a loaded server), poll less
# often: time spent waiting on scrapes stays under this share of the wall time (20 x the last
# scrape's duration between scrapes, at most MAX_BACKOFF_S). At 1 s it acts above 50 ms a scrape.
SCRAPE_BUDGET = 0.05
HISTORY_POINTS = 900


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
    paced_s: float | None = None  # polled every paced_s instead of the interval (slow scrapes)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "url": self.url,
            "status": self.status.value,
            "reason": self.reason,
            "stale": self.stale_since is not None,
            "stale_since": self.stale_since,
            "last_ok_at": self.last_ok_at,
            "paced_s": self.paced_s,
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
    paced_s: float | None = None
    scrape_budget: float = SCRAPE_BUDGET
    traces: TraceStore | None = None  # spans the monitor receives (observe.otlp), any server
    history: deque[HistoryPoint] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    scraper: MetricsScraper = field(init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            _ = urlsplit(self.url).port  # the property raises on a port out of range
        except ValueError as error:
            raise InputError(
                f"endpoint {self.name}: {self.url!r} is not a valid URL ({error})."
            ) from None
        self.scraper = MetricsScraper(self.url, name=f"endpoint {self.name}")

    def close(self) -> None:
        self.scraper.close()

    @property
    def never_listened(self) -> bool:
        """Never answered, and refused at the last try: nothing listens at this URL."""
        return self.last_ok_mono is None and self.reason == REFUSED

    def due(self, now_mono: float) -> bool:
        return now_mono >= self.next_try_mono

    async def poll(self, *, interval: float) -> bool:
        """Scrape if due (not backing off). Returns True when a new scrape was ingested."""
        now = time.monotonic()
        if not self.due(now):
            return False
        timeout = scrape_timeout(interval)
        started = now
        try:
            snap = await self.scraper.scrape(timeout=timeout, model=self.model)
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
        pace = min(MAX_BACKOFF_S, (time.monotonic() - started) / self.scrape_budget)
        self.paced_s = pace if pace > interval else None
        self.next_try_mono = started + pace if self.paced_s else 0.0
        self.series.ingest(snap)
        chart = self.window(CHART_WINDOW_S)
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

    def window(self, window_s: float) -> WindowStats | None:
        """The scrapes' window, its per-request figures exact where traced requests finished in
        it (observe.otlp.apply_traces); histograms otherwise."""
        stats = self.series.window(window_s)
        if self.traces is None:
            return stats
        return apply_traces(stats, self.traces, url=self.url, name=self.name, window_s=window_s)

    def view(self, window_s: float, *, interval: float) -> EndpointView:
        now = time.monotonic()
        stale_since = None
        if self.last_ok_mono is not None and (
            self.status is EndpointStatus.DOWN
            or now - self.last_ok_mono > STALE_AFTER_INTERVALS * max(interval, self.paced_s or 0)
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
            stats=self.window(window_s),
            history=tuple(self.history),
            paced_s=self.paced_s,
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


async def poll_all(pollers: Sequence[EndpointPoller], *, interval: float) -> None:
    """Scrape every due endpoint concurrently (one slow endpoint never delays the others)."""
    await asyncio.gather(*(p.poll(interval=interval) for p in pollers))


def monitor_snapshot(
    views: Sequence[EndpointView],
    *,
    window_s: float,
    ab: tuple[str, str] | None = None,
    gpus: Any = None,
    traces: Mapping[str, Any] | None = None,
    judge: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON document of `--once --json`, `--record` lines and the TUI's export; `judge` is
    the live judge's look (observe.judge), when the monitor judges a canary or a shadow."""
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
    if traces is not None:
        doc["traces"] = dict(traces)
    if judge is not None:
        doc["judge"] = dict(judge)
    return doc


def check_record_target(path: str | os.PathLike[str]) -> None:
    """Refuse a `--record` FILE that would lose or mangle something: a missing folder, a folder,
    or an existing file that is not JSON lines (appending to a TOML or log would corrupt it)."""
    from kimictl.core.outputs import check_new_file

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
    from kimictl.core.jsondoc import dumps

    with open(path, "ab") as fh:
        fh.write(dumps(doc, indent=False))


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
    traces_status: Callable[[], Mapping[str, Any]] | None = None,
    judge: Callable[[], Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Headless monitor loop: poll every `interval`, call `on_tick(snapshot)` after each round,
    stop after `duration_s` (None = until cancelled). Returns the last snapshot.

    With `full_window`, stop as soon as every answering endpoint's scrapes span `window_s` (a
    slow first scrape does not shorten the window), giving up `duration_s` after the start."""
    try:
        return await _watch_loop(
            pollers,
            interval,
            window_s,
            duration_s,
            on_tick,
            gpu_sampler,
            full_window,
            traces_status,
            judge,
        )
    finally:
        for p in pollers:
            p.close()


async def _watch_loop(
    pollers: Sequence[EndpointPoller],
    interval: float,
    window_s: float,
    duration_s: float | None,
    on_tick: Callable[[dict[str, Any]], None],
    gpu_sampler: Callable[[], Any] | None,
    full_window: bool,
    traces_status: Callable[[], Mapping[str, Any]] | None,
    judge: Callable[[], Mapping[str, Any]] | None,
) -> dict[str, Any]:
    ab = ab_pair_of([p.name for p in pollers])

    def snapshot() -> dict[str, Any]:
        views = [p.view(window_s, interval=interval) for p in pollers]
        gpus = gpu_sampler().to_json() if gpu_sampler is not None else None
        traces = traces_status() if traces_status is not None else None
        judged = judge() if judge is not None else None
        return monitor_snapshot(
            views, window_s=window_s, ab=ab, gpus=gpus, traces=traces, judge=judged
        )

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
                await poll_all(pollers, interval=interval)
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
