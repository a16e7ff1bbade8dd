"""CPU cost of `kimictl monitor`: N endpoints scraped at 1 Hz for D seconds (target: <= 5 % of one
core for 4 endpoints). Measures this process's CPU time (all threads; user + system) after the
imports, for the headless loop (`--no-tui --record`) and for the Textual screen (headless
terminal, full rendering every round).

    python lab/bench/monitor_overhead.py [--url http://127.0.0.1:18000] [--endpoints 4]
        [--duration 60] [--mode both|headless|tui]

`--mode observer` measures the other side: the server's TTFT/TPOT/throughput under a fixed bench
without and with the monitor's scrapes (full text, filtered, filtered + paced; optionally a plain
1 Hz curl), side by side (observer_effect.py); `--interval 0.05` amplifies the effect,
`--server-pid PID` (the `vllm serve` process) first measures the server's CPU per scrape.

`--mode ab` resolves the 1 Hz effect: `--pairs N` ABBA pairs of short blocks (the same fixed load)
with the monitor's loop on / idle, paired on/off ratios of TTFT, TPOT and throughput with 95 %
intervals, the server's CPU per block from /proc and the inter-token gaps that overlap a scrape
(observer_effect.paired_ab). `--start-server` starts the test suite's CPU server with the shipped
cpu-demo buckets (take /tmp/kimictl-vllm.lock first):

    flock /tmp/kimictl-vllm.lock python lab/bench/monitor_overhead.py --mode ab --start-server \
        --pairs 200 --max-s 470 --prompts 4 [--watch-mode now|filtered|full|ping] [--dump FILE] \
        [--settle 2] [--null | --placebo] [--background 1]
    python lab/bench/monitor_overhead.py --mode ab --from-dump FILE [FILE ...]   # pool runs
        [--null-dump NULL [NULL ...]]   # and take out an A/A control's spread

Figures: docs/results.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kimictl.runtime.observe.gpu_telemetry import sample_gpus
from kimictl.runtime.observe.poller import EndpointPoller, EndpointStatus, append_jsonl, watch
from kimictl.runtime.observe.scrape import metrics_url


def _pollers(url: str, n: int) -> list[EndpointPoller]:
    return [EndpointPoller(f"ep{i}", url) for i in range(n)]


def run_headless(url: str, n: int, duration: float, interval: float) -> dict[str, Any]:
    pollers = _pollers(url, n)
    rounds = 0
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "rec.jsonl"

        def on_tick(doc: dict[str, Any]) -> None:
            nonlocal rounds
            rounds += 1
            append_jsonl(record, doc)

        cpu0, wall0 = time.process_time(), time.monotonic()
        asyncio.run(
            watch(
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
    up = sum(p.status is EndpointStatus.UP for p in pollers)
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
    up = sum(v.status is EndpointStatus.UP for v in app.views)
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
    ap.add_argument("--mode", choices=["both", "headless", "tui", "observer", "ab"], default="both")
    ap.add_argument("--pairs", type=int, default=30, help="ab: ABBA pairs of blocks")
    ap.add_argument(
        "--null",
        action="store_true",
        help="ab: A/A control, the monitor idle in both arms (the method's own spread)",
    )
    ap.add_argument(
        "--placebo",
        action="store_true",
        help="ab: the off arm runs the monitor on a canned copy of the text (server untouched)",
    )
    ap.add_argument(
        "--background",
        type=int,
        default=0,
        help="ab: streams of extra load through the whole run (the server never idles)",
    )
    ap.add_argument(
        "--no-server-view",
        action="store_true",
        help="ab: no scrapes around each block (no server-side figures; the design before them)",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=0.0,
        help="ab: seconds (plus a random part of one interval) between switching the monitor "
        "and the block, both arms",
    )
    ap.add_argument("--dump", type=Path, help="ab: append each block's figures here (JSONL)")
    ap.add_argument(
        "--watch-mode",
        choices=["now", "filtered", "full", "ping"],
        default="now",
        help="ab: the monitor's scrapes: now (filtered + paced, kimictl monitor), filtered "
        "(never paced: the full rate), full (the whole text, as before filtering), ping (the "
        "text from a stub, GET /health of the server instead: with --placebo)",
    )
    ap.add_argument("--max-s", type=float, default=480, help="ab: start no pair after this")
    ap.add_argument(
        "--from-dump", type=Path, nargs="+", help="ab: pool these --dump files, measure nothing"
    )
    ap.add_argument(
        "--null-dump",
        type=Path,
        nargs="+",
        help="ab: with --from-dump, A/A (--null) dumps: the effect net of the method's spread",
    )
    ap.add_argument(
        "--start-server", action="store_true", help="ab/observer: start a CPU server (flock!)"
    )
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

    if args.mode == "ab":
        run_ab(args)
        return
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

    size = len(httpx.get(metrics_url(args.url), timeout=10).content)
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


def direct_cost(result: dict[str, Any], cost: dict[str, Any] | None) -> dict[str, float]:
    """The 1 Hz cost from CPU accounting: server CPU per second of load with the monitor on and
    off, and what the measured CPU of one filtered scrape is as a share of it."""
    out: dict[str, float] = {}
    for arm, c in result["cpu_totals"].items():
        out[f"server_cpu_ms_per_s_{arm}"] = 1000 * c["server_all_cpu_s"] / c["wall_s"]
        out[f"api_server_cpu_ms_per_s_{arm}"] = 1000 * c["server_api_cpu_s"] / c["wall_s"]
        out[f"monitor_cpu_ms_per_s_{arm}"] = 1000 * c["monitor_cpu_s"] / c["wall_s"]
    if cost:
        per = statistics.fmean(r["server_cpu_ms"] for r in cost["filtered"])
        out["server_cpu_ms_per_filtered_scrape"] = per
        load = per * result["scrape_rate_hz"]  # ms of server CPU per second of the run
        out["scrape_share_of_server_cpu"] = load / out["server_cpu_ms_per_s_on"]
        out["scrape_share_of_api_server_cpu"] = load / out["api_server_cpu_ms_per_s_on"]
    return out


def run_ab(args: argparse.Namespace) -> None:
    from observer_effect import (
        ab_from_dumps,
        paired_ab,
        print_ab,
        print_net,
        print_ratios,
        scrape_cost,
    )

    if args.from_dump:
        missing = [str(f) for f in (*args.from_dump, *(args.null_dump or ())) if not f.is_file()]
        if missing:
            sys.exit(f"monitor_overhead: no such dump file: {', '.join(missing)}.")
        pooled = ab_from_dumps(args.from_dump, args.null_dump)
        print_ratios(pooled)
        print_net(pooled)
        print(json.dumps(pooled, indent=2))
        return

    server = None
    if args.start_server:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
        from conftest import start_cpu_server_retrying

        from kimictl.deployment import buckets
        from kimictl.deployment.profiles import load_profile

        chb = load_profile("cpu-demo").spec.custom_histogram_buckets
        run_dir = Path(tempfile.mkdtemp(prefix="kimictl-ab-"))
        server = start_cpu_server_retrying(
            run_dir, max_model_len=768, extra=buckets.flag_for(chb or {})
        )
        args.url, args.server_pid = server.url, server.process.pid
    try:
        import httpx

        try:
            model = httpx.get(f"{args.url}/v1/models", timeout=30).json()["data"][0]["id"]
        except httpx.HTTPError as exc:
            sys.exit(f"monitor_overhead: no vLLM server answers at {args.url} ({exc}).")
        cost = scrape_cost(args.url, args.server_pid, n=100) if args.server_pid else None
        result = paired_ab(
            args.url,
            model,
            args.server_pid,
            args.pairs,
            args.prompts,
            args.interval,
            args.dump,
            watch_mode=args.watch_mode,
            max_s=args.max_s,
            null=args.null,
            settle_s=args.settle,
            placebo=args.placebo,
            background=args.background,
            server_view=not args.no_server_view,
        )
    finally:
        if server is not None:
            from conftest import stop_cpu_server

            stop_cpu_server(server)
    result["scrape_cost"] = cost
    result["direct"] = direct_cost(result, cost)
    result["machine"] = (
        f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    result["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print_ab(result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
