"""The span receiver (runtime/observe/otlp.py) against hostile clients, in a process of its own.

The receiver runs in a child Python process, as `kimictl monitor` runs it; its peak resident
memory is the kernel's own figure (VmHWM in /proc/PID/status), its stderr is where a traceback
would land. Every input of issue 45 is sent over real sockets: a gzip bomb (one member and a
thousand), `Content-Length: -1` and chunked bodies of 300 MiB, bodies larger than the cap sent
by many clients at once, a body at the cap in JSON (the costliest decode), a flood of valid spans
beyond what the store keeps, spans with negative and absurd figures, clients that hang up or
reset mid-request; then random mutations of protobuf, JSON and gzip bodies (hypothesis). The
receiver must answer each with the status OTLP/HTTP names, keep every sane span, count every
refused one by figure, print no traceback, and stay under 256 MB. A thousand clients connecting
at once must all be answered within seconds (a listen backlog of 5 took 183 s).
"""

from __future__ import annotations

import gzip
import json
import os
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from test_otlp import export as otlp_export
from test_otlp import vllm_span

from kimictl.runtime.observe.otlp import MAX_BODY_BYTES, MAX_DECODED_BYTES, MAX_KEPT

RSS_LIMIT_KB = 256 * 1024  # issue 45: peak RSS under the hostile inputs below 256 MB
PB = "application/x-protobuf"
JSON = "application/json"

# The receiver as `kimictl monitor` runs it; "status" on stdin prints its status and VmHWM.
CHILD = """
import json, sys
from kimictl.runtime.observe.otlp import OtlpReceiver
receiver = OtlpReceiver(port=0).start()
print(receiver.port, flush=True)
for line in sys.stdin:
    hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")][0]
    print(json.dumps({**receiver.status(), "hwm_kb": hwm}), flush=True)
receiver.close()
"""


class Child:
    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def status(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("status\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> str:
        """End the child; its stderr."""
        _, err = self.proc.communicate(timeout=30)
        return err


@pytest.fixture(scope="module")
def child() -> Iterator[Child]:
    c = Child()
    yield c
    if c.proc.poll() is None:
        c.proc.kill()
        c.proc.wait()


# ---- bodies


def span(**figures: float) -> Span:
    """A vLLM request span (tests/test_otlp.py `vllm_span`) that ended a second ago."""
    values = {"ttft": 0.1, "e2e": 0.5, "queue": 0.01, "decode": 0.3, "prompt": 12, "out": 20}
    return vllm_span(start=time.time() - 1.5, **(values | figures))  # type: ignore[arg-type]


def export(spans: list[Span], instance: str = "10.0.0.1:8000") -> bytes:
    return otlp_export(spans, instance).SerializeToString()


def json_export(n: int) -> bytes:
    """OTLP JSON (as the spec writes it) of `n` request spans, built as text: fast at 8 MiB."""
    start = int((time.time() - 1) * 1e9)
    one = json.dumps(
        {
            "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": "eee19b7ec3c1b174",
            "name": "llm_request",
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + 500_000_000),
            "attributes": [
                {"key": "gen_ai.latency.e2e", "value": {"doubleValue": 0.5}},
                {"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": 0.1}},
                {"key": "gen_ai.usage.completion_tokens", "value": {"intValue": "11"}},
            ],
        }
    )
    resource = '{"attributes":[{"key":"service.instance.id","value":{"stringValue":"j:1"}}]}'
    spans = ",".join([one] * n)
    scope = f'{{"spans":[{spans}]}}'
    return f'{{"resourceSpans":[{{"resource":{resource},"scopeSpans":[{scope}]}}]}}'.encode()


def gzip_bomb_one_member(size: int) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    return b"".join([*(z.compress(zeros) for _ in range(size >> 20)), z.flush()])


# ---- HTTP over raw sockets (the receiver must survive what no library would send)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    return sock


def head(content_type: str = PB, **headers: str) -> bytes:
    lines = ["POST /v1/traces HTTP/1.1", "Host: x", f"Content-Type: {content_type}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items() if v]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def status_of(sock: socket.socket) -> int | None:
    """The status of the reply on `sock` (its body read), None when the receiver closed it."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            data += chunk
    except (ConnectionResetError, TimeoutError):
        return None
    top, _, rest = data.partition(b"\r\n\r\n")
    fields = dict(ln.partition(b":")[::2] for ln in top.split(b"\r\n")[1:])
    length = int({k.lower(): v for k, v in fields.items()}.get(b"content-length", b"0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(top.split()[1])


def post(port: int, body: bytes, content_type: str = PB, **headers: str) -> int | None:
    with connect(port) as sock:
        headers.setdefault("Content_Length", str(len(body)))
        try:
            sock.sendall(head(content_type, **headers) + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the whole body went: the reply is still there to read
        return status_of(sock)


def stream(port: int, first: bytes, piece: bytes, total: int) -> int | None:
    """Send `first`, then `piece` until `total` bytes or the receiver stops reading; its reply."""
    with connect(port) as sock:
        sock.sendall(first)
        sent = 0
        try:
            while sent < total:
                sock.sendall(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert sent < total, "the receiver read a body far over its cap to the end"
        return status_of(sock)


def chunked(piece: bytes) -> bytes:
    return f"{len(piece):x}\r\n".encode() + piece + b"\r\n"


# ---- the hostile inputs of issue 45


def test_hostile_inputs_are_answered_counted_and_bounded(child: Child) -> None:
    port = child.port
    before = child.status()
    good = export([span(), span(out=40)])
    assert post(port, good) == 200

    # gzip bombs: 1 GiB of zeros in ~1 MB (a thousand members of 1 MiB), and one member of 128 MiB
    members = gzip.compress(bytes(1 << 20)) * 1024
    assert len(members) < 1.1e6
    assert post(port, members, Content_Encoding="gzip") == 413
    assert post(port, gzip_bomb_one_member(128 << 20), Content_Encoding="gzip") == 413
    assert post(port, gzip.compress(good) * 3, Content_Encoding="gzip") == 200  # a good stream
    assert post(port, gzip.compress(good)[:-9], Content_Encoding="gzip") == 400  # cut short

    # the framing: -1, chunked and declared sizes over the cap, 300 MiB sent
    mib = bytes(1 << 20)
    assert stream(port, head(Content_Length="-1"), mib, 300 << 20) == 400
    assert stream(port, head(Transfer_Encoding="chunked"), chunked(mib), 300 << 20) == 413
    assert stream(port, head(Content_Length=str(300 << 20)), mib, 300 << 20) == 413
    assert post(port, good, Content_Length="12abc") == 400
    assert post(port, good, Content_Length="9" * 5000) == 413  # past int()'s digit limit too
    assert post(port, b"f" * 1000 + b"\r\n", Transfer_Encoding="chunked", Content_Length="") == 413
    assert post(port, b"", Transfer_Encoding="gzip, chunked") == 501
    assert post(port, b"x", Content_Encoding="br") == 415
    body = chunked(good[:10]) + chunked(good[10:]) + b"0\r\nX-Trailer: 1\r\n\r\n"
    assert post(port, body, Transfer_Encoding="chunked", Content_Length="") == 200
    assert post(port, b"zz\r\n", Transfer_Encoding="chunked", Content_Length="") == 400
    assert post(port, b"1" * 4096, Transfer_Encoding="chunked", Content_Length="") == 400

    # bodies just under the cap, many at once: the budget answers 503 (the SDK retries)
    big = export([], instance="a" * (MAX_BODY_BYTES - 1024))  # valid, and holds no request
    with_503: list[int | None] = []
    threads = [threading.Thread(target=lambda: with_503.append(post(port, big))) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(with_503) <= {200, 503} and 200 in with_503, with_503

    # the costliest decode: a JSON body at the cap
    text = json_export(MAX_DECODED_BYTES // 420)
    assert MAX_DECODED_BYTES // 2 < len(text) <= MAX_DECODED_BYTES
    assert post(port, text, JSON) == 200

    # a flood of valid spans past what the store keeps: the overflow is refused and counted
    batch = export([span()] * 10_000)
    for _ in range(MAX_KEPT // 10_000 + 2):
        assert post(port, batch) == 200

    # spans out of range: refused and counted by figure, never in a percentile
    bad = [
        span(e2e=-1.0),
        span(e2e=1e7),  # 116 days
        span(ttft=float("nan")),
        span(ttft=50.0, e2e=0.5),
        span(queue=-0.5),
        span(decode=float("inf")),
        span(out=-3),
        span(prompt=1 << 40),
    ]
    assert post(port, export([*bad, span()])) == 200

    # clients that hang up: mid-headers, mid-body, with a reset, and silent ones
    for i in range(200):
        sock = connect(port)
        if i % 3 == 0:
            sock.sendall(head(Content_Length="5000000") + good)
        elif i % 3 == 1:
            sock.sendall(b"POST /v1/traces HTTP/1.1\r\nContent-Ty")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset, not a goodbye

    deadline = time.monotonic() + 10
    while (status := child.status())["hangups"] < 67 and time.monotonic() < deadline:
        time.sleep(0.1)  # the receiver's threads see the resets as they get to them
    refused = status["spans_refused"]
    assert {k: refused.get(k, 0) for k in ("e2e", "ttft", "queue", "decode")} == {
        "e2e": 2,
        "ttft": 2,
        "queue": 1,
        "decode": 1,
    }
    assert refused.get("output_tokens") == 1 and refused.get("prompt_tokens") == 1
    assert refused.get("store_full", 0) >= 10_000
    assert status["spans"] - before["spans"] >= MAX_KEPT - 10_000
    assert status["rejected"] - before["rejected"] >= 9
    assert status["hangups"] >= 67  # the mid-body ones at least; the rest may be quiet closes
    assert status["hwm_kb"] < RSS_LIMIT_KB, f"peak RSS {status['hwm_kb'] / 1024:.0f} MB"


# ---- random mutations


def _valid_bodies() -> list[tuple[bytes, str]]:
    pb = export([span(), span(ttft=0.2, out=7)])
    return [(pb, PB), (json_export(2), JSON)]


def _mutate(data: bytes, flips: list[tuple[int, int]], cut: int | None, insert: bytes) -> bytes:
    out = bytearray(data)
    for at, value in flips:
        out[at % len(out)] = value
    if cut is not None:
        del out[cut % len(out) :]
    at = len(out) // 2
    return bytes(out[:at]) + insert + bytes(out[at:])


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    which=st.integers(0, 1),
    flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=8),
    cut=st.none() | st.integers(0, 1 << 20),
    insert=st.binary(max_size=64),
    gzipped=st.booleans(),
    gzip_flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=3),
    content_type=st.sampled_from([PB, JSON, f"{JSON}; charset=utf-8", "text/plain"]),
)
def test_random_mutations_get_an_otlp_status_never_a_crash(
    child: Child,
    which: int,
    flips: list[tuple[int, int]],
    cut: int | None,
    insert: bytes,
    gzipped: bool,
    gzip_flips: list[tuple[int, int]],
    content_type: str,
) -> None:
    body, _ = _valid_bodies()[which]
    body = _mutate(body, flips, cut, insert)
    headers = {}
    if gzipped:
        body = _mutate(gzip.compress(body), gzip_flips, None, b"")
        headers["Content_Encoding"] = "gzip"
    status = post(child.port, body, content_type, **headers)
    allowed = {200, 400} if content_type != "text/plain" else {415}
    assert status in allowed


def test_a_thousand_clients_at_once_are_answered_within_seconds(child: Child) -> None:
    """1000 connections opened at once, each POSTing one small export (a fleet's exporters after
    a monitor restart): every one gets its 200, in seconds."""
    n = 1000
    request = head(Content_Length=str(len(body := export([span()])))) + body
    sel = selectors.DefaultSelector()
    start = time.monotonic()
    socks = []
    for _ in range(n):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", child.port))
        socks.append(sock)
        sel.register(sock, selectors.EVENT_WRITE, data=[b"", False])
    answered: list[int] = []
    deadline = start + 60
    while len(answered) < n and time.monotonic() < deadline:
        for key, events in sel.select(timeout=1):
            sock, state = key.fileobj, key.data
            assert isinstance(sock, socket.socket)
            if events & selectors.EVENT_WRITE and not state[1]:
                sock.sendall(request)  # small: fits the socket buffer at once
                state[1] = True
                sel.modify(sock, selectors.EVENT_READ, data=state)
            elif events & selectors.EVENT_READ:
                chunk = sock.recv(4096)
                state[0] += chunk
                if b"\r\n\r\n" in state[0] or not chunk:
                    answered.append(int(state[0].split()[1]) if state[0] else 0)
                    sel.unregister(sock)
                    sock.close()
    took = time.monotonic() - start
    print(f"{n} clients at once: {answered.count(200)} answered 200 in {took:.2f} s")
    for sock in socks:
        sock.close()
    assert answered.count(200) == n, (len(answered), set(answered))
    assert took < 15, f"{n} clients took {took:.1f} s"


def test_last_no_traceback_and_peak_rss_bounded(child: Child) -> None:
    """Runs after the tests above (file order): the child's whole life, judged once."""
    status = child.status()
    print(f"receiver peak RSS {status['hwm_kb'] / 1024:.0f} MiB; status {status}")
    assert status["hwm_kb"] < RSS_LIMIT_KB
    err = child.stop()
    assert child.proc.returncode == 0
    assert "Traceback" not in err and "Exception" not in err, err[-2000:]
