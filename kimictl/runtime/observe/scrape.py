"""GET /metrics from one endpoint and parse it into a MetricsSnapshot."""

from __future__ import annotations

import asyncio
import os
import socket
from urllib.parse import urlsplit

import httpx

from kimictl.runtime.errors import EndpointError
from kimictl.runtime.observe.snapshot import MetricsSnapshot, snapshot_from_text

__all__ = [
    "metrics_url",
    "scrape",
    "scrape_keepalive",
    "scrape_timeout",
]


def scrape_timeout(interval: float) -> float:
    """A loaded server can take a while to render /metrics: allow 2 intervals (2-10 s)."""
    return max(2.0, min(2 * interval, 10.0))


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
        raise EndpointError(f"{url}: connection refused or host unreachable") from exc
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
            raise EndpointError(f"{url}: connection refused or host unreachable") from exc
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
