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

The receiver faces any client on its port, so everything it holds is bounded: a body's size
whatever its framing (Content-Length or chunked) and once gunzipped (decompressed as a stream,
stopped at the cap), the bodies held at once over all connections, the handler threads (more
clients wait in a listen backlog sized for a fleet), the spans kept. Spans whose figures are out of
range (a negative or absurd latency or count, a finish time ahead of this clock) are refused and
counted by figure (`status()["spans_refused"]`), never entered into a percentile. A client that
hangs up or stalls is dropped and counted, without a traceback.
"""

from __future__ import annotations

import bisect
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    "MAX_DECODED_BYTES",
    "BodyTooLarge",
    "OtlpReceiver",
    "TRACES",
    "TraceStore",
    "TracedRequest",
    "apply_traces",
    "decode_export",
    "gunzip",
    "percentile",
    "server_key_matches",
    "traced_figures",
]

TRACES = "traces"
HISTOGRAMS = "histograms"
# One export body as sent and once gunzipped. The SDK's batch of 512 vLLM spans is ~0.27 MB of
# protobuf; the 8 MiB cap also bounds a decode's own memory (JSON expands ~9x in Python objects).
MAX_BODY_BYTES = 8 << 20
MAX_DECODED_BYTES = 8 << 20
BODY_BUDGET_BYTES = 32 << 20  # bodies held at once, all connections (beyond: 503, the SDK retries)
MAX_CONNECTIONS = 128  # handler threads; further clients wait in the listen backlog
LISTEN_BACKLOG = 1024  # a fleet's servers connecting at once are queued, not refused
IO_TIMEOUT_S = 10.0  # a client silent this long (mid-request or between requests) is dropped
MAX_KEPT = 200_000  # spans kept over every server (~60 MB): a flood is refused, not stored
# Sane ranges of a span's figures: anything outside is refused and counted by figure.
MAX_LATENCY_S = 86_400.0  # a day: no request of a live server takes longer
MAX_TOKENS = 1 << 24  # 16.7 M tokens, 16x K3's longest context
MAX_AHEAD_S = 600.0  # a finish time this far ahead of this clock is no clock skew
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
    arrived_at: float | None = None  # the span's start: vLLM's arrival time
    # the W3C trace id the client sent in `traceparent` (vLLM's span continues that trace), or
    # None when the span opened its own trace
    session_id: str | None = None

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


class _OutOfRange(ValueError):
    """A span figure outside its sane range; `args[0]` names the figure."""


def _number(attrs: Mapping[str, Any], key: str, figure: str, top: float) -> float | None:
    """The attribute as a number in [0, top]; None when absent; _OutOfRange(figure) otherwise."""
    v = attrs.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= top:
        raise _OutOfRange(figure)  # also NaN and infinities, and text where a number belongs
    return float(v)


def _seconds(attrs: Mapping[str, Any], key: str, figure: str) -> float | None:
    return _number(attrs, key, figure, MAX_LATENCY_S)


def _count(attrs: Mapping[str, Any], key: str, figure: str) -> int | None:
    v = _number(attrs, key, figure, MAX_TOKENS)
    return None if v is None else int(v)


def _request(span: Any, server: str, now: float) -> TracedRequest | None:
    """One span as a finished request (None: not a request); _OutOfRange names a bad figure."""
    attrs = _attributes(span.attributes)
    if attrs.get(SPAN_E2E) is None:
        return None
    e2e = _seconds(attrs, SPAN_E2E, "e2e")
    ttft = _seconds(attrs, SPAN_TTFT, "ttft")
    if ttft is not None and e2e is not None and ttft > e2e + 1.0:
        raise _OutOfRange("ttft")  # a first token after the request ended (1 s for clock steps)
    start = span.start_time_unix_nano / 1e9
    finished_at = start + (e2e or 0.0) if start > 0 else span.end_time_unix_nano / 1e9
    if finished_at > now + MAX_AHEAD_S:
        raise _OutOfRange("time")
    rid = attrs.get(SPAN_REQUEST_ID)
    return TracedRequest(
        server=server,
        finished_at=finished_at,
        ttft_s=ttft,
        e2e_s=e2e,
        queue_s=_seconds(attrs, SPAN_QUEUE_TIME, "queue"),
        decode_s=_seconds(attrs, SPAN_DECODE_TIME, "decode"),
        prompt_tokens=_count(attrs, SPAN_PROMPT_TOKENS, "prompt_tokens"),
        output_tokens=_count(attrs, SPAN_OUTPUT_TOKENS, "output_tokens"),
        request_id=None if rid is None else str(rid)[:256],
        arrived_at=start if start > 0 else None,
        session_id=span.trace_id.hex() if span.parent_span_id else None,
    )


def decode_export(
    body: bytes, content_type: str, *, refused: dict[str, int] | None = None
) -> list[TracedRequest]:
    """An OTLP/HTTP ExportTraceServiceRequest (protobuf or JSON) -> its finished requests.

    Spans without vLLM's request latency (`names.SPAN_E2E`) are not requests and are skipped;
    spans with a figure out of its sane range are left out and counted in `refused` by figure.
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
    now = time.time()
    for resource_spans in message.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        server = str(resource.get(INSTANCE_ATTRIBUTE) or resource.get("service.name") or "")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                try:
                    request = _request(span, server[:256], now)
                except _OutOfRange as bad:
                    if refused is not None:
                        refused[bad.args[0]] = refused.get(bad.args[0], 0) + 1
                    continue
                if request is not None:
                    out.append(request)
    return out


class BodyTooLarge(ValueError):
    """A body over MAX_BODY_BYTES as sent, or over MAX_DECODED_BYTES once gunzipped."""


def gunzip(body: bytes, *, limit: int = MAX_DECODED_BYTES) -> bytes:
    """`body` gunzipped as a stream (every member), stopped as soon as the output passes `limit`
    (BodyTooLarge): a small bomb never expands in memory. ValueError on a bad or cut stream."""
    out = bytearray()
    data = body
    while data:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += inflater.decompress(data, limit + 1 - len(out))
        except zlib.error as exc:
            raise ValueError(f"not a gzip stream ({exc})") from None
        if len(out) > limit:
            raise BodyTooLarge(f"more than {limit} bytes once gunzipped")
        if not inflater.eof:
            raise ValueError("the gzip stream is cut short")
        data = inflater.unused_data
    return bytes(out)


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
    max_kept: int = MAX_KEPT
    _by_server: dict[str, list[TracedRequest]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _kept: int = 0
    received: int = 0  # spans taken, all senders, since the start
    rejected: int = 0  # bodies refused (undecodable, too large, wrong type)
    # called with each batch after it is stored (a capture: observe.capture), receiver's thread
    listeners: list[Callable[[Sequence[TracedRequest]], None]] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)  # spans left out, by figure
    hangups: int = 0  # connections the client ended or stalled mid-request

    def count(
        self, *, rejected: int = 0, hangups: int = 0, refused: Mapping[str, int] | None = None
    ) -> None:
        """Add to the counters (from any receiver thread)."""
        with self._lock:
            self.rejected += rejected
            self.hangups += hangups
            for figure, n in (refused or {}).items():
                self.refused[figure] = self.refused.get(figure, 0) + n

    @property
    def servers(self) -> set[str]:
        with self._lock:
            return set(self._by_server)

    def add(self, requests: Sequence[TracedRequest], *, now: float | None = None) -> None:
        horizon = (time.time() if now is None else now) - self.keep_s
        with self._lock:
            for server, kept in list(self._by_server.items()):
                old = bisect.bisect_left(kept, horizon, key=_finished)
                if old:
                    del kept[:old]
                    self._kept -= old
                if not kept:
                    del self._by_server[server]  # a sender gone for keep_s leaves no key behind
            room = max(0, self.max_kept - self._kept)
            if len(requests) > room:
                self.refused["store_full"] = (
                    self.refused.get("store_full", 0) + len(requests) - room
                )
                requests = requests[:room]
            self.received += len(requests)
            for r in requests:
                if r.finished_at < horizon:
                    continue  # taken (counted) but already out of every window
                kept = self._by_server.setdefault(r.server, [])
                self._kept += 1
                if not kept or kept[-1].finished_at <= r.finished_at:
                    kept.append(r)  # the usual case: batches arrive in finish order
                else:
                    bisect.insort(kept, r, key=_finished)
        for listener in self.listeners:
            listener(requests)

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
class _Hangup(Exception):
    """The client ended the connection (or went silent) in the middle of a request."""


class _Budget:
    """Bytes of bodies held at once, over every connection: `take` says no instead of waiting."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.held -= n


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: the SDK's exporter reuses its connection
    timeout = IO_TIMEOUT_S  # the socket's: a stalled client ends its connection, not a thread

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a monitor screen has no room for an access log

    def _reply(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        if self.server.crowded():
            self.close_connection = True  # free the thread for the clients waiting to connect
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if status == 503:
            self.send_header("Retry-After", "1")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, status: int, why: str) -> None:
        """Count the body as rejected, say why, and end the connection (its body may be unread)."""
        self.server.store.count(rejected=1)
        self.close_connection = True
        self._reply(status, why.encode())

    def _read(self, n: int) -> bytes:
        data = self.rfile.read(n)
        if len(data) < n:
            raise _Hangup
        return data

    def _hold(self, held: list[int], size: int, more: int) -> bool:
        """Room for `more` bytes of a body already `size` long: under the cap and within the
        budget (`held` counts what was taken); False when refused (the reply is sent)."""
        if size + more > MAX_BODY_BYTES:
            self._refuse(413, f"body over {MAX_BODY_BYTES} bytes")
            return False
        if not self.server.budget.take(more):
            self._refuse(503, "busy with other bodies; retry")
            return False
        held[0] += more
        return True

    def _read_body(self, held: list[int]) -> bytes | None:
        """The body, whatever its framing, within MAX_BODY_BYTES and the receiver's budget;
        None when refused (the reply is sent)."""
        framing = (self.headers.get("Transfer-Encoding") or "").strip().lower()
        if framing and framing != "chunked":
            self._refuse(501, f"Transfer-Encoding {framing} is not received; send chunked or none")
            return None
        if not framing:
            text = (self.headers.get("Content-Length") or "0").strip()
            if not (text.isascii() and text.isdigit()):  # also "-1": read to the stream's end
                self._refuse(400, f"Content-Length {text[:32]!r} is not a number of bytes")
                return None
            length = int(text) if len(text) < 12 else MAX_BODY_BYTES + 1
            return self._read(length) if self._hold(held, 0, length) else None
        body = bytearray()
        while True:  # chunked: hex size line, data, CRLF ... a zero size, trailers, a blank line
            line = self.rfile.readline(1026)
            if not line.endswith(b"\n"):
                if len(line) < 1026:
                    raise _Hangup
                self._refuse(400, "a chunk size line over 1 KiB")
                return None
            size_text = line.split(b";", 1)[0].strip()
            if not size_text or any(c not in b"0123456789abcdefABCDEF" for c in size_text):
                self._refuse(400, "a chunk size is not hex")
                return None
            size = int(size_text, 16)
            if size == 0:
                for _ in range(64):  # trailer fields, bounded
                    if self.rfile.readline(8192) in (b"\r\n", b"\n", b""):
                        return bytes(body)
                self._refuse(400, "too many trailer fields")
                return None
            if not self._hold(held, len(body), size):
                return None
            body += self._read(size)
            if self._read(2) != b"\r\n":
                self._refuse(400, "a chunk does not end in CRLF")
                return None

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != TRACES_PATH:
            self.close_connection = True  # its body stays unread
            self._reply(404, f"only {TRACES_PATH} is received here".encode())
            return
        content_type = self.headers.get("Content-Type") or _PROTOBUF
        if content_type.split(";", 1)[0].strip().lower() not in (_PROTOBUF, _JSON):
            self._refuse(415, f"send {_PROTOBUF} or {_JSON}")
            return
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding not in ("gzip", "identity"):
            self._refuse(415, f"Content-Encoding {encoding} is not received; send gzip or none")
            return
        held = [0]
        try:
            body = self._read_body(held)
            if body is None:
                return
            refused: dict[str, int] = {}
            try:
                with self.server.decoding:  # one body expanded at a time: memory, not speed
                    if encoding == "gzip":
                        body = gunzip(body)
                    requests = decode_export(body, content_type, refused=refused)
            except BodyTooLarge as exc:
                self._refuse(413, str(exc))
                return
            except ValueError as exc:
                self._refuse(400, str(exc))
                return
        except _Hangup:
            self.server.store.count(hangups=1)
            self.close_connection = True
            return
        finally:
            self.server.budget.give(held[0])
        self.server.store.count(refused=refused)
        self.server.store.add(requests)
        self._reply(200, *export_response(content_type))


class _Server(ThreadingHTTPServer):
    """At most MAX_CONNECTIONS handler threads; the accept loop waits for a free one, while the
    kernel queues up to LISTEN_BACKLOG more connections."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG
    store: TraceStore

    def __init__(self, address: tuple[str, int], handler: type[_Handler]) -> None:
        super().__init__(address, handler)
        self.budget = _Budget(BODY_BUDGET_BYTES)
        self.decoding = threading.Lock()
        self.closing = False
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._active = 0
        self._active_lock = threading.Lock()

    def crowded(self) -> bool:
        """Half the threads busy: answer and close rather than keep an idle connection open."""
        return self._active > MAX_CONNECTIONS // 2

    def process_request(self, request: Any, client_address: Any) -> None:
        while not self._slots.acquire(timeout=0.25):
            if self.closing:
                self.shutdown_request(request)
                return
        with self._active_lock:
            self._active += 1
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self._release()

    def _release(self) -> None:
        with self._active_lock:
            self._active -= 1
        self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up (reset, broken pipe, timeout) is counted, not printed."""
        if isinstance(sys.exc_info()[1], OSError):
            self.store.count(hangups=1)
            return
        super().handle_error(request, client_address)


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
            "spans_refused": dict(self.store.refused),
            "hangups": self.store.hangups,
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
            self._server.closing = True
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
