"""The monitor's effect on the server it watches: one fixed bench (2 streams x 256-token outputs)
with nothing scraping /metrics ("off"), with the monitor's loop scraping the full text every
interval ("full", what it did before), asking only for its samples every interval ("filtered"),
filtered and paced when scrapes are slow ("now", what `kimictl monitor` does), and optionally
with a plain 1 Hz httpx GET of /metrics ("curl", gzip asked as a Prometheus server does). Modes
run interleaved, in a rotated order each round, so that the box's drift hits every mode alike.
Prints TTFT/TPOT/throughput per mode (medians over rounds), the ratio to "off" of the medians,
and the median of the per-round ratios (each mode vs that round's off).

    python benchmarks/monitor_overhead.py --mode observer --url URL [--rounds 5] [--prompts 12]
        [--observer-modes off,full,filtered,now] [--interval 1]
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MODES = ("off", "full", "filtered", "now")
FIGURES = (
    ("median_ttft_ms", "TTFT p50 ms"),
    ("p99_ttft_ms", "TTFT p99 ms"),
    ("median_tpot_ms", "TPOT p50 ms"),
    ("p99_tpot_ms", "TPOT p99 ms"),
    ("output_throughput", "output tok/s"),
)
_WATCH = Path(__file__).with_name("_observer_watch.py")


def _bench(url: str, prompts: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "kimictl", "bench", "-t", url, "--input-len", "32",
            "--output-len", "256", "--concurrency", "2", "--num-prompts", str(prompts),
            "--warmup", "0", "--no-metrics", "--json", "-"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=900).stdout
    (run,) = json.loads(out)["runs"]
    return dict(run)


class _Curl:
    """GET /metrics once a second in a thread (httpx defaults: gzip asked, as Prometheus does;
    vLLM's exact /metrics route answers uncompressed anyway); keeps each scrape's duration."""

    def __init__(self, url: str) -> None:
        self.url, self.times, self.stop = url.rstrip("/") + "/metrics", [], threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import httpx

        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                t = time.monotonic()
                client.get(self.url)
                self.times.append(time.monotonic() - t)
                self.stop.wait(max(0.0, 1.0 - (time.monotonic() - t)))

    def __enter__(self) -> _Curl:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def _watched(mode: str, url: str, prompts: int, interval: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        record, out = Path(tmp) / "rec.jsonl", Path(tmp) / "watch.json"
        mon = subprocess.Popen(
            [sys.executable, str(_WATCH), url, mode, str(record), str(out), str(interval)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            # steady state: wait for its second recorded round (start-up imports on a loaded
            # 2-core box take seconds of CPU, which is not what scraping costs)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if record.exists() and len(record.read_text().splitlines()) >= 2:
                    break
                time.sleep(0.2)
            run = _bench(url, prompts)
        finally:
            mon.send_signal(signal.SIGTERM)
            mon.wait(timeout=30)
        watch = json.loads(out.read_text()) if out.exists() else {}
        rounds = len(record.read_text().splitlines()) if record.exists() else 0
    if watch.get("mode") != mode:
        raise RuntimeError(f"the {mode} watcher ended in mode {watch.get('mode')}")
    return {"run": run, "scrape_s": watch["scrape_s"], "watch_cpu_s": watch["cpu_s"],
            "monitor_rounds": rounds}  # fmt: skip


def _one(mode: str, url: str, prompts: int, interval: float) -> dict[str, Any]:
    if mode == "off":
        return {"run": _bench(url, prompts)}
    if mode == "curl":
        with _Curl(url) as curl:
            run = _bench(url, prompts)
        return {"run": run, "scrape_s": curl.times}
    return _watched(mode, url, prompts, interval)


def _scrape_stats(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    times = [t for r in results for t in r.get("scrape_s", [])]
    if not times:
        return None
    ms = sorted(1000 * t for t in times)
    return {"count": len(ms), "median_ms": statistics.median(ms), "max_ms": ms[-1],
            "p90_ms": ms[int(0.9 * (len(ms) - 1))]}  # fmt: skip


def measure(
    url: str, rounds: int, prompts: int, modes: tuple[str, ...] = MODES, interval: float = 1.0
) -> dict[str, Any]:
    """`interval` < 1 s scrapes faster than the monitor's default to amplify the effect (a 1 Hz
    effect below the box's noise shows up x(1/interval) larger; divide to estimate 1 Hz)."""
    if modes[0] != "off":
        raise ValueError("the first mode must be off (the reference)")
    load0 = os.getloadavg()[0]
    got: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for i in range(rounds):
        k = i % len(modes)
        for mode in modes[k:] + modes[:k]:  # rotate: no mode always runs first
            got[mode].append(_one(mode, url, prompts, interval))
    table = {
        mode: {key: statistics.median(float(r["run"][key]) for r in rs) for key, _ in FIGURES}
        for mode, rs in got.items()
    }
    ratio_of_medians = {
        mode: {key: table[mode][key] / table["off"][key] for key, _ in FIGURES} for mode in modes
    }
    per_round = {
        mode: {
            key: statistics.median(
                float(r["run"][key]) / float(o["run"][key])
                for r, o in zip(got[mode], got["off"], strict=True)
            )
            for key, _ in FIGURES
        }
        for mode in modes
    }
    return {
        "figures": table,
        "ratio_to_off": ratio_of_medians,
        "median_per_round_ratio": per_round,
        "per_round": {
            m: [{k: r["run"][k] for k, _ in FIGURES} for r in rs] for m, rs in got.items()
        },  # fmt: skip
        "scrapes": {m: _scrape_stats(rs) for m, rs in got.items()},
        "watch_cpu_s": {
            m: [r["watch_cpu_s"] for r in rs if "watch_cpu_s" in r] for m, rs in got.items()
        },  # fmt: skip
        "modes": list(modes),
        "interval_s": interval,
        "rounds": rounds,
        "prompts": prompts,
        "load_avg_start_end": [load0, os.getloadavg()[0]],
    }


def print_table(result: dict[str, Any]) -> None:
    modes = result["modes"]
    others = [m for m in modes if m != "off"]
    print(f"{'figure':<14}" + "".join(f"{m:>11}" for m in modes)
          + "".join(f"{m + '/off':>14}" for m in others)
          + "".join(f"{m + ' rnd':>14}" for m in others))  # fmt: skip
    for key, label in FIGURES:
        row = "".join(f"{result['figures'][m][key]:>11.2f}" for m in modes)
        row += "".join(f"{result['ratio_to_off'][m][key]:>14.3f}" for m in others)
        row += "".join(f"{result['median_per_round_ratio'][m][key]:>14.3f}" for m in others)
        print(f"{label:<14}{row}")
    for m in others:
        print(f"scrapes {m}: {result['scrapes'][m]}")


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of one process (not its children), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape_cost(url: str, server_pid: int, n: int = 200) -> dict[str, Any]:
    """CPU the server's API-server process (`server_pid`, the `vllm serve` process) and the
    monitor's client spend per scrape, full text vs filtered: n back-to-back scrapes each."""
    import asyncio

    from kimictl.runtime.observe.scrape import FilterMode, MetricsScraper

    async def run(mode: FilterMode) -> dict[str, float]:
        scraper = MetricsScraper(url)
        await scraper.scrape(timeout=30)  # connect, settle the mode
        scraper.mode = mode
        s0, c0, w0 = _proc_cpu_s(server_pid), time.process_time(), time.perf_counter()
        for _ in range(n):
            await scraper.scrape(timeout=30)
        s1, c1, w1 = _proc_cpu_s(server_pid), time.process_time(), time.perf_counter()
        scraper.close()
        return {"server_cpu_ms": 1000 * (s1 - s0) / n, "client_cpu_ms": 1000 * (c1 - c0) / n,
                "wall_ms": 1000 * (w1 - w0) / n}  # fmt: skip

    out: dict[str, Any] = {"scrapes_each": n}
    for mode in (FilterMode.FULL, FilterMode.FILTERED, FilterMode.FULL, FilterMode.FILTERED):
        out.setdefault(mode.value, []).append(asyncio.run(run(mode)))
    return out
