"""The monitor's effect on the server it watches: one fixed bench (2 streams x 256-token outputs)
without anything scraping /metrics, with `kimictl monitor --no-tui` at 1 Hz, and with a plain
1 Hz GET of /metrics (what curl in a loop does), interleaved off/monitor/curl x rounds so that
the box's drift hits every mode alike. Prints TTFT/TPOT/throughput per mode side by side (medians
over rounds) and the ratio to "off".

    python benchmarks/monitor_overhead.py --mode observer --url URL [--rounds 2] [--prompts 8]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MODES = ("off", "monitor", "curl")
FIGURES = (
    ("median_ttft_ms", "TTFT p50 ms"),
    ("p99_ttft_ms", "TTFT p99 ms"),
    ("median_tpot_ms", "TPOT p50 ms"),
    ("p99_tpot_ms", "TPOT p99 ms"),
    ("output_throughput", "output tok/s"),
)


def _bench(url: str, prompts: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "kimictl", "bench", "-t", url, "--input-len", "32",
            "--output-len", "256", "--concurrency", "2", "--num-prompts", str(prompts),
            "--warmup", "0", "--no-metrics", "--json", "-"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=900).stdout
    (run,) = json.loads(out)["runs"]
    return dict(run)


class _Curl:
    """GET /metrics once a second in a thread (httpx defaults: gzip asked, as Prometheus does);
    keeps each scrape's duration."""

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


def _one(mode: str, url: str, prompts: int) -> dict[str, Any]:
    if mode == "off":
        return {"run": _bench(url, prompts)}
    if mode == "curl":
        with _Curl(url) as curl:
            run = _bench(url, prompts)
        return {"run": run, "scrape_s": curl.times}
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "rec.jsonl"
        mon = subprocess.Popen(
            [sys.executable, "-m", "kimictl", "monitor", "--no-tui", "--interval", "1",
             "--record", str(record), url],
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
            mon.terminate()
            mon.wait(timeout=30)
        rounds = len(record.read_text().splitlines()) if record.exists() else 0
    return {"run": run, "monitor_rounds": rounds}


def measure(url: str, rounds: int, prompts: int) -> dict[str, Any]:
    load0 = os.getloadavg()[0]
    got: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:
            got[mode].append(_one(mode, url, prompts))
    table: dict[str, dict[str, float]] = {}
    for mode, results in got.items():
        table[mode] = {
            key: statistics.median(float(r["run"][key]) for r in results) for key, _ in FIGURES
        }
    ratios = {
        mode: {key: table[mode][key] / table["off"][key] for key, _ in FIGURES} for mode in MODES
    }
    scrapes = [t for r in got["curl"] for t in r.get("scrape_s", [])]
    return {
        "figures": table,
        "ratio_to_off": ratios,
        "curl_scrape_s": {
            "first": scrapes[0] if scrapes else None,
            "median": statistics.median(scrapes) if scrapes else None,
            "max": max(scrapes) if scrapes else None,
            "count": len(scrapes),
        },
        "monitor_rounds": [r.get("monitor_rounds") for r in got["monitor"]],
        "rounds": rounds,
        "prompts": prompts,
        "load_avg_start_end": [load0, os.getloadavg()[0]],
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{'figure':<14}" + "".join(f"{m:>12}" for m in MODES) + "   monitor/off  curl/off")
    for key, label in FIGURES:
        row = "".join(f"{result['figures'][m][key]:>12.2f}" for m in MODES)
        r = result["ratio_to_off"]
        print(f"{label:<14}{row}   {r['monitor'][key]:>10.3f}  {r['curl'][key]:>8.3f}")
