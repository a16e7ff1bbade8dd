"""CPU cost of `kimictl monitor`: N endpoints scraped at 1 Hz for D seconds (target: <= 5 % of one
core for 4 endpoints). Measures this process's CPU time (all threads; user + system) after the
imports, for the headless loop (`--no-tui --record`) and for the Textual screen (headless
terminal, full rendering every round).

    python benchmarks/monitor_overhead.py [--url http://127.0.0.1:18000] [--endpoints 4]
        [--duration 60] [--mode both|headless|tui]

`--mode observer` measures the other side: the server's TTFT/TPOT/throughput under a fixed bench
without and with the monitor's scrapes (full text, filtered, filtered + paced; optionally a plain
1 Hz curl), side by side (observer_effect.py); `--interval 0.05` amplifies the effect,
`--server-pid PID` (the `vllm serve` process) first measures the server's CPU per scrape.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kimictl.runtime.observe import metrics
from kimictl.runtime.observe.gpu_telemetry import sample_gpus


def _pollers(url: str, n: int) -> list[metrics.EndpointPoller]:
    return [metrics.EndpointPoller(f"ep{i}", url) for i in range(n)]


def run_headless(url: str, n: int, duration: float, interval: float) -> dict[str, Any]:
    pollers = _pollers(url, n)
    rounds = 0
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "rec.jsonl"

        def on_tick(doc: dict[str, Any]) -> None:
            nonlocal rounds
            rounds += 1
            metrics.append_jsonl(record, doc)

        cpu0, wall0 = time.process_time(), time.monotonic()
        asyncio.run(
            metrics.watch(
                pollers,
                interval=interval,
                window_s=60,
                duration_s=duration,
                on_tick=on_tick,
                gpu_sampler=sample_gpus,
            )
        )
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        size = record.stat().st_size
    up = sum(p.status is metrics.EndpointStatus.UP for p in pollers)
    return {
        "mode": "headless --no-tui --record",
        "cpu_s": cpu,
        "wall_s": wall,
        "core_percent": 100 * cpu / wall,
        "rounds": rounds,
        "endpoints_up": up,
        "record_bytes": size,
    }


def run_tui(url: str, n: int, duration: float, interval: float) -> dict[str, Any]:
    from kimictl.tui.app import MonitorApp

    app = MonitorApp(_pollers(url, n), interval=interval, window_s=60, slo_interactivity=20)
    marks: dict[str, float] = {}

    def start() -> None:
        marks["cpu0"], marks["wall0"] = time.process_time(), time.monotonic()
        app.set_timer(duration, finish)

    def finish() -> None:
        marks["cpu1"], marks["wall1"] = time.process_time(), time.monotonic()
        app.exit()

    app.call_after_refresh(start)
    app.run(headless=True, size=(160, 50))
    cpu = marks["cpu1"] - marks["cpu0"]
    wall = marks["wall1"] - marks["wall0"]
    up = sum(v.status is metrics.EndpointStatus.UP for v in app.views)
    return {
        "mode": "Textual TUI (headless terminal 160x50)",
        "cpu_s": cpu,
        "wall_s": wall,
        "core_percent": 100 * cpu / wall,
        "rounds": app.rounds,
        "endpoints_up": up,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:18000")
    ap.add_argument("--endpoints", type=int, default=4)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--mode", choices=["both", "headless", "tui", "observer"], default="both")
    ap.add_argument("--rounds", type=int, default=5, help="observer: rounds of every mode")
    ap.add_argument("--prompts", type=int, default=12, help="observer: requests per bench")
    ap.add_argument(
        "--observer-modes", default="off,full,filtered,now", help="observer: off first; or curl"
    )
    ap.add_argument(
        "--server-pid",
        type=int,
        help="observer: the `vllm serve` process; first measure its CPU per scrape",
    )
    args = ap.parse_args()
    import httpx

    if args.mode == "observer":
        from observer_effect import measure, print_table, scrape_cost

        cost = scrape_cost(args.url, args.server_pid) if args.server_pid else None
        modes = tuple(args.observer_modes.split(","))
        result = measure(args.url, args.rounds, args.prompts, modes, args.interval)
        result["scrape_cost"] = cost
        result["machine"] = f"{platform.machine()} {os.cpu_count()} cores"
        result["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print_table(result)
        print(json.dumps(result, indent=2))
        return

    size = len(httpx.get(metrics.metrics_url(args.url), timeout=10).content)
    results = []
    if args.mode in ("both", "headless"):
        results.append(run_headless(args.url, args.endpoints, args.duration, args.interval))
    if args.mode in ("both", "tui"):
        results.append(run_tui(args.url, args.endpoints, args.duration, args.interval))
    meta = {
        "endpoints": args.endpoints,
        "interval_s": args.interval,
        "url": args.url,
        "metrics_bytes": size,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "load_avg": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps({"meta": meta, "results": results}, indent=2))


if __name__ == "__main__":
    main()
