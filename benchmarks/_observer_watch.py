"""The monitor's headless loop (`kimictl monitor --no-tui --record`'s pollers and watch) with the
scrape mode pinned, for observer_effect.py: `full` is what the monitor sent before filtering
(GET /metrics, the whole text), `filtered` what it sends now. On SIGTERM it writes each scrape's
duration and its own CPU time to OUT (JSON) and exits.

    python benchmarks/_observer_watch.py URL full|filtered RECORD OUT [INTERVAL_S]
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
    url, mode, record, out = sys.argv[1:5]
    interval = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
    poller = metrics.EndpointPoller("ep", url)
    if mode == "full":
        poller.scraper.mode = FilterMode.FULL
    if mode != "now":
        poller.scrape_budget = math.inf  # never paced
    durations: list[float] = []
    scrape = poller.scraper.scrape

    async def timed(**kw: Any) -> metrics.MetricsSnapshot:
        t = time.perf_counter()
        try:
            return await scrape(**kw)
        finally:
            durations.append(time.perf_counter() - t)

    poller.scraper.scrape = timed  # type: ignore[method-assign]
    cpu0 = time.process_time()

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        asyncio.run(
            metrics.watch(
                [poller],
                interval=interval,
                window_s=60,
                duration_s=None,
                on_tick=lambda doc: metrics.append_jsonl(record, doc),
            )
        )
    except KeyboardInterrupt:
        pass
    finally:
        with open(out, "w") as fh:
            json.dump(
                {
                    "mode": "now" if mode == "now" else poller.scraper.mode.value,
                    "scrape_s": durations,
                    "cpu_s": time.process_time() - cpu0,
                },
                fh,
            )


if __name__ == "__main__":
    main()
