"""GET /metrics from one endpoint (through the one HTTP/1.1 client, runtime.http1) and parse it."""

from __future__ import annotations

import socket

from kimictl.runtime.apikeys import env_api_key
from kimictl.runtime.errors import EndpointError, InputError
from kimictl.runtime.http1 import Endpoint
from kimictl.runtime.observe.snapshot import MetricsSnapshot, snapshot_from_text

__all__ = [
    "REFUSED",
    "metrics_endpoint",
    "metrics_url",
    "scrape",
    "scrape_timeout",
]


# The reason of a scrape nothing listens to (refused, or a name that does not resolve).
REFUSED = "connection refused or host unreachable"


def scrape_timeout(interval: float) -> float:
    """A loaded server can take a while to render /metrics: allow 2 intervals (2-10 s)."""
    return max(2.0, min(2 * interval, 10.0))


def metrics_url(base_url: str) -> str:
    base = base_url.rstrip("/").removesuffix("/v1")
    return base if base.endswith("/metrics") else base + "/metrics"


def metrics_endpoint(base_url: str, *, name: str = "endpoint") -> Endpoint:
    """A keep-alive connection pool to `base_url`'s /metrics, sending VLLM_API_KEY if set.
    InputError when the URL is not http(s)://HOST[:PORT]."""
    try:
        return Endpoint(metrics_url(base_url), env_api_key())
    except InputError:
        raise InputError(
            f"{name}: {base_url!r} is not an http(s)://HOST[:PORT] URL.",
            hint="e.g. kimictl monitor http://127.0.0.1:8000",
        ) from None


async def scrape(
    conn: Endpoint, url: str, *, timeout: float, model: str | None = None
) -> MetricsSnapshot:
    """GET /metrics once through `conn` and parse it. Raises EndpointError with a one-line reason
    (`url` names the endpoint in it)."""
    try:
        resp = await conn.request(conn.build("GET", "", None), None, timeout)
    except TimeoutError as exc:
        conn.close()
        raise EndpointError(f"{url}: no answer within {timeout:g} s") from exc
    except OSError as exc:
        conn.close()
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
    if resp.status != 200:
        raise EndpointError(f"{url}: HTTP {resp.status}")
    snap = snapshot_from_text(resp.body.decode("utf-8", "replace"), model=model)
    if not snap.gauges and not snap.counters and not snap.histograms:
        raise EndpointError(f"{url}: answered, but with no vllm: metrics (is it a vLLM server?)")
    return snap
