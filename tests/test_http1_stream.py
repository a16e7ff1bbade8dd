"""The streaming client (core.http1) against a real loopback server that writes one vLLM-shaped
SSE response cut at chosen byte offsets, each piece its own TCP write: whatever the cuts (whole
HTTP chunks, lines and chunk headers split mid-way, several events in one read, chunk extensions,
more events than one batched decode), the record holds the same chunks, tokens and usage, and each
chunk carries the time of the read that completed it."""

from __future__ import annotations

import asyncio
import socket
import time

import orjson
import pytest

from kimictl.core.http1 import DECODE_EVENTS, Endpoint
from kimictl.runtime.load.records import RequestRecord

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _event(i: int, text: str = " tok") -> bytes:
    obj = {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [{"index": 0, "text": text, "finish_reason": None}],
        "usage": {"prompt_tokens": 8, "completion_tokens": i, "total_tokens": 8 + i},
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _chunk(data: bytes, ext: bytes = b"") -> bytes:
    return b"%x%s\r\n%s\r\n" % (len(data), ext, data)


def _tail(n: int) -> list[bytes]:
    usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
    last = b"data: " + orjson.dumps({"id": "cmpl-1", "choices": [], "usage": usage}) + b"\n\n"
    return [_chunk(last), _chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"]


async def _serve(pieces: list[bytes], gap: float) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            if gap:
                await asyncio.sleep(gap)
        await reader.read()  # until the client closes
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _fetch(pieces: list[bytes], gap: float) -> tuple[RequestRecord, bool]:
    server, port = await _serve(pieces, gap)
    ep = Endpoint(f"http://127.0.0.1:{port}", None)
    rec = RequestRecord("t", "p", 0, 0, False, 0, 0, 8, 0)
    try:
        t0 = time.perf_counter()
        resp = await ep.request(ep.build("POST", "/v1/completions", b"{}"), rec, 30.0, t0)
    finally:
        ep.close()
        server.close()
    return rec, resp.seen_done


def _cuts(blob: bytes, every: int) -> list[bytes]:
    return [blob[i : i + every] for i in range(0, len(blob), every)]


N = 2 * DECODE_EVENTS + 5  # more events than two batched decodes


def _reference(rec: RequestRecord, seen_done: bool, n: int = N) -> None:
    assert rec.error_kind is None, rec.error
    assert seen_done
    assert len(rec.chunk_times) == n
    assert rec.chunk_tokens == [1] * n
    assert rec.output_tokens == n and rec.prompt_tokens == 8
    assert rec.text_len == 4 * n
    assert rec.ttft == rec.chunk_times[0] and rec.latency == rec.chunk_times[-1]
    assert rec.chunk_times == sorted(rec.chunk_times)


@pytest.mark.parametrize(
    "shape", ["one chunk a write", "cut every 7 bytes", "all in one write", "chunk extensions"]
)
async def test_any_cut_of_the_stream_gives_the_same_record(shape: str) -> None:
    events = [_event(i) for i in range(1, N + 1)]
    ext = b";x=1" if shape == "chunk extensions" else b""
    chunks = [HEAD] + [_chunk(e, ext) for e in events] + _tail(N)
    blob = b"".join(chunks)
    pieces = {
        "one chunk a write": chunks,
        "cut every 7 bytes": _cuts(blob, 7),
        "all in one write": [blob],
        "chunk extensions": chunks,
    }[shape]
    rec, done = await _fetch(pieces, 0.0)
    _reference(rec, done)


async def test_each_chunk_carries_the_time_of_its_own_read() -> None:
    """Events written 20 ms apart read 20 ms apart; two events in one write share one time."""
    n = 6
    events = [_event(i) for i in range(1, n + 1)]
    pieces = [HEAD + _chunk(events[0])]
    pieces += [_chunk(e) for e in events[1:4]]
    pieces += [_chunk(events[4]) + _chunk(events[5])]  # one write, two events
    pieces += [b"".join(_tail(n))]
    rec, done = await _fetch(pieces, 0.02)
    _reference(rec, done, n)
    gaps = [b - a for a, b in zip(rec.chunk_times, rec.chunk_times[1:], strict=False)]
    assert all(0.015 < g < 0.2 for g in gaps[:4]), gaps
    assert gaps[4] == 0.0


async def test_a_line_split_inside_an_event_still_stamps_the_read_that_ends_it() -> None:
    """An event cut in two writes 30 ms apart gets the second write's time."""
    n = 2
    first, second = _event(1), _event(2)
    pieces = [HEAD + _chunk(first), _chunk(second)[:40], _chunk(second)[40:]]
    pieces += [b"".join(_tail(n))]
    rec, done = await _fetch(pieces, 0.03)
    _reference(rec, done, n)
    assert rec.chunk_times[1] - rec.chunk_times[0] > 0.05


async def test_bad_data_lines_are_reported_and_the_good_ones_kept() -> None:
    n = 4
    body = [_event(1), b"data: {not json\n\n", _event(2), b"data: [1, 2]\n\n", _event(3)]
    body += [_event(4)]
    chunks = [HEAD] + [_chunk(e) for e in body] + _tail(n)
    rec, done = await _fetch(chunks, 0.0)
    assert rec.error_kind == "malformed_sse"
    assert rec.error is not None and "not a JSON object" in rec.error  # the last bad line
    assert len(rec.chunk_times) == n and rec.output_tokens == n and done


async def test_an_error_event_mid_stream_is_a_server_error() -> None:
    body = [_event(1), b'data: {"error": {"message": "boom"}}\n\n']
    chunks = [HEAD] + [_chunk(e) for e in body] + _tail(1)
    rec, _ = await _fetch(chunks, 0.0)
    assert rec.error_kind == "http_5xx" and rec.error is not None and "boom" in rec.error
    assert len(rec.chunk_times) == 1
