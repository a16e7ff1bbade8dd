"""The monitor's headless loop (`kimictl monitor --no-tui --record`'s pollers and watch) with the
scrape mode pinned, for observer_effect.py: `full` is what the monitor sent before filtering
(GET /metrics, the whole text), `filtered` what it sends now (never paced), `now` filtered and
paced as `kimictl monitor` is. On SIGTERM it writes each scrape's duration, each scrape's
(start, end) on the system's monotonic clock (time.perf_counter, comparable across processes)
and its own CPU time to OUT (JSON) and exits.

With `--paused` it starts idle: SIGUSR2 starts the loop (a fresh watch on the same poller, as a
monitor started then), SIGUSR1 cancels it. The paired A/B of observer_effect.py toggles it so
that one process is the monitor of every "on" block and sleeps through every "off" block.

    python benchmarks/_observer_watch.py URL full|filtered|now RECORD OUT [INTERVAL_S] [--paused]
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sys
import time
from typing import Any

from kimictl.runtime.observe import metrics
from kimictl.runtime.observe.scrape import FilterMode


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--paused"]
    paused = "--paused" in sys.argv[1:]
    url, mode, record, out = args[:4]
    interval = float(args[4]) if len(args) > 4 else 1.0
    poller = metrics.EndpointPoller("ep", url)
    if mode == "full":
        poller.scraper.mode = FilterMode.FULL
    if mode != "now":
        poller.scrape_budget = math.inf  # never paced
    durations: list[float] = []
    spans: list[tuple[float, float]] = []
    scrape = poller.scraper.scrape

    async def timed(**kw: Any) -> metrics.MetricsSnapshot:
        t = time.perf_counter()
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
            metrics.watch(
                [poller],
                interval=interval,
                window_s=60,
                duration_s=None,
                on_tick=lambda doc: metrics.append_jsonl(record, doc),
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
