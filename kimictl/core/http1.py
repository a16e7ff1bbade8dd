"""The one HTTP/1.1 client of bench and monitor: keep-alive connections on an asyncio Protocol.

A GET (/metrics scrapes, /v1/models) returns the body. A streamed completion (bench) is stamped as
it arrives and its JSON decoded later, many events at once. `data_received` takes the time first
(one clock call per socket read); a read that is one whole HTTP chunk (the usual case; any other
takes the general framing parse) then only keeps its complete SSE lines as raw bytes, with the
read's time and a byte count of their `data:` lines: no JSON and no callback per read, so a read's
stamp waits for little more than a few slices of the reads before it in the same loop turn. Every
DECODE_EVENTS events (in a callback after the turn's reads are stamped; streams in step take
turns) and when the response ends, `_Response.decode` turns the kept lines into the arrival time
and token count of each chunk in the request's record. The awaiting coroutine is woken once per
request, not once per chunk. Client CPU per streamed token: lab/bench/client_overhead.py and
lab/bench/client_cpu_ab.py, figures in docs/results.md.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl as _ssl
import time
from typing import Protocol, cast
from urllib.parse import urlsplit

import orjson

from kimictl.core.apikeys import bearer_headers
from kimictl.core.errors import InputError
from kimictl.core.urls import server_root

__all__ = [
    "MAX_ERROR_BODY",
    "OWN_REQUEST_PREFIX",
    "BlockingClient",
    "Endpoint",
    "StreamRecord",
    "fetch_text",
    "is_own_request",
    "own_request_headers",
]

MAX_ERROR_BODY = 2048

# kimictl's own requests to a server (readiness probe, multi-node heartbeat, validate, bench's
# warm-up) carry `X-Request-Id: OWN_REQUEST_PREFIX<kind>-<hex>`. vLLM makes the header the base of
# its request id (`cmpl-<id>-0`, `chatcmpl-<id>`), so a capture or a verdict reading the spans
# leaves them out (`is_own_request`).
OWN_REQUEST_PREFIX = "kimictl-own-"
_SPAN_ID_HEADS = ("chatcmpl-", "cmpl-")


def own_request_headers(kind: str) -> dict[str, str]:
    """The X-Request-Id of one of kimictl's own requests of `kind` (probe, heartbeat, ...)."""
    import secrets

    return {"X-Request-Id": f"{OWN_REQUEST_PREFIX}{kind}-{secrets.token_hex(6)}"}


def is_own_request(request_id: str | None) -> bool:
    """Is a request id (as sent, or as vLLM's span names it) one of kimictl's own requests?"""
    if not request_id:
        return False
    for head in _SPAN_ID_HEADS:
        if request_id.startswith(head):
            request_id = request_id[len(head) :]
            break
    return request_id.startswith(OWN_REQUEST_PREFIX)


class StreamRecord(Protocol):
    """What the client fills in as a streamed completion arrives (load's request records are
    such). Times are seconds from the request's send time; an error leaves its kind and a
    sentence."""

    ttft: float | None
    latency: float | None
    chunk_times: list[float]
    chunk_tokens: list[int]  # tokens per chunk, from the usage counts when the server sends them
    text_len: int
    output_tokens: int
    prompt_tokens: int | None
    error_kind: str | None
    error: str | None


# ---------------------------------------------------------------------------------------------
# HTTP/1.1 over an asyncio Protocol


# Events decoded at once while a response streams: enough to amortise the decode, few enough that
# one decode (~1 us an event) holds the loop, and so the next reads' stamps, only tens of us.
DECODE_EVENTS = 32
# Streams started together stay in step; each response's first decode comes after its own share
# of DECODE_EVENTS (0-31 events), so their decodes fall in different loop turns, not all in one.
_stagger = itertools.count()


class _Response:
    __slots__ = (
        "record",
        "t0",
        "status",
        "body",
        "done",
        "sse",
        "seen_done",
        "last_usage",
        "error",
        "t_last",
        "blocks",
        "stamps",
        "decode_due",
        "decode_at",
    )

    def __init__(self, record: StreamRecord | None, t0: float, done: asyncio.Future[None]):
        self.record = record
        self.t0 = t0
        self.status = 0
        self.body = bytearray()  # non-stream body (errors, GET)
        self.done = done
        self.sse = b""  # unfinished SSE line
        self.seen_done = False
        self.last_usage = 0
        self.decode_due = False  # a decode is scheduled
        self.decode_at = 1 + next(_stagger) % DECODE_EVENTS  # kept events that call for one
        self.error: str | None = None  # why a request without a record failed
        self.t_last = t0  # perf_counter of the last read of this response
        self.blocks: list[bytes] = []  # complete SSE lines of a read, not yet decoded
        self.stamps: list[float] = []  # per data line in `blocks`: its read's time

    def feed(self, data: bytes, now: float) -> None:
        """A read's SSE bytes: keep its complete lines raw, with the read's time."""
        buf = self.sse + data if self.sse else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            self.sse = buf
            return
        self.sse = buf[cut + 1 :]
        block = buf[:cut]
        # a raw newline only ends a line (JSON escapes its own), so this counts the data lines
        n = block.count(b"\ndata:") + (block[:5] == b"data:")
        if n:
            self.blocks.append(block)
            if n == 1:
                self.stamps.append(now)
            else:
                self.stamps.extend([now] * n)
            if len(self.stamps) >= self.decode_at and not self.decode_due:
                # after the reads this loop turn stamps, not before them
                self.decode_due = True
                self.done.get_loop().call_soon(self.decode)

    def decode(self) -> None:
        """Turn the kept SSE lines into the record: chunk times and tokens, usage, errors."""
        self.decode_due = False
        self.decode_at = DECODE_EVENTS
        if not self.blocks:
            return
        rec = self.record
        assert rec is not None
        lines = b"\n".join(self.blocks).split(b"\n")
        stamps = self.stamps
        self.blocks, self.stamps = [], []
        payloads = [line[5:].strip() for line in lines if line[:5] == b"data:"]
        loads = orjson.loads
        try:
            objs = [loads(p) if p != b"[DONE]" else None for p in payloads]
        except orjson.JSONDecodeError:
            objs = []
            for p in payloads:
                try:
                    objs.append(loads(p) if p != b"[DONE]" else None)
                except orjson.JSONDecodeError:
                    objs.append(_BAD)
        t0 = self.t0
        times: list[float] = []
        tokens: list[int] = []
        add_time, add_tokens = times.append, tokens.append
        last = self.last_usage
        text_len = 0
        for obj, now, payload in zip(objs, stamps, payloads, strict=True):
            if type(obj) is not dict:
                if obj is None:
                    self.seen_done = True
                else:
                    rec.error_kind = "malformed_sse"
                    rec.error = (
                        f"data line is not JSON: {payload[:80]!r}"
                        if obj is _BAD
                        else f"data line is not a JSON object: {payload[:80]!r}"
                    )
                continue
            usage = obj.get("usage")
            choices = obj.get("choices")
            if choices:
                add_time(now - t0)
                if usage:
                    total = usage.get("completion_tokens") or 0
                    add_tokens(total - last)
                    last = total
                else:
                    add_tokens(1)
                choice = choices[0]
                text = choice.get("text")
                if text is None:
                    text = (choice.get("delta") or {}).get("content")
                if text:
                    text_len += len(text)
            elif "error" in obj:
                rec.error_kind = "http_5xx"
                rec.error = str(obj["error"])[:MAX_ERROR_BODY]
            if usage:
                done = usage.get("completion_tokens")
                if done is not None:
                    rec.output_tokens = last = int(done)
                if usage.get("prompt_tokens") is not None:
                    rec.prompt_tokens = int(usage["prompt_tokens"])
        self.last_usage = last
        rec.text_len += text_len
        if times:
            if rec.ttft is None:
                rec.ttft = times[0]
            rec.latency = times[-1]
            rec.chunk_times += times
            rec.chunk_tokens += tokens


_BAD = object()  # a data line that is not JSON


class _Conn(asyncio.Protocol):
    """One keep-alive connection; parses the response as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.keep_alive = True
        self.resp: _Response | None = None
        self.got_bytes = False
        self._head = b""
        self._in_head = True
        self._mode = ""  # chunked | length | close
        self._remaining = 0  # length mode: body bytes left; chunked: bytes left in this chunk
        self._cbuf = b""  # chunked framing buffer
        self._stream = False
        self._sse_chunks = False  # a chunked 200 event stream read into a record

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport; uvloop's is not an asyncio.Transport subclass, so no isinstance
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        resp = self.resp
        if resp is None or resp.done.done():
            return
        if self._mode == "close" and not self._in_head:
            self._finish()
            return
        if self.got_bytes:
            self._fail("disconnect", "the server closed the connection mid-response")
        else:
            self._fail("disconnect", "the server closed the connection before answering")

    def send(self, data: bytes, resp: _Response) -> None:
        self.resp = resp
        self.got_bytes = False
        self._head = b""
        self._in_head = True
        self._mode = ""
        self._cbuf = b""
        self._stream = False
        self._sse_chunks = False
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()  # first: the stamp is as close to the read as Python gets
        self.got_bytes = True
        resp = self.resp
        # fast path: a streamed response's read that is exactly one whole HTTP chunk
        if self._sse_chunks and not self._cbuf and self._remaining == 0 and resp is not None:
            eol = data.find(b"\r\n", 0, 10)
            if eol > 0 and data[-2:] == b"\r\n":
                try:
                    size = int(data[:eol], 16)
                except ValueError:
                    size = -1
                if size > 0 and len(data) == eol + size + 4:
                    resp.t_last = now
                    resp.feed(data[eol + 2 : -2], now)
                    return
        self._read(data, now)

    def _read(self, data: bytes, now: float) -> None:
        if self.resp is None or self.resp.done.done():
            return
        self.resp.t_last = now
        if self._in_head:
            # a late CRLF ending the previous chunked body may precede the status line
            self._head = (self._head + data).lstrip(b"\r\n")
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > 65536:
                    self._fail("malformed_sse", "response head larger than 64 KiB")
                return
            data = self._head[end + 4 :]
            if not self._parse_head(self._head[:end]):
                return
            self._in_head = False
            self._head = b""
        if self._mode == "chunked":
            self._feed_chunked(data, now)
        elif self._mode == "length":
            take = data[: self._remaining]
            self._remaining -= len(take)
            self._body(take, now)
            if self._remaining <= 0:
                self._finish()
        else:
            self._body(data, now)

    # parsing
    def _parse_head(self, head: bytes) -> bool:
        resp = self.resp
        assert resp is not None
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        try:
            resp.status = int(parts[1])
        except (IndexError, ValueError):
            self._fail("malformed_sse", f"not an HTTP response: {lines[0][:80]!r}")
            return False
        length = None
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value:
                chunked = True
            elif name == b"connection" and value == b"close":
                self.keep_alive = False
            elif name == b"content-type" and value.startswith(b"text/event-stream"):
                self._stream = True
        if chunked:
            self._mode = "chunked"
            self._sse_chunks = self._stream and resp.status == 200 and resp.record is not None
        elif length is not None:
            self._mode = "length"
            self._remaining = length
            if length == 0:
                self._finish()
                return False
        else:
            self._mode = "close"
            self.keep_alive = False
        return True

    def _feed_chunked(self, data: bytes, now: float) -> None:
        """Undo the chunked framing of one read; its payload goes to `_body` in one piece."""
        buf = self._cbuf + data if self._cbuf else data
        pos = 0
        n = len(buf)
        remaining = self._remaining
        pieces: list[bytes] = []
        end = False
        while pos < n:
            if remaining > 0:
                take = remaining if remaining < n - pos else n - pos
                pieces.append(buf[pos : pos + take])
                pos += take
                remaining -= take
                if remaining == 0:
                    remaining = -2  # expect the CRLF after the chunk
                continue
            if remaining == -2:
                if n - pos < 2:
                    break
                pos += 2
                remaining = 0
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            try:
                size = int(buf[pos:eol].split(b";", 1)[0], 16)
            except ValueError:
                self._remaining = remaining
                self._body_pieces(pieces, now)
                self._fail("malformed_sse", "bad chunked framing")
                return
            pos = eol + 2
            if size == 0:
                end = True
                break
            remaining = size
        self._remaining = remaining
        self._cbuf = buf[pos:] if pos < n and not end else b""
        self._body_pieces(pieces, now)
        if end:
            self._finish()

    def _body_pieces(self, pieces: list[bytes], now: float) -> None:
        if pieces:
            self._body(pieces[0] if len(pieces) == 1 else b"".join(pieces), now)

    def _body(self, data: bytes, now: float) -> None:
        resp = self.resp
        assert resp is not None
        if resp.status != 200 or not self._stream or resp.record is None:
            if resp.record is None or len(resp.body) < 1 << 20:  # a GET keeps its whole body
                resp.body += data
            return
        resp.feed(data, now)

    def _finish(self) -> None:
        resp = self.resp
        if resp is not None and not resp.done.done():
            if resp.record is not None:
                resp.decode()
            resp.done.set_result(None)
        self._sse_chunks = False
        if not self.keep_alive:
            self.close()

    def _fail(self, kind: str, message: str) -> None:
        resp = self.resp
        self._sse_chunks = False
        if resp is not None and resp.record is not None and not resp.done.done():
            resp.decode()
        if resp is not None and resp.record is not None and resp.record.error_kind is None:
            resp.record.error_kind = kind
            resp.record.error = message
        if resp is not None and resp.record is None and resp.error is None:
            resp.error = message
        self.keep_alive = False
        self.close()
        if resp is not None and not resp.done.done():
            resp.done.set_result(None)


class Endpoint:
    """A pool of keep-alive connections to one server."""

    def __init__(self, url: str, api_key: str | None) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InputError(
                f"target URL {url!r} is not http(s)://HOST[:PORT]",
                hint="pass e.g. --target http://127.0.0.1:8000",
            )
        self.host = parts.hostname
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = server_root(parts.path)
        self.api_key = api_key
        self.idle: list[_Conn] = []
        self.host_header = f"{self.host}:{self.port}".encode()

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        ctx = _ssl.create_default_context() if self.tls else None
        _, conn = await loop.create_connection(_Conn, self.host, self.port, ssl=ctx)
        return conn

    def build(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        lines = [
            f"{method} {self.prefix}{path} HTTP/1.1".encode(),
            b"Host: " + self.host_header,
            b"User-Agent: kimictl-bench",
            b"Accept: */*",
        ]
        lines += [f"{k}: {v}".encode() for k, v in bearer_headers(self.api_key).items()]
        lines += [f"{k}: {v}".encode() for k, v in (headers or {}).items()]
        if body is not None:
            lines.append(b"Content-Type: application/json")
            lines.append(b"Content-Length: " + str(len(body)).encode())
        return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")

    async def request(
        self, data: bytes, record: StreamRecord | None, timeout: float, t0: float | None = None
    ) -> _Response:
        """Send one request and wait for its whole response. Errors land in the record (or raise
        OSError/TimeoutError when there is no record)."""
        loop = asyncio.get_running_loop()
        for attempt in range(2):
            reused = False
            conn: _Conn | None = None
            while self.idle:
                c = self.idle.pop()
                if not c.closed:
                    conn, reused = c, True
                    break
            if t0 is None or attempt:
                t0 = time.perf_counter()
            resp = _Response(record, t0, loop.create_future())
            try:
                if conn is None:
                    conn = await asyncio.wait_for(self._connect(), timeout)
                conn.send(data, resp)
                await asyncio.wait_for(asyncio.shield(resp.done), timeout)
            except (OSError, TimeoutError) as exc:
                if conn is not None:
                    conn.close()
                if record is not None:
                    resp.decode()  # what arrived before the error stays in the record
                if record is None:
                    raise
                if record.error_kind is None:
                    if isinstance(exc, TimeoutError):
                        record.error_kind = "timeout"
                        record.error = f"no complete response within {timeout:g} s"
                    else:
                        record.error_kind = "connect"
                        record.error = f"cannot connect to {self.host}:{self.port}: {exc}"
                return resp
            except asyncio.CancelledError:
                if conn is not None:
                    conn.close()
                if record is not None:
                    resp.decode()
                raise
            # A reused keep-alive connection the server had just closed: retry once, fresh.
            if reused and resp.status == 0 and not conn.got_bytes and attempt == 0:
                if record is not None:
                    record.error_kind = record.error = None
                continue
            if not conn.closed and conn.keep_alive:
                self.idle.append(conn)
            return resp
        return resp

    def close(self) -> None:
        for c in self.idle:
            c.close()
        self.idle.clear()


async def fetch_text(
    url: str, path: str, *, api_key: str | None = None, timeout: float = 5.0
) -> str:
    """GET `path` (e.g. /metrics) from a server; raises OSError/TimeoutError when it cannot."""
    ep = Endpoint(url, api_key)
    try:
        resp = await ep.request(ep.build("GET", path, None), None, timeout)
        if resp.status != 200:
            raise OSError(f"GET {path} answered HTTP {resp.status}")
        return resp.body.decode("utf-8", "replace")
    finally:
        ep.close()


class BlockingClient:
    """Blocking requests for callers without an event loop (the launcher's readiness probes, the
    evals client): one loop, and one keep-alive connection per (server, key), for the client's
    life. Not for use inside a running event loop."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._endpoints: dict[tuple[str, str | None], Endpoint] = {}

    def request(
        self,
        url: str,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        api_key: str | None = None,
        timeout: float,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """(status, body) of one request. OSError when it cannot connect or the connection
        breaks, TimeoutError when the whole response does not arrive within `timeout`."""
        endpoint = self._endpoints.get((url, api_key))
        if endpoint is None:
            endpoint = self._endpoints[(url, api_key)] = Endpoint(url, api_key)
        response = self._loop.run_until_complete(
            endpoint.request(endpoint.build(method, path, body, headers), None, timeout)
        )
        if not response.status:
            raise OSError(response.error or "the connection closed before a response")
        return response.status, bytes(response.body)

    def close(self) -> None:
        for endpoint in self._endpoints.values():
            endpoint.close()
        self._loop.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
