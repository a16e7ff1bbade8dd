"""GET /metrics from one endpoint (through the one HTTP/1.1 client, core.http1) and parse it.

The scrape asks only for the samples a snapshot reads. A scrape costs the server its render time
inside vLLM's API-server process (docs/results.md): the full text is ~60 KB and
~700 lines, the filtered one ~130 lines. prometheus_client's ASGI app honours
`?name[]=SAMPLE` filters; in vLLM 0.32-0.33 exact `/metrics` is routed to
prometheus-fastapi-instrumentator's handler, which ignores them, and `/metrics/` (the Mount of
prometheus_client's app) applies them. So the filtered GET is `/metrics/?name[]=...`, and a server
that rejects or ignores it is scraped in full from then on.

Every reader of /metrics goes through MetricsScraper: the monitor (all of SAMPLE_NAMES), bench's
before/after view of each run (the same), validate's finished-request count (two samples).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from enum import StrEnum
from urllib.parse import urlencode

from kimictl.core.apikeys import env_api_key
from kimictl.core.errors import EndpointError, InputError
from kimictl.core.http1 import Endpoint
from kimictl.core.urls import server_root
from kimictl.runtime.observe.names import SAMPLE_NAMES
from kimictl.runtime.observe.snapshot import MetricsSnapshot, snapshot_from_text

__all__ = [
    "FILTER_PATH",
    "filter_path",
    "REFUSED",
    "FilterMode",
    "MetricsScraper",
    "honours_filter",
    "metrics_endpoint",
    "metrics_url",
    "scrape_once",
    "scrape_timeout",
]


# The reason of a scrape nothing listens to (refused, or a name that does not resolve).
REFUSED = "connection refused or host unreachable"


def filter_path(names: Iterable[str]) -> str:
    """Appended to the /metrics path: the sample names wanted, in prometheus_client's syntax."""
    return "/?" + urlencode([("name[]", name) for name in names])


# What the monitor asks for: every sample name a snapshot reads.
FILTER_PATH = filter_path(SAMPLE_NAMES)


class FilterMode(StrEnum):
    UNKNOWN = "unknown"  # not tried yet: the next scrape asks for the filtered text
    FILTERED = "filtered"  # the server answered the filtered GET with only what was asked
    FULL = "full"  # the server rejected or ignored the filter: full scrapes from now on


def scrape_timeout(interval: float) -> float:
    """A loaded server can take a while to render /metrics: allow 2 intervals (2-10 s)."""
    return max(2.0, min(2 * interval, 10.0))


def metrics_url(base_url: str) -> str:
    base = server_root(base_url)
    return base if base.endswith("/metrics") else base + "/metrics"


def metrics_endpoint(
    base_url: str, *, name: str = "endpoint", api_key: str | None = None
) -> Endpoint:
    """A keep-alive connection pool to `base_url`'s /metrics, sending `api_key` (None: VLLM_API_KEY
    if set). InputError when the URL is not http(s)://HOST[:PORT]."""
    try:
        return Endpoint(metrics_url(base_url), api_key if api_key is not None else env_api_key())
    except InputError:
        raise InputError(
            f"{name}: {base_url!r} is not an http(s)://HOST[:PORT] URL.",
            hint="e.g. kimictl monitor http://127.0.0.1:8000",
        ) from None


def honours_filter(text: str, names: Iterable[str] = SAMPLE_NAMES) -> bool:
    """True when every sample of `text` is one of `names` (what the filter asked for), and there
    is at least one."""
    wanted = frozenset(names)
    seen = False
    for raw in text.splitlines():
        line = raw.lstrip()
        if not line or line[0] == "#":
            continue
        end = len(line)
        for sep in ("{", " ", "\t"):
            at = line.find(sep)
            if 0 <= at < end:
                end = at
        if line[:end] not in wanted:
            return False
        seen = True
    return seen


class MetricsScraper:
    """Scrapes one endpoint over a keep-alive connection, filtered when the server allows it.
    `mode` remembers what the server did with the filter (one probe, then kept). `names`: the
    sample names to ask for (a subset of SAMPLE_NAMES; default all a snapshot reads); `api_key`:
    sent as a bearer token, None = VLLM_API_KEY from the environment."""

    def __init__(
        self,
        base_url: str,
        *,
        name: str = "endpoint",
        names: Iterable[str] = SAMPLE_NAMES,
        api_key: str | None = None,
    ) -> None:
        self.url = metrics_url(base_url)
        self.names = tuple(names)
        if unknown := set(self.names) - set(SAMPLE_NAMES):
            raise ValueError(f"not samples a snapshot reads: {sorted(unknown)}")
        self.conn = metrics_endpoint(base_url, name=name, api_key=api_key)
        self.mode = FilterMode.UNKNOWN
        self._path = filter_path(self.names)

    def close(self) -> None:
        self.conn.close()

    async def scrape(self, *, timeout: float, model: str | None = None) -> MetricsSnapshot:
        """GET /metrics once and parse it. Raises EndpointError with a one-line reason."""
        if self.mode is FilterMode.FULL:
            return _parse(self.url, *await self._get("", timeout), model)
        status, text = await self._get(self._path, timeout)
        if status == 200:
            if self.mode is FilterMode.FILTERED or honours_filter(text, self.names):
                self.mode = FilterMode.FILTERED
                return _parse(self.url, status, text, model)
            if _has_vllm_samples(text):  # the filter was ignored: this is the full text
                self.mode = FilterMode.FULL
                return _parse(self.url, status, text, model)
        # rejected (404, a redirect, 400 ...) or an answer without our samples: ask in full once;
        # only a full answer that works settles the mode (a failing server decides nothing)
        snap = _parse(self.url, *await self._get("", timeout), model)
        self.mode = FilterMode.FULL
        return snap

    async def _get(self, path: str, timeout: float) -> tuple[int, str]:
        url = self.url
        try:
            resp = await self.conn.request(self.conn.build("GET", path, None), None, timeout)
        except TimeoutError as exc:
            self.conn.close()
            raise EndpointError(f"{url}: no answer within {timeout:g} s") from exc
        except OSError as exc:
            self.conn.close()
            if isinstance(
                exc, ConnectionRefusedError | socket.gaierror
            ) or "Connect call failed" in str(exc):
                raise EndpointError(f"{url}: {REFUSED}") from exc
            raise EndpointError(f"{url}: connection lost ({type(exc).__name__})") from exc
        if resp.status == 0:
            reason = resp.error or "no answer"
            if reason.startswith("not an HTTP response"):
                raise EndpointError(f"{url}: answered something that is not HTTP")
            raise EndpointError(f"{url}: connection lost ({reason})")
        return resp.status, resp.body.decode("utf-8", "replace")


def scrape_once(
    base_url: str,
    *,
    names: Iterable[str] = SAMPLE_NAMES,
    api_key: str | None = None,
    timeout: float = 10.0,
    name: str = "endpoint",
) -> MetricsSnapshot:
    """One scrape from synchronous code (validate): its own event loop and connection. Raises
    EndpointError with a one-line reason."""

    async def once() -> MetricsSnapshot:
        scraper = MetricsScraper(base_url, name=name, names=names, api_key=api_key)
        try:
            return await scraper.scrape(timeout=timeout)
        finally:
            scraper.close()

    return asyncio.run(once())


def _has_vllm_samples(text: str) -> bool:
    return "\nvllm:" in text or text.startswith("vllm:")


def _parse(url: str, status: int, text: str, model: str | None) -> MetricsSnapshot:
    if status != 200:
        raise EndpointError(f"{url}: HTTP {status}")
    snap = snapshot_from_text(text, model=model)
    if not snap.gauges and not snap.counters and not snap.histograms:
        raise EndpointError(f"{url}: answered, but with no vllm: metrics (is it a vLLM server?)")
    return snap
