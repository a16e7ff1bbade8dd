"""Exact per-request figures: vLLM's trace spans received over OTLP/HTTP.

A vLLM server started with `--otlp-traces-endpoint URL` ends one span ("llm_request") per
finished request in its API-server process (vllm/v1/engine/output_processor.py `do_tracing`),
carrying the request's TTFT, end-to-end latency, queue time, decode time and token counts
(attribute names: `names.SPAN_*`, from vllm/tracing/utils.py `SpanAttributes`). The SDK's batch
processor POSTs them to `URL` (OTLP/HTTP, protobuf; JSON from other senders is accepted too).

`OtlpReceiver` listens on a local port (127.0.0.1 by default) in a daemon thread, decodes each
body with the OpenTelemetry protocol package (`opentelemetry-proto`), and keeps one
`TracedRequest` per span in a `TraceStore`. `apply_traces` turns the requests that finished in a
window into the same `WindowStats` keys the histogram path fills (window.HISTOGRAM_FIGURES),
exactly: each request's TPOT is its decode time / (output tokens - 1), vLLM's own definition of
`vllm:request_time_per_output_token_seconds`, so the percentiles are of the requests themselves,
not interpolated inside buckets. Each figure says its source and how many requests are behind it.
"""

from __future__ import annotations

import bisect
import gzip
import math
import threading
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from kimictl.core.errors import InputError
from kimictl.deployment.traces import (
    DEFAULT_TRACES_PORT,
    INSTANCE_ATTRIBUTE,
    TRACES_PATH,
)
from kimictl.runtime.observe.names import (
    SPAN_DECODE_TIME,
    SPAN_E2E,
    SPAN_OUTPUT_TOKENS,
    SPAN_PROMPT_TOKENS,
    SPAN_QUEUE_TIME,
    SPAN_REQUEST_ID,
    SPAN_TTFT,
)
from kimictl.runtime.observe.window import HISTOGRAM_FIGURES, WindowStats, percentile

__all__ = [
    "MAX_BODY_BYTES",
    "OtlpReceiver",
    "TRACES",
    "TraceStore",
    "TracedRequest",
    "apply_traces",
    "decode_export",
    "percentile",
    "server_key_matches",
    "traced_figures",
]

TRACES = "traces"
HISTOGRAMS = "histograms"
MAX_BODY_BYTES = 64 << 20  # one export batch; the SDK sends at most 512 spans a POST
_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""}


# --- one finished request ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TracedRequest:
    """One finished request as its server reported it (seconds; wall-clock times)."""

    server: str  # service.instance.id ("HOST:PORT") or, without it, service.name
    finished_at: float  # arrival + e2e (the span's end when e2e is absent)
    ttft_s: float | None
    e2e_s: float | None
    queue_s: float | None
    decode_s: float | None
    prompt_tokens: int | None
    output_tokens: int | None
    request_id: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Decode time / (output tokens - 1): vLLM's per-request TPOT (requests with >= 2 tokens);
        from e2e - TTFT where a sender gives no decode time."""
        n = self.output_tokens
        if n is None or n < 2:
            return None
        decode = self.decode_s
        if decode is None and self.e2e_s is not None and self.ttft_s is not None:
            decode = self.e2e_s - self.ttft_s
        return None if decode is None or decode <= 0 else decode / (n - 1)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind in ("string_value", "bool_value", "double_value"):
        return getattr(any_value, kind)
    if kind == "int_value":
        return int(any_value.int_value)
    return None  # arrays, maps, bytes: no vLLM request figure is one


def _attributes(key_values: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in key_values}


def _number(attrs: Mapping[str, Any], key: str) -> float | None:
    v = attrs.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _count(attrs: Mapping[str, Any], key: str) -> int | None:
    v = _number(attrs, key)
    return None if v is None else int(v)


def decode_export(body: bytes, content_type: str) -> list[TracedRequest]:
    """An OTLP/HTTP ExportTraceServiceRequest (protobuf or JSON) -> its finished requests.

    Spans without vLLM's request latency (`names.SPAN_E2E`) are not requests and are skipped.
    Raises ValueError on a body the protocol package cannot decode."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    message = ExportTraceServiceRequest()
    media = content_type.split(";", 1)[0].strip().lower()
    try:
        if media == _JSON:
            json_format.Parse(body, message, ignore_unknown_fields=True)
        else:
            message.ParseFromString(body)
    except (DecodeError, json_format.ParseError, UnicodeDecodeError) as exc:
        raise ValueError(f"not an OTLP trace export ({media}): {exc}") from None
    out: list[TracedRequest] = []
    for resource_spans in message.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        server = str(resource.get(INSTANCE_ATTRIBUTE) or resource.get("service.name") or "")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attrs = _attributes(span.attributes)
                e2e = _number(attrs, SPAN_E2E)
                if e2e is None:
                    continue
                start = span.start_time_unix_nano / 1e9
                end = span.end_time_unix_nano / 1e9
                rid = attrs.get(SPAN_REQUEST_ID)
                out.append(
                    TracedRequest(
                        server=server,
                        finished_at=start + e2e if start > 0 else end,
                        ttft_s=_number(attrs, SPAN_TTFT),
                        e2e_s=e2e,
                        queue_s=_number(attrs, SPAN_QUEUE_TIME),
                        decode_s=_number(attrs, SPAN_DECODE_TIME),
                        prompt_tokens=_count(attrs, SPAN_PROMPT_TOKENS),
                        output_tokens=_count(attrs, SPAN_OUTPUT_TOKENS),
                        request_id=None if rid is None else str(rid),
                    )
                )
    return out


def export_response(content_type: str) -> tuple[bytes, str]:
    """The success body OTLP/HTTP asks for: an empty ExportTraceServiceResponse, same encoding."""
    if content_type.split(";", 1)[0].strip().lower() == _JSON:
        return b"{}", _JSON
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    return ExportTraceServiceResponse().SerializeToString(), _PROTOBUF


# --- the store -----------------------------------------------------------------------------------
def server_key_matches(key: str, *, url: str, name: str) -> bool:
    """Does a span's server key ("HOST:PORT" of its API server, or a service name) belong to the
    endpoint at `url` called `name`? Loopback and wildcard hosts are one host."""
    if key == name:
        return True
    parts = urlsplit(url if "//" in url else f"http://{url}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host, sep, key_port = key.rpartition(":")
    if not sep or key_port != str(port):
        return False
    host = host.strip("[]").lower()
    url_host = (parts.hostname or "").lower()
    return host == url_host or (host in _LOOPBACK and url_host in _LOOPBACK)


@dataclass
class TraceStore:
    """Finished requests from every sender, per server key and in finish order; thread-safe (the
    receiver's threads add, the monitor reads). Keeps `keep_s` seconds by finish time. A window
    is two bisections, however many requests a busy server sends."""

    keep_s: float = 330.0
    _by_server: dict[str, list[TracedRequest]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    received: int = 0  # spans taken, all senders, since the start
    rejected: int = 0  # bodies refused (undecodable, too large, wrong type)

    @property
    def servers(self) -> set[str]:
        with self._lock:
            return set(self._by_server)

    def add(self, requests: Sequence[TracedRequest], *, now: float | None = None) -> None:
        horizon = (time.time() if now is None else now) - self.keep_s
        with self._lock:
            self.received += len(requests)
            for r in requests:
                kept = self._by_server.setdefault(r.server, [])
                if not kept or kept[-1].finished_at <= r.finished_at:
                    kept.append(r)  # the usual case: batches arrive in finish order
                else:
                    bisect.insort(kept, r, key=_finished)
            for kept in self._by_server.values():
                old = bisect.bisect_left(kept, horizon, key=_finished)
                if old:
                    del kept[:old]

    def requests(
        self, *, url: str, name: str, start: float, end: float | None = None
    ) -> list[TracedRequest]:
        """The endpoint's requests that finished after `start` (and at or before `end`)."""
        out: list[TracedRequest] = []
        with self._lock:
            for key, kept in self._by_server.items():
                if not server_key_matches(key, url=url, name=name):
                    continue
                lo = bisect.bisect_right(kept, start, key=_finished)
                hi = len(kept) if end is None else bisect.bisect_right(kept, end, key=_finished)
                out.extend(kept[lo:hi])
        return out


def _finished(r: TracedRequest) -> float:
    return r.finished_at


# --- figures -------------------------------------------------------------------------------------
def traced_figures(
    requests: Sequence[TracedRequest],
) -> tuple[dict[str, float | None], dict[str, int]]:
    """The per-request figures (window.HISTOGRAM_FIGURES keys) over `requests`, exactly, and the
    number of requests behind each."""
    tpots = [t for t in (r.tpot_s for r in requests) if t is not None]
    inter = [1.0 / t for t in tpots]
    ttfts = [r.ttft_s for r in requests if r.ttft_s is not None]
    e2es = [r.e2e_s for r in requests if r.e2e_s is not None]
    queues = [r.queue_s for r in requests if r.queue_s is not None]

    def ms(values: Sequence[float], p: float) -> float | None:
        v = percentile(values, p)
        return None if v is None else v * 1000.0

    figures: dict[str, float | None] = {
        "interactivity_p10": percentile(inter, 10),
        "interactivity_p50": percentile(inter, 50),
        "interactivity_p90": percentile(inter, 90),
        "tpot_p10_ms": ms(tpots, 10),
        "tpot_p50_ms": ms(tpots, 50),
        "tpot_p90_ms": ms(tpots, 90),
        "tpot_mean_ms": sum(tpots) / len(tpots) * 1000.0 if tpots else None,
        "ttft_p50_ms": ms(ttfts, 50),
        "ttft_p90_ms": ms(ttfts, 90),
        "ttft_p99_ms": ms(ttfts, 99),
        "e2e_p50_ms": ms(e2es, 50),
        "e2e_p90_ms": ms(e2es, 90),
        "queue_p50_ms": ms(queues, 50),
        "queue_p90_ms": ms(queues, 90),
    }
    n_of = {"interactivity": len(tpots), "tpot": len(tpots), "ttft": len(ttfts)}
    n_of |= {"e2e": len(e2es), "queue": len(queues)}
    counts = {key: n_of[key.split("_", 1)[0]] for key in figures}
    return figures, counts


def apply_traces(
    stats: WindowStats | None,
    store: TraceStore,
    *,
    url: str,
    name: str,
    window_s: float,
    now: float | None = None,
) -> WindowStats | None:
    """`stats` (the /metrics window) with its per-request figures replaced by the exact ones of
    the traced requests that finished in the same window, when at least one did. The window is
    the scrapes' own (ended_at - window_s .. ended_at], so a request is counted where the
    histograms count it; without scrapes, the last `window_s`."""
    end = stats.ended_at if stats is not None else (time.time() if now is None else now)
    span = stats.window_s if stats is not None else window_s
    requests = store.requests(url=url, name=name, start=end - span, end=end)
    if not requests:
        return stats
    figures, counts = traced_figures(requests)
    if stats is None:
        stats = WindowStats(window_s=span, ended_at=end)
    sources = dict(stats.sources) | dict.fromkeys(figures, TRACES)
    unresolved = {k: v for k, v in stats.unresolved.items() if k not in figures}
    return replace(
        stats,
        **figures,  # type: ignore[arg-type]
        sources=sources,
        counts=dict(stats.counts) | counts,
        unresolved=unresolved,
    )


assert set(traced_figures([])[0]) == set(HISTOGRAM_FIGURES)  # one key set, both sources


# --- the receiver --------------------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: the SDK's exporter reuses its connection

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a monitor screen has no room for an access log

    def _reply(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        store = self.server.store
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            store.rejected += 1
            self.close_connection = True
            self._reply(413, b"body too large")
            return
        body = self.rfile.read(length)
        if self.path.split("?", 1)[0] != TRACES_PATH:
            self._reply(404, f"only {TRACES_PATH} is received here".encode())
            return
        content_type = self.headers.get("Content-Type") or _PROTOBUF
        if content_type.split(";", 1)[0].strip().lower() not in (_PROTOBUF, _JSON):
            store.rejected += 1
            self._reply(415, f"send {_PROTOBUF} or {_JSON}".encode())
            return
        try:
            if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                body = gzip.decompress(body)
            requests = decode_export(body, content_type)
        except (ValueError, OSError, EOFError, zlib.error) as exc:
            store.rejected += 1
            self._reply(400, str(exc).encode())
            return
        store.add(requests)
        self._reply(200, *export_response(content_type))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    store: TraceStore


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint (`http://HOST:PORT/v1/traces`) feeding a `TraceStore`."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_TRACES_PORT,
        store: TraceStore | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.store = store if store is not None else TraceStore()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.reason: str | None = None  # why it is not listening

    def status(self) -> dict[str, Any]:
        """For `--json`, `--record` and the screen: listening where, and what it received."""
        return {
            "listening": self._server is not None,
            "url": self.url,
            "reason": self.reason,
            "spans": self.store.received,
            "rejected": self.store.rejected,
            "servers": sorted(self.store.servers),
        }

    def try_start(self) -> bool:
        """`start`, but a taken port is a `reason` (the monitor keeps its histograms)."""
        try:
            self.start()
        except InputError as exc:
            self.reason = exc.message
            return False
        return True

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{TRACES_PATH}"

    def start(self) -> OtlpReceiver:
        """Listen (port 0 picks a free one). InputError names the port when it is taken."""
        try:
            server = _Server((self.host, self.port), _Handler)
        except OSError as exc:
            raise InputError(
                f"cannot receive traces on {self.host}:{self.port} ({exc.strerror or exc}).",
                hint="another monitor may hold it: pick another with --traces-port "
                "(and the servers' [metrics] traces URL), or --no-traces.",
            ) from None
        server.store = self.store
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.25}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
