"""loadgen against a real local SSE server on loopback (no mocks): token accounting, error kinds,
timeouts, a dead server, stop events, keep-alive pooling, open-loop arrivals."""

from __future__ import annotations

import asyncio
import itertools
import random
import socket
import statistics
import time

import orjson
import pytest

from kimictl.core.errors import InputError
from kimictl.runtime.load.loadgen import LoadPoint, LoadSettings, LoadTarget, _gap, run_load
from kimictl.runtime.load.workloads import RandomWorkload, parse_length

# A minimal OpenAI-style streaming server. The request's "model" picks the behaviour; "max_tokens"
# the number of tokens. Shared with test_bench.py (run there as a separate process).
EMITTER_SRC = r"""
import asyncio, sys, orjson

CONNECTIONS = 0

def chunk(d):
    return b"%x\r\n%s\r\n" % (len(d), d)

async def handle(reader, writer):
    global CONNECTIONS
    CONNECTIONS += 1
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            first = head.split(b"\r\n", 1)[0]
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = orjson.loads(await reader.readexactly(length)) if length else {}
            if first.startswith(b"GET /stats"):
                data = orjson.dumps({"connections": CONNECTIONS})
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data))
                continue
            if first.startswith(b"GET /v1/models"):
                data = orjson.dumps({"data": [{"id": "ok"}]})
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data))
                continue
            if first.startswith(b"GET /metrics"):
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                continue
            mode = body.get("model", "ok")
            n = int(body.get("max_tokens", 8))
            delay = float(body.get("delay", 0.002))
            if mode in ("429", "500"):
                msg = b'{"error": "busy"}'
                head = b"HTTP/1.1 %s X\r\ncontent-type: application/json\r\n" % mode.encode()
                writer.write(head + b"content-length: %d\r\n\r\n%s" % (len(msg), msg))
                await writer.drain()
                continue
            if mode == "hang":
                await asyncio.sleep(3600)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
            writer.write(b"transfer-encoding: chunked\r\n\r\n")
            per = 3 if mode == "multi" else 1
            done = 0
            i = 0
            while done < n:
                step = min(per, n - done)
                done += step
                if mode == "malformed" and i == 2:
                    d = b"data: {not json\n\n"
                else:
                    d = (b'data: {"choices":[{"index":0,"text":"%s","finish_reason":null}],'
                         b'"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n')
                    d = d % (b" t" * step, done)
                if mode == "bunch" and done < n:  # two events in one write, as a bunching server
                    done += 1
                    d += (b'data: {"choices":[{"index":0,"text":" t","finish_reason":null}],'
                          b'"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n') % done
                    writer.write(chunk(d))
                # split one event over two TCP writes now and then: the parser must reassemble
                elif i % 3 == 1:
                    writer.write(chunk(d[:7]))
                    await writer.drain()
                    writer.write(chunk(d[7:]))
                else:
                    writer.write(chunk(d))
                await writer.drain()
                i += 1
                if mode == "disconnect" and i == 3:
                    writer.transport.abort()
                    return
                await asyncio.sleep(delay)
            tail = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d}}' % n
            tail += b"\n\n"
            if mode != "no_done":
                tail += b"data: [DONE]\n\n"
            writer.write(chunk(tail) + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()

async def serve(port):
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    return server

if __name__ == "__main__":
    async def main():
        server = await serve(int(sys.argv[1]))
        async with server:
            await server.serve_forever()
    asyncio.run(main())
"""

_ns: dict[str, object] = {}
exec(compile(EMITTER_SRC, "emitter", "exec"), _ns)  # our own test server's source


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def emitter():
    port = free_port()
    server = await _ns["serve"](port)  # type: ignore[operator]
    _ns["CONNECTIONS"] = 0
    yield f"http://127.0.0.1:{port}"
    server.close()


async def _load(targets, workload, *, stop=None, on_record=None, on_point=None, **settings):  # type: ignore[no-untyped-def]
    settings["points"] = tuple(settings["points"])
    return await run_load(
        targets,
        workload,
        LoadSettings(**settings),
        stop=stop,
        on_record=on_record,
        on_point=on_point,
    )


def _wl(n_out: int = 8) -> RandomWorkload:
    return RandomWorkload(parse_length(16), parse_length(n_out))


async def _one(url: str, model: str, **kw: object):
    return await _load(
        [LoadTarget("t", url, model)],
        _wl(kw.pop("n_out", 8)),  # type: ignore[arg-type]
        points=[LoadPoint(concurrency=int(kw.pop("concurrency", 1)))],  # type: ignore[call-overload]
        num_prompts=int(kw.pop("num_prompts", 1)),  # type: ignore[call-overload]
        **kw,  # type: ignore[arg-type]
    )


async def test_stream_records_ttft_chunks_and_usage_tokens(emitter: str) -> None:
    recs = await _one(emitter, "ok", n_out=10, num_prompts=3)
    assert len(recs) == 3 and recs.stop_reason is None
    for r in recs:
        assert r.ok and r.status == 200 and r.error_kind is None
        assert r.output_tokens == 10 and r.prompt_tokens == 5
        assert len(r.chunk_times) == 10 and sum(r.chunk_tokens) == 10
        assert r.ttft == r.chunk_times[0] and r.latency == r.chunk_times[-1]
        assert r.chunk_times == sorted(r.chunk_times)
        assert 0 < r.ttft < r.latency < r.end - r.start + 1e-6
        assert r.tpot == pytest.approx((r.latency - r.ttft) / 9)


async def test_multi_token_chunks_count_tokens_from_usage(emitter: str) -> None:
    (r,) = await _one(emitter, "multi", n_out=10)
    # 10 tokens in chunks of 3,3,3,1: ITL counts chunks, TPOT counts tokens
    assert r.chunk_tokens == [3, 3, 3, 1]
    assert r.output_tokens == 10 and len(r.itls) == 3


@pytest.mark.parametrize(
    ("mode", "kind", "status"),
    [
        ("429", "http_429", 429),
        ("500", "http_5xx", 500),
        ("malformed", "malformed_sse", 200),
        ("no_done", "malformed_sse", 200),
        ("disconnect", "disconnect", 200),
    ],
)
async def test_error_kinds_are_counted_not_raised(
    emitter: str, mode: str, kind: str, status: int
) -> None:
    recs = await _one(emitter, mode, num_prompts=2)
    assert len(recs) == 2
    for r in recs:
        assert not r.ok and r.error_kind == kind and r.status == status and r.error
    if mode in ("429", "500"):
        assert "busy" in (recs[0].error or "")


async def test_timeout_ends_a_hung_request_within_the_timeout(emitter: str) -> None:
    t0 = time.perf_counter()
    (r,) = await _one(emitter, "hang", timeout=0.5)
    assert r.error_kind == "timeout" and not r.ok
    assert time.perf_counter() - t0 < 2.0


async def test_dead_server_aborts_the_run_and_keeps_records() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.perf_counter()
    recs = await _one(url, "ok", num_prompts=50, concurrency=1)
    assert time.perf_counter() - t0 < 5
    assert recs.stop_reason and "stopped answering" in recs.stop_reason
    assert 3 <= len(recs) < 50 and all(r.error_kind == "connect" for r in recs)


async def test_dead_server_fails_a_run_too_short_for_three_failures_in_a_row() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    recs = await _one(url, "ok", num_prompts=2, concurrency=1)
    assert recs.stop_reason and "stopped answering" in recs.stop_reason
    assert "2 connection failures" in recs.stop_reason
    assert len(recs) == 2 and all(r.error_kind == "connect" for r in recs)


async def test_stop_event_cancels_hung_requests_quickly(emitter: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, stop.set)
    t0 = time.perf_counter()
    recs = await _load(
        [LoadTarget("ok", emitter, "ok"), LoadTarget("hang", emitter, "hang")],
        _wl(),
        points=[LoadPoint(concurrency=2)],
        num_prompts=4,
        timeout=60,
        stop=stop,
    )
    assert time.perf_counter() - t0 < 3  # far below the 60 s request timeout
    assert recs.stop_reason == "interrupted"
    finished = [r for r in recs if r.target == "ok"]  # its first half (the A B B A schedule)
    assert len(finished) == 2 and all(r.ok for r in finished)
    hung = [r for r in recs if r.target == "hang"]
    assert len(hung) == 2 and all(r.error_kind == "cancelled" for r in hung)


async def test_keep_alive_pool_reuses_connections(emitter: str) -> None:
    recs = await _one(emitter, "ok", num_prompts=20, concurrency=4)
    assert len(recs) == 20 and all(r.ok for r in recs)
    assert _ns["CONNECTIONS"] <= 4


async def test_duration_stops_issuing(emitter: str) -> None:
    t0 = time.perf_counter()
    recs = await _load(
        [LoadTarget("t", emitter, "ok")],
        RandomWorkload(parse_length(4), parse_length(50)),
        points=[LoadPoint(concurrency=2)],
        duration=0.5,
    )
    elapsed = time.perf_counter() - t0
    assert 0.5 <= elapsed < 2.0
    assert recs and all(r.start < 0.5 + 0.05 for r in recs)


async def test_open_loop_constant_rate_spacing(emitter: str) -> None:
    recs = await _load(
        [LoadTarget("t", emitter, "ok")],
        _wl(2),
        points=[LoadPoint(rate=20.0, arrivals="constant")],
        num_prompts=10,
    )
    starts = sorted(r.start for r in recs)
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert len(recs) == 10
    # never faster than asked; the median gap (robust to one late start) is 1/rate
    assert starts[-1] - starts[0] >= 9 * 0.05 * 0.95
    assert statistics.median(gaps) == pytest.approx(0.05, rel=0.25)


def test_gamma_gaps_have_the_asked_mean_and_burstiness() -> None:
    rng = random.Random(1)
    poisson = [_gap(LoadPoint(rate=10.0), rng) for _ in range(20000)]
    bursty = [_gap(LoadPoint(rate=10.0, burstiness=0.25), rng) for _ in range(20000)]
    mean = sum(poisson) / len(poisson)
    assert mean == pytest.approx(0.1, rel=0.05)
    assert sum(bursty) / len(bursty) == pytest.approx(0.1, rel=0.08)

    def cv(xs: list[float]) -> float:
        m = sum(xs) / len(xs)
        return (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5 / m

    assert cv(poisson) == pytest.approx(1.0, rel=0.05)  # exponential
    assert cv(bursty) == pytest.approx(2.0, rel=0.1)  # gamma shape k: cv = 1/sqrt(k)


async def test_same_seed_same_request_bodies_for_both_targets(emitter: str) -> None:
    recs = await _load(
        [LoadTarget("a", emitter, "ok"), LoadTarget("b", emitter, "ok")],
        RandomWorkload(parse_length("8:64"), parse_length("2:6")),
        points=[LoadPoint(concurrency=1)],
        num_prompts=6,
        seed=7,
    )
    a = sorted((r.index, r.input_len, r.output_len) for r in recs if r.target == "a")
    b = sorted((r.index, r.input_len, r.output_len) for r in recs if r.target == "b")
    assert a == b and len(a) == 6
    assert len({x[1] for x in a}) > 1  # lengths really vary


async def test_bad_arguments_raise_input_error(emitter: str) -> None:
    with pytest.raises(InputError, match="num-prompts or --duration"):
        await _load([LoadTarget("t", emitter, "ok")], _wl(), points=[LoadPoint(concurrency=1)])
    with pytest.raises(InputError, match="burstiness"):
        await _load(
            [LoadTarget("t", emitter, "ok")],
            _wl(),
            points=[LoadPoint(rate=1, burstiness=0)],
            num_prompts=1,
        )
    with pytest.raises(InputError, match="not http"):
        await _load(
            [LoadTarget("t", "ftp://x", "ok")],
            _wl(),
            points=[LoadPoint(concurrency=1)],
            num_prompts=1,
        )


def test_payload_asks_for_usage_and_exact_lengths() -> None:
    from kimictl.runtime.load.loadgen import _payload
    from kimictl.runtime.load.workloads import RequestSpec

    body = orjson.loads(
        _payload(LoadTarget("t", "http://x", "m"), RequestSpec([1, 2], 2, 9), False, True)
    )
    assert body["prompt"] == [1, 2] and body["max_tokens"] == 9 and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    chat = orjson.loads(
        _payload(LoadTarget("t", "http://x", "m"), RequestSpec("hi", 1, 3), True, False)
    )
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and "ignore_eos" not in chat


async def test_budget_lets_started_sessions_finish(emitter: str) -> None:
    from kimictl.runtime.load.workloads import AGENTIC_PRESETS, AgenticWorkload

    w = AgenticWorkload(AGENTIC_PRESETS["small"])
    recs = await _load(
        [LoadTarget("t", emitter, "ok")],
        w,
        points=[LoadPoint(rate=50.0)],  # arrivals much faster than sessions end
        num_prompts=12,
        seed=2,
    )
    assert all(r.ok for r in recs)
    by_session: dict[int, int] = {}
    for r in recs:
        by_session[r.session] = by_session.get(r.session, 0) + 1
    expected = {}
    for s in itertools.islice(w.sessions(2), len(by_session)):
        expected[s.id] = s.num_requests
    # every started session ran all its turns (sub-agents included); the last one may overshoot
    assert by_session == expected
    last = max(expected.values())
    assert 12 <= len(recs) < 12 + last and any(r.turn > 0 for r in recs)


async def test_interleave_runs_targets_at_the_same_time(emitter: str) -> None:
    targets = [LoadTarget("a", emitter, "ok"), LoadTarget("b", emitter, "ok")]
    kw = {"points": [LoadPoint(concurrency=2)], "num_prompts": 6}
    turn = await _load(
        targets, RandomWorkload(parse_length(4), parse_length(30)), schedule="turns", **kw
    )
    both = await _load(
        targets, RandomWorkload(parse_length(4), parse_length(30)), schedule="interleave", **kw
    )

    def overlap(recs) -> bool:
        a = [r for r in recs if r.target == "a"]
        b = [r for r in recs if r.target == "b"]
        return min(r.start for r in b) < max(r.end for r in a) and min(r.start for r in a) < max(
            r.end for r in b
        )

    assert not overlap(turn) and overlap(both)
    assert len(both) == 12 and all(r.ok for r in both)
    assert set(both.windows) == {("a", "c=2", 0), ("b", "c=2", 0)}


async def test_abba_splits_each_target_in_halves_in_mirror_order(emitter: str) -> None:
    """The default A/B schedule: A's first half, B's first half, B's second half, A's second half;
    each target still gets the whole identical request sequence, and its time is its own turns."""
    targets = [LoadTarget("a", emitter, "ok"), LoadTarget("b", emitter, "ok")]
    wl = RandomWorkload(parse_length("4:40"), parse_length(20))
    recs = await _load(targets, wl, points=[LoadPoint(concurrency=2)], num_prompts=7, seed=5)
    turns = [(t["target"], t["part"], t["requests"]) for t in recs.schedule]
    assert turns == [("a", 1, 3), ("b", 1, 3), ("b", 2, 4), ("a", 2, 4)]
    spans = {(t["target"], t["part"]): (t["start_s"], t["end_s"]) for t in recs.schedule}
    order = [spans[k] for k in (("a", 1), ("b", 1), ("b", 2), ("a", 2))]
    for (_, end), (start, _) in itertools.pairwise(order):
        assert end <= start  # turns do not overlap: one target at a time
    sent = [s.steps[0].input_len for s in itertools.islice(wl.sessions(5), 7)]  # type: ignore[union-attr]
    for name in ("a", "b"):
        mine = sorted((r for r in recs if r.target == name), key=lambda r: r.index)
        assert [r.input_len for r in mine] == sent
        assert recs.segments[(name, "c=2", 0)] == [spans[(name, 1)], spans[(name, 2)]]
    # a second repeat starts with the other target: neither always has the first turn
    two = await _load(targets, wl, points=[LoadPoint(concurrency=2)], num_prompts=4, repeat=2)
    firsts = [t["target"] for t in two.schedule if t["part"] == 1]
    assert firsts == ["a", "b", "b", "a"]
    # longer points run several A B B A cycles of about one wave each (here 1 request a turn)
    many = await _load(targets, wl, points=[LoadPoint(concurrency=1)], num_prompts=8, seed=5)
    assert "".join(t["target"] for t in many.schedule) == "abba" * 4
    assert [t["requests"] for t in many.schedule] == [1] * 16
    assert [r.input_len for r in many if r.target == "b"] == [
        s.steps[0].input_len  # type: ignore[union-attr]
        for s in itertools.islice(wl.sessions(5), 8)
    ]


def test_an_ab_warms_each_side_by_default_and_one_target_does_not():
    """The A/A study's position effect (the side opening a point cold read 0.91x) went with two
    waves of warm-up per side: `kimictl bench` with two targets and no --warmup asks for them."""
    from kimictl.runtime.load.loadgen import default_warmup

    points = [LoadPoint(concurrency=2), LoadPoint(concurrency=8)]
    assert default_warmup(2, points) == 16
    assert default_warmup(1, points) == 0
    assert default_warmup(2, [LoadPoint(rate=4.0)]) == 2
