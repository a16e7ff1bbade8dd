"""The monitor's headless loop (`kimictl monitor --no-tui --record`'s pollers and watch) with the
scrape mode pinned, for observer_effect.py: `full` is what the monitor sent before filtering
(GET /metrics, the whole text), `filtered` what it sends now (never paced), `now` filtered and
paced as `kimictl monitor` is. On SIGTERM it writes each scrape's duration, each scrape's
(start, end) on the system's monotonic clock (time.perf_counter, comparable across processes)
and its own CPU time to OUT (JSON) and exits.

`placebo` is the monitor's loop with everything but the server: it fetches the filtered text
once, serves it from a stub on 127.0.0.1 inside this process, and scrapes, parses and windows that
every interval. The monitor's own CPU, wake-ups and scheduling against the client stay; the
server's part (the render in its API-server process) goes. `monitor_overhead.py --mode ab
--placebo` pairs the real loop against it, so that what differs is what the scrapes do to the
server. `ping` is `placebo` plus a GET /health of the real server before each scrape: periodic
traffic that costs the server next to nothing.

With `--paused` it starts idle: SIGUSR2 starts the loop (a fresh watch on the same poller, as a
monitor started then), SIGUSR1 cancels it. The paired A/B of observer_effect.py toggles it so
that one process is the monitor of every "on" block and sleeps through every "off" block.

    python lab/bench/_observer_watch.py URL full|filtered|now|placebo|ping RECORD OUT [INTERVAL_S]
        [--paused]
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sys
import time
from typing import Any

from kimictl.runtime.observe.poller import EndpointPoller, append_jsonl
from kimictl.runtime.observe.scrape import FilterMode
from kimictl.runtime.observe.snapshot import MetricsSnapshot


def _serve_canned(url: str) -> str:
    """The server's filtered /metrics text, fetched once and answered (HTTP/1.1, keep-alive) to
    every request by a stub in a thread of this process; returns the stub's base URL."""
    import socketserver
    import threading
    import urllib.request

    from kimictl.runtime.observe.scrape import FILTER_PATH, metrics_url

    with urllib.request.urlopen(metrics_url(url) + FILTER_PATH, timeout=30) as resp:
        body = resp.read()
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )

    class Canned(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while line := self.rfile.readline():  # one request: its lines up to the blank one
                while line not in (b"\r\n", b"\n", b""):
                    line = self.rfile.readline()
                self.wfile.write(head + body)

    stub = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Canned)
    stub.daemon_threads = True
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{stub.server_address[1]}"


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--paused"]
    paused = "--paused" in sys.argv[1:]
    url, mode, record, out = args[:4]
    interval = float(args[4]) if len(args) > 4 else 1.0
    ping = None
    if mode == "ping":  # the placebo, plus GET /health of the real server before each scrape
        from kimictl.core.http1 import Endpoint

        ping = Endpoint(url.rstrip("/") + "/health", None)
    if mode in ("placebo", "ping"):
        url = _serve_canned(url)
    poller = EndpointPoller("ep", url)
    if mode == "full":
        poller.scraper.mode = FilterMode.FULL
    if mode != "now":
        poller.scrape_budget = math.inf  # never paced
    durations: list[float] = []
    spans: list[tuple[float, float]] = []
    scrape = poller.scraper.scrape

    async def timed(**kw: Any) -> MetricsSnapshot:
        t = time.perf_counter()
        if ping is not None:
            await ping.request(ping.build("GET", "", None), None, 10.0)
        try:
            return await scrape(**kw)
        finally:
            end = time.perf_counter()
            durations.append(end - t)
            spans.append((t, end))

    poller.scraper.scrape = timed  # type: ignore[method-assign]
    cpu0 = time.process_time()

    def watch() -> asyncio.Task[Any]:
        return asyncio.ensure_future(
            watch(
                [poller],
                interval=interval,
                window_s=60,
                duration_s=None,
                on_tick=lambda doc: append_jsonl(record, doc),
            )
        )

    async def run() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        task: asyncio.Task[Any] | None = None if paused else watch()

        def pause() -> None:
            nonlocal task
            if task is not None:
                task.cancel()
                task = None

        def resume() -> None:
            nonlocal task
            if task is None:
                poller.scraper.close()  # a pause may have cancelled a scrape mid-answer
                task = watch()

        loop.add_signal_handler(signal.SIGUSR1, pause)
        loop.add_signal_handler(signal.SIGUSR2, resume)
        loop.add_signal_handler(signal.SIGTERM, done.set)
        await done.wait()
        pause()

    try:
        asyncio.run(run())
    finally:
        with open(out, "w") as fh:
            json.dump(
                {
                    "mode": "now" if mode == "now" else poller.scraper.mode.value,
                    "scrape_s": durations,
                    "scrape_spans": spans,
                    "cpu_s": time.process_time() - cpu0,
                },
                fh,
            )


if __name__ == "__main__":
    main()
