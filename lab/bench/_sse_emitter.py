"""The benchmarks' local SSE emitter: a small HTTP/1.1 server that streams vLLM-shaped
/v1/completions chunks, one token per chunk, the first after TTFT and then one every TPOT, for as
many tokens as the request's max_tokens (16 when absent). GET /v1/models lists one model, "m";
any other GET is a 404. TCP_NODELAY is on, so a paced chunk leaves at once, in its own TCP read
on the client side (the expensive case, as with a real server).

It runs as its own process, so its CPU is never counted as the client's:

    with running_emitter(ttft_ms=100, tpot_ms=20) as url:   # from a benchmark script
        ...
    python lab/bench/_sse_emitter.py --ttft-ms 100 --tpot-ms 20   # by hand; prints "ready PORT"

Used by client_overhead.py (client CPU per token) and bench_vs_vllm.py --emitter (known TTFT/TPOT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


def _event(data: bytes) -> bytes:
    """One SSE event as one HTTP chunk."""
    event = b"data: " + data + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
_ID = b'"id":"cmpl-0123456789abcdef","object":"text_completion","created":1796020874,"model":"m"'
_TOKEN = _event(
    b"{" + _ID + b',"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null,'
    b'"stop_reason":null}],"usage":null}'
)


def _tail(tokens: int) -> bytes:
    usage = b'"usage":{"prompt_tokens":8,"total_tokens":%d,"completion_tokens":%d}' % (
        8 + tokens,
        tokens,
    )
    return _event(b"{" + _ID + b',"choices":[],' + usage + b"}") + _event(b"[DONE]") + b"0\r\n\r\n"


def _reply(writer: asyncio.StreamWriter, status: bytes, body: bytes) -> None:
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    writer.write(head % (status, len(body)) + body)


async def _serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ttft: float, tpot: float
) -> None:
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:  # keep-alive: one request after another
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = json.loads(await reader.readexactly(length)) if length else {}
            if head.startswith(b"GET /v1/models"):
                _reply(writer, b"200 OK", b'{"object":"list","data":[{"id":"m","object":"model"}]}')
                continue
            if head.startswith(b"GET"):
                _reply(writer, b"404 Not Found", b"{}")
                continue
            tokens = int(body.get("max_tokens") or 16)
            writer.write(_STREAM_HEAD)
            due = time.perf_counter() + ttft
            for _ in range(tokens):
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                writer.write(_TOKEN)
                due += tpot
            writer.write(_tail(tokens))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()


async def _serve(port: int, ttft: float, tpot: float) -> None:
    server = await asyncio.start_server(
        lambda r, w: _serve_connection(r, w, ttft, tpot), "127.0.0.1", port, backlog=1024
    )
    print(f"ready {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


@contextmanager
def running_emitter(*, ttft_ms: float = 0.0, tpot_ms: float) -> Iterator[str]:
    """Start the emitter in its own process on a free loopback port; yield its base URL."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--ttft-ms", str(ttft_ms), "--tpot-ms", str(tpot_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        word, _, port = proc.stdout.readline().partition(" ")
        if word != "ready":
            raise RuntimeError(f"the SSE emitter did not start (exit code {proc.poll()})")
        yield f"http://127.0.0.1:{int(port)}"
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    ap.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first token")
    ap.add_argument("--tpot-ms", type=float, required=True, help="delay between tokens")
    args = ap.parse_args()
    asyncio.run(_serve(args.port, args.ttft_ms / 1000, args.tpot_ms / 1000))


if __name__ == "__main__":
    main()
