"""Async streaming load generator for OpenAI-compatible servers (/v1/completions, chat completions).

The client is a small HTTP/1.1 implementation on an asyncio Protocol: every TCP read is parsed in
`data_received` (chunked framing -> SSE lines split at the byte level -> one `orjson.loads` per
`data:` line) and the arrival time and token count of each chunk are written straight into the
request's record; the awaiting coroutine is woken once per request, not once per chunk. That keeps
the client's CPU per streamed token below `vllm bench serve`'s aiohttp client (measured in
benchmarks/client_overhead.py, figures in benchmarks/RESULTS.md#bench).

Metric conventions follow `vllm bench serve` (see shared notes): a chunk is any SSE event carrying
`choices`; TTFT = first chunk - send; latency = last chunk - send; ITL = gaps between chunks; output
tokens from the usage chunk (`stream_options.include_usage`), per-chunk tokens from
`continuous_usage_stats` when the server sends them, else one per chunk.

Modes: closed loop (N workers, each running one session at a time: a sweep is a list of N) and open
loop (sessions arrive at `rate` per second, Poisson/gamma with a burstiness factor or constant,
optionally capped by a concurrency). Stop after `num_prompts` measured requests or `duration`
seconds, whichever comes first. A stop event (Ctrl-C) or a dead server ends the run early: requests
in flight are cancelled (recorded as such), every finished record is kept, and the result says why.
"""

from __future__ import annotations

import asyncio
import random
import ssl as _ssl
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from kimictl.runtime.clientlag import LagProbe
from kimictl.runtime.errors import InputError
from kimictl.runtime.workloads import FanOut, RequestSpec, Session, Workload, prompt_text

__all__ = [
    "ERROR_KINDS",
    "LoadPoint",
    "LoadTarget",
    "RecordList",
    "RequestRecord",
    "fetch_text",
    "run_load",
]

# Error kinds, counted separately in summaries.
ERROR_KINDS = (
    "http_429",  # rate limited
    "http_5xx",  # server error
    "http_4xx",  # bad request (prompt too long, unknown model, ...)
    "malformed_sse",  # a data: line that is not JSON, or a stream without [DONE]
    "connect",  # connection refused / unreachable
    "disconnect",  # the server closed the connection mid-response
    "timeout",  # no complete response within the request timeout
    "cancelled",  # stopped by Ctrl-C or an aborted run (not a server failure)
)

_MAX_ERROR_BODY = 2048


@dataclass(frozen=True)
class LoadTarget:
    """One endpoint under load. `url` is the server root (`http://host:port`, `/v1` allowed)."""

    name: str
    url: str
    model: str
    api_key: str | None = None
    gpus: int | None = None

    def __repr__(self) -> str:  # never print the key
        return f"LoadTarget(name={self.name!r}, url={self.url!r}, model={self.model!r})"


@dataclass(frozen=True)
class LoadPoint:
    """One point of a sweep: closed loop at `concurrency`, or open loop at `rate` req/s (capped by
    `concurrency` when both are set)."""

    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    arrivals: str = "poisson"  # poisson (gamma with shape=burstiness) | constant

    @property
    def label(self) -> str:
        if self.rate is None:
            return f"c={self.concurrency}"
        cap = f",c<={self.concurrency}" if self.concurrency else ""
        return f"rate={self.rate:g}{cap}"


@dataclass
class RequestRecord:
    """What happened to one request. Times are seconds; `start`/`end` count from the run's start,
    `ttft`, `latency` and `chunk_times` from the request's own send time."""

    target: str
    point: str
    repeat: int
    index: int
    warmup: bool
    session: int
    turn: int
    input_len: int
    output_len: int
    start: float = 0.0
    end: float = 0.0
    ttft: float | None = None
    latency: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    status: int = 0
    ok: bool = False
    error_kind: str | None = None
    error: str | None = None
    text_len: int = 0

    @property
    def prompt_len(self) -> int:
        return self.prompt_tokens if self.prompt_tokens is not None else self.input_len

    @property
    def tpot(self) -> float | None:
        """(latency - TTFT) / (output_tokens - 1), vllm bench's definition; None below 2 tokens."""
        if not self.ok or self.ttft is None or self.latency is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        t = self.chunk_times
        return [t[i] - t[i - 1] for i in range(1, len(t))]


class RecordList(list[RequestRecord]):
    """`run_load`'s result: the records, plus how the run ended and each point's time window."""

    def __init__(self) -> None:
        super().__init__()
        self.stop_reason: str | None = None  # None = ran to completion
        # (target, point, repeat) -> (start, end) seconds from the run's start, measured part only
        self.windows: dict[tuple[str, str, int], tuple[float, float]] = {}
        # (target, point, repeat) -> ((/metrics text, time.monotonic()) before, after); absent when
        # not scraped or the server has no /metrics
        self.metrics: dict[tuple[str, str, int], tuple[tuple[str, float], tuple[str, float]]] = {}
        self.max_concurrent: dict[tuple[str, str, int], int] = {}
        # (seconds from the run's start, ms) event-loop lag of the client during the run
        self.client_lag: list[tuple[float, float]] = []


# ---------------------------------------------------------------------------------------------
# HTTP/1.1 over an asyncio Protocol


class _Response:
    __slots__ = ("record", "t0", "status", "body", "done", "sse", "seen_done", "last_usage")

    def __init__(self, record: RequestRecord | None, t0: float, done: asyncio.Future[None]):
        self.record = record
        self.t0 = t0
        self.status = 0
        self.body = bytearray()  # non-stream body (errors, GET)
        self.done = done
        self.sse = b""  # unfinished SSE line
        self.seen_done = False
        self.last_usage = 0


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

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

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
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        if self.resp is None or self.resp.done.done():
            return
        now = time.perf_counter()
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
        buf = self._cbuf + data if self._cbuf else data
        pos = 0
        n = len(buf)
        while pos < n:
            if self._remaining > 0:
                take = min(self._remaining, n - pos)
                self._body(buf[pos : pos + take], now)
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._remaining = -2  # expect the CRLF after the chunk
                continue
            if self._remaining == -2:
                if n - pos < 2:
                    break
                pos += 2
                self._remaining = 0
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            try:
                size = int(buf[pos:eol].split(b";", 1)[0], 16)
            except ValueError:
                self._fail("malformed_sse", "bad chunked framing")
                return
            pos = eol + 2
            if size == 0:
                self._finish()
                return
            self._remaining = size
        self._cbuf = buf[pos:] if pos < n else b""

    def _body(self, data: bytes, now: float) -> None:
        resp = self.resp
        assert resp is not None
        if resp.status != 200 or not self._stream or resp.record is None:
            if len(resp.body) < 1 << 20:
                resp.body += data
            return
        buf = resp.sse + data if resp.sse else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            resp.sse = buf
            return
        resp.sse = buf[cut + 1 :]
        rec = resp.record
        for line in buf[:cut].split(b"\n"):
            if line[:5] != b"data:":
                continue  # blank separators, comments (":ping"), event:/id: fields
            payload = line[5:].strip()
            if payload == b"[DONE]":
                resp.seen_done = True
                continue
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                rec.error_kind = "malformed_sse"
                rec.error = f"data line is not JSON: {payload[:80]!r}"
                continue
            if not isinstance(obj, dict):
                rec.error_kind = "malformed_sse"
                rec.error = f"data line is not a JSON object: {payload[:80]!r}"
                continue
            usage = obj.get("usage")
            if obj.get("choices"):
                rel = now - resp.t0
                if rec.ttft is None:
                    rec.ttft = rel
                rec.chunk_times.append(rel)
                rec.latency = rel
                if usage:
                    total = usage.get("completion_tokens") or 0
                    rec.chunk_tokens.append(total - resp.last_usage)
                    resp.last_usage = total
                else:
                    rec.chunk_tokens.append(1)
                choice = obj["choices"][0]
                text = choice.get("text")
                if text is None:
                    text = (choice.get("delta") or {}).get("content")
                if text:
                    rec.text_len += len(text)
            elif "error" in obj:
                rec.error_kind = "http_5xx"
                rec.error = str(obj["error"])[:_MAX_ERROR_BODY]
            if usage:
                if usage.get("completion_tokens") is not None:
                    rec.output_tokens = int(usage["completion_tokens"])
                    resp.last_usage = rec.output_tokens
                if usage.get("prompt_tokens") is not None:
                    rec.prompt_tokens = int(usage["prompt_tokens"])

    def _finish(self) -> None:
        resp = self.resp
        if resp is not None and not resp.done.done():
            resp.done.set_result(None)
        if not self.keep_alive:
            self.close()

    def _fail(self, kind: str, message: str) -> None:
        resp = self.resp
        if resp is not None and resp.record is not None and resp.record.error_kind is None:
            resp.record.error_kind = kind
            resp.record.error = message
        self.keep_alive = False
        self.close()
        if resp is not None and not resp.done.done():
            resp.done.set_result(None)


class _Endpoint:
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
        base = parts.path.rstrip("/")
        self.prefix = base[:-3] if base.endswith("/v1") else base
        self.api_key = api_key
        self.idle: list[_Conn] = []
        self.host_header = f"{self.host}:{self.port}".encode()

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        ctx = _ssl.create_default_context() if self.tls else None
        _, conn = await loop.create_connection(_Conn, self.host, self.port, ssl=ctx)
        return conn

    def build(self, method: str, path: str, body: bytes | None) -> bytes:
        lines = [
            f"{method} {self.prefix}{path} HTTP/1.1".encode(),
            b"Host: " + self.host_header,
            b"User-Agent: kimictl-bench",
            b"Accept: */*",
        ]
        if self.api_key:
            lines.append(f"Authorization: Bearer {self.api_key}".encode())
        if body is not None:
            lines.append(b"Content-Type: application/json")
            lines.append(b"Content-Length: " + str(len(body)).encode())
        return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")

    async def request(
        self, data: bytes, record: RequestRecord | None, timeout: float, t0: float | None = None
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
    ep = _Endpoint(url, api_key)
    try:
        resp = await ep.request(ep.build("GET", path, None), None, timeout)
        if resp.status != 200:
            raise OSError(f"GET {path} answered HTTP {resp.status}")
        return resp.body.decode("utf-8", "replace")
    finally:
        ep.close()


# ---------------------------------------------------------------------------------------------
# Running a workload


def _payload(target: LoadTarget, spec: RequestSpec, chat: bool, ignore_eos: bool) -> bytes:
    body: dict[str, Any] = {
        "model": target.model,
        "max_tokens": spec.output_len,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = [{"role": "user", "content": prompt_text(spec)}]
    else:
        body["prompt"] = spec.prompt if spec.prompt is not None else prompt_text(spec)
    return orjson.dumps(body)


class _PointRun:
    """Runs one (target, point, repeat): issues sessions until the request budget or time is up."""

    def __init__(
        self,
        *,
        target: LoadTarget,
        endpoint: _Endpoint,
        point: LoadPoint,
        repeat: int,
        warmup: bool,
        sessions: Iterator[Session],
        num_prompts: int | None,
        duration: float | None,
        timeout: float,
        chat: bool,
        ignore_eos: bool,
        t_run: float,
        out: RecordList,
        stop: asyncio.Event,
        on_record: Callable[[RequestRecord], None] | None,
        rng: random.Random,
    ) -> None:
        self.target = target
        self.ep = endpoint
        self.point = point
        self.repeat = repeat
        self.warmup = warmup
        self.sessions = sessions
        self.budget = num_prompts
        self.deadline: float | None = None
        self.duration = duration
        self.timeout = timeout
        self.chat = chat
        self.ignore_eos = ignore_eos
        self.t_run = t_run
        self.out = out
        self.stop = stop
        self.on_record = on_record
        self.rng = rng
        self.issued = 0
        self.reserved = 0
        self.inflight = 0
        self.max_inflight = 0
        self.connect_failures = 0  # in a row
        self.last_connect_error = ""
        self.any_success = False
        self.abort: str | None = None
        self.first: float | None = None
        self.last: float = 0.0

    def _give_up(self) -> None:
        if not self.abort:
            self.abort = (
                f"{self.target.name} ({self.target.url}) stopped answering: "
                f"{self.connect_failures} connection failures in a row ({self.last_connect_error})"
            )

    def _exhausted(self) -> bool:
        """No further request, even inside a running session: stopped, aborted or out of time."""
        if self.stop.is_set() or self.abort:
            return True
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def _can_start(self) -> bool:
        """No new session once the started ones account for the request budget. Started sessions
        run to their end (a multi-turn run may issue up to one session more than the budget),
        so new sessions cannot eat the budget with first turns."""
        if self.budget is not None and self.reserved >= self.budget:
            return False
        return not self._exhausted()

    def _next_session(self) -> Session | None:
        try:
            sess = next(self.sessions)
        except StopIteration:
            return None
        self.reserved += sess.num_requests
        return sess

    async def _request(self, spec: RequestSpec, session: int, turn: int) -> None:
        rec = RequestRecord(
            target=self.target.name,
            point="warmup" if self.warmup else self.point.label,
            repeat=self.repeat,
            index=self.issued,
            warmup=self.warmup,
            session=session,
            turn=turn,
            input_len=spec.input_len,
            output_len=spec.output_len,
        )
        self.issued += 1
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        data = self.ep.build(
            "POST",
            "/v1/chat/completions" if self.chat else "/v1/completions",
            _payload(self.target, spec, self.chat, self.ignore_eos),
        )
        t0 = time.perf_counter()
        rec.start = t0 - self.t_run
        if self.first is None:
            self.first = rec.start
        try:
            resp = await self.ep.request(data, rec, self.timeout, t0)
            rec.status = resp.status
            if rec.error_kind is None:
                if resp.status == 429:
                    rec.error_kind = "http_429"
                elif resp.status >= 500:
                    rec.error_kind = "http_5xx"
                elif resp.status != 200:
                    rec.error_kind = "http_4xx"
                elif not resp.seen_done:
                    rec.error_kind = "malformed_sse"
                    rec.error = "the stream ended without data: [DONE]"
                if resp.status != 200 and rec.error_kind:
                    rec.error = f"HTTP {resp.status}: " + bytes(resp.body[:_MAX_ERROR_BODY]).decode(
                        "utf-8", "replace"
                    )
            if rec.error_kind is None and rec.output_tokens == 0:
                rec.output_tokens = sum(rec.chunk_tokens)
            rec.ok = rec.error_kind is None and rec.ttft is not None
            if rec.error_kind is None and not rec.ok:
                rec.error_kind = "malformed_sse"
                rec.error = "the stream carried no choices"
        except asyncio.CancelledError:
            rec.error_kind = "cancelled"
            rec.error = "cancelled before the response finished"
            rec.ok = False
            raise
        finally:
            rec.end = time.perf_counter() - self.t_run
            self.last = max(self.last, rec.end)
            self.inflight -= 1
            self.out.append(rec)
            if rec.ok:
                self.any_success = True
                self.connect_failures = 0
            elif rec.error_kind in ("connect", "disconnect"):
                self.connect_failures += 1
                self.last_connect_error = rec.error or rec.error_kind
                if self.connect_failures >= 3:
                    self._give_up()
            if self.on_record is not None:
                self.on_record(rec)

    async def _session(self, sess: Session) -> None:
        for turn, step in enumerate(sess.steps):
            if step.think_time > 0:
                await asyncio.sleep(step.think_time)
            if self._exhausted():
                return
            if isinstance(step, FanOut):
                await asyncio.gather(*(self._session(s) for s in step.sessions))
            else:
                await self._request(step, sess.id, turn)

    async def _closed(self, workers: int) -> None:
        async def worker() -> None:
            while self._can_start():
                sess = self._next_session()
                if sess is None:
                    return
                await self._session(sess)

        await asyncio.gather(*(worker() for _ in range(workers)))

    async def _open(self) -> None:
        point = self.point
        assert point.rate is not None
        cap = asyncio.Semaphore(point.concurrency) if point.concurrency else None
        tasks: set[asyncio.Task[None]] = set()

        async def run_one(sess: Session) -> None:
            if cap is None:
                await self._session(sess)
                return
            async with cap:
                await self._session(sess)

        t_start = time.perf_counter()
        due = 0.0
        while self._can_start():
            sess = self._next_session()
            if sess is None:
                break
            if sess.at is not None:  # replay: the trace's own clock
                due = sess.at
            else:
                due += _gap(point, self.rng)
            delay = t_start + due - time.perf_counter()
            if delay > 0:
                await _sleep_or_stop(delay, self.stop)
            if self._exhausted():
                break
            task = asyncio.create_task(run_one(sess))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def run(self) -> None:
        if self.duration is not None:
            self.deadline = time.perf_counter() + self.duration
        if self.point.rate is None:
            await self._closed(self.point.concurrency or 1)
        else:
            await self._open()
        # a point too short for 3 failures in a row must not pass as done when no request of it
        # ever got an answer and the last ones could not connect
        if not self.any_success and self.connect_failures:
            self._give_up()


def _gap(point: LoadPoint, rng: random.Random) -> float:
    rate = point.rate or 0.0
    if rate <= 0 or rate == float("inf"):
        return 0.0
    if point.arrivals == "constant":
        return 1.0 / rate
    # Gamma with shape k=burstiness and mean 1/rate; k=1 is Poisson (exponential gaps).
    k = point.burstiness
    return rng.gammavariate(k, 1.0 / (rate * k))


async def _sleep_or_stop(delay: float, stop: asyncio.Event) -> None:
    try:
        await asyncio.wait_for(stop.wait(), delay)
    except TimeoutError:
        pass


async def run_load(
    targets: Sequence[LoadTarget],
    workload: Workload,
    *,
    points: Sequence[LoadPoint],
    num_prompts: int | None = None,
    duration: float | None = None,
    warmup: int = 0,
    seed: int = 0,
    repeat: int = 1,
    timeout: float = 300.0,
    chat: bool = False,
    ignore_eos: bool = True,
    scrape_metrics: bool = False,
    interleave: bool = False,
    stop: asyncio.Event | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    on_point: Callable[[LoadTarget, LoadPoint, int], None] | None = None,
) -> RecordList:
    """Run `workload` against every target at every point, `repeat` times, and return every record.

    Each (target, point, repeat) gets the identical session sequence (the workload seeded with
    `seed`), so an A/B compares the same requests. Targets take turns point by point, in an order
    that alternates between points and repeats so slow drift does not favour one side; with
    `interleave` they run each point at the same time instead (both see the same drift; use it when
    the servers do not share hardware, and note the client's CPU is shared).
    """
    if not targets:
        raise InputError("no target to benchmark", hint="pass --target URL (or --ab)")
    if num_prompts is None and duration is None:
        raise InputError("give --num-prompts or --duration so the run has an end")
    if not points:
        raise InputError("no load point: give --concurrency or --rate")
    for p in points:
        if p.rate is None and (p.concurrency is None or p.concurrency < 1):
            raise InputError(f"concurrency {p.concurrency!r} must be a whole number >= 1")
        if p.rate is not None and p.rate <= 0:
            raise InputError(f"request rate {p.rate!r} must be > 0 requests/s")
        if p.burstiness <= 0:
            raise InputError(f"burstiness {p.burstiness!r} must be > 0 (1 = Poisson)")
        if p.arrivals not in ("poisson", "constant"):
            raise InputError(f"arrivals {p.arrivals!r} is not one of: poisson, constant")
    stop = stop or asyncio.Event()
    out = RecordList()
    endpoints = {t.name: _Endpoint(t.url, t.api_key) for t in targets}
    t_run = time.perf_counter()
    probe = LagProbe(t_run)  # is the client itself keeping up? (clientlag.py)
    probe.start()

    def point_run(
        t: LoadTarget,
        point: LoadPoint,
        *,
        repeat: int,
        warmup: bool,
        sessions_seed: int,
        num_prompts: int | None,
        duration: float | None,
        rng_seed: int,
    ) -> _PointRun:
        return _PointRun(
            target=t,
            endpoint=endpoints[t.name],
            point=point,
            repeat=repeat,
            warmup=warmup,
            sessions=workload.sessions(sessions_seed),
            num_prompts=num_prompts,
            duration=duration,
            timeout=timeout,
            chat=chat,
            ignore_eos=ignore_eos,
            t_run=t_run,
            out=out,
            stop=stop,
            on_record=on_record,
            rng=random.Random(rng_seed),
        )

    try:
        if warmup > 0:
            for t in targets:
                if stop.is_set() or out.stop_reason:
                    break
                pr = point_run(
                    t,
                    LoadPoint(concurrency=min(warmup, max(p.concurrency or 1 for p in points))),
                    repeat=0,
                    warmup=True,
                    sessions_seed=seed + 7919,
                    num_prompts=warmup,
                    duration=None,
                    rng_seed=seed,
                )
                await _run_point(pr, stop)
                if pr.abort and not pr.any_success:
                    out.stop_reason = pr.abort

        async def one(t: LoadTarget, point: LoadPoint, r: int, i: int) -> None:
            if on_point is not None:
                on_point(t, point, r)
            key = (t.name, point.label, r)
            before = await _scrape(t) if scrape_metrics else None
            pr = point_run(
                t,
                point,
                repeat=r,
                warmup=False,
                sessions_seed=seed,
                num_prompts=num_prompts,
                duration=duration,
                rng_seed=seed * 1000003 + i,
            )
            await _run_point(pr, stop)
            if pr.first is not None:
                out.windows[key] = (pr.first, pr.last)
            out.max_concurrent[key] = pr.max_inflight
            if before is not None:
                after = await _scrape(t)
                if after is not None:
                    out.metrics[key] = (before, after)
            if pr.abort and not out.stop_reason:
                out.stop_reason = pr.abort

        for r in range(repeat):
            for i, point in enumerate(points):
                if stop.is_set() or out.stop_reason:
                    break
                order = list(targets) if (r + i) % 2 == 0 else list(reversed(targets))
                if interleave:
                    await asyncio.gather(*(one(t, point, r, i) for t in order))
                    continue
                for t in order:
                    if stop.is_set() or out.stop_reason:
                        break
                    await one(t, point, r, i)
        if stop.is_set() and out.stop_reason is None:
            out.stop_reason = "interrupted"
    except asyncio.CancelledError:
        out.stop_reason = out.stop_reason or "interrupted"
    finally:
        for ep in endpoints.values():
            ep.close()
        await probe.stop()
        out.client_lag = probe.samples
    return out


async def _run_point(pr: _PointRun, stop: asyncio.Event) -> None:
    """Run one point; on the stop event, cancel what is in flight (it is recorded as cancelled)."""
    task = asyncio.ensure_future(pr.run())
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not task.done():
            task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass


async def _scrape(t: LoadTarget) -> tuple[str, float] | None:
    try:
        text = await fetch_text(t.url, "/metrics", api_key=t.api_key)
    except (OSError, TimeoutError):
        return None
    return text, time.monotonic()
