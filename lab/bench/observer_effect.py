"""The monitor's effect on the server it watches: one fixed bench (2 streams x 256-token outputs)
with nothing scraping /metrics ("off"), with the monitor's loop scraping the full text every
interval ("full", what it did before), asking only for its samples every interval ("filtered"),
filtered and paced when scrapes are slow ("now", what `kimictl monitor` does), and optionally
with a plain 1 Hz httpx GET of /metrics ("curl", gzip asked as a Prometheus server does). Modes
run interleaved, in a rotated order each round, so that the box's drift hits every mode alike.
Prints TTFT/TPOT/throughput per mode (medians over rounds), the ratio to "off" of the medians,
and the median of the per-round ratios (each mode vs that round's off).

    python lab/bench/monitor_overhead.py --mode observer --url URL [--rounds 5] [--prompts 12]
        [--observer-modes off,full,filtered,now] [--interval 1]
"""

from __future__ import annotations

import contextlib
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
            "--warmup", "0", "--no-metrics", "--json"]  # fmt: skip
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


def _start_watch(
    url: str, mode: str, record: Path, out: Path, interval: float
) -> subprocess.Popen[bytes]:
    """One _observer_watch.py process (its modes and files: see its docstring)."""
    return subprocess.Popen(
        [sys.executable, str(_WATCH), url, mode, str(record), str(out), str(interval)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _steady(watch: subprocess.Popen[bytes], record: Path, deadline: float) -> bool:
    """Wait for a watcher's second recorded round (its start-up imports take seconds of CPU on a
    loaded 2-core box, which is not what scraping costs); False if it exits or `deadline`
    (time.monotonic) passes first."""
    while not (record.exists() and len(record.read_text().splitlines()) >= 2):
        if time.monotonic() > deadline or watch.poll() is not None:
            return False
        time.sleep(0.2)
    return True


def _watched(mode: str, url: str, prompts: int, interval: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        record, out = Path(tmp) / "rec.jsonl", Path(tmp) / "watch.json"
        mon = _start_watch(url, mode, record, out, interval)
        try:
            _steady(mon, record, time.monotonic() + 60)  # the mode check below catches a failure
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


# --- paired A/B: resolve a ~2 % effect at 1 Hz on a noisy box ------------------------------------
# Many short blocks of the same fixed load (2 streams x 256-token outputs, `prompts` requests),
# with one monitor process ("now": filtered + paced, what `kimictl monitor` does) either running
# at `interval` ("on") or idle ("off"), in pairs whose order alternates (off,on / on,off: ABBA), so
# that slow drift of the shared box cancels. Each pair gives one on/off ratio per figure; the
# interval of the mean log-ratio (t and bootstrap) says what the data can exclude. The load runs
# in this process (kimictl's load generator, started once) so no block pays for start-up imports.
AB_FIGURES = (
    "ttft_p50_ms",
    "tpot_p50_ms",
    "output_tok_s",
    "itl_p99_ms",
    "itl_max_ms",
    "ttft_mean_ms",
    "ttft_first_ms",
    "ttft_later_ms",
    "server_ttft_mean_ms",
    "server_queue_mean_ms",
    "server_prefill_mean_ms",
)


def _figures(pairs: list[tuple[dict[str, float], dict[str, float]]]) -> list[str]:
    """The AB_FIGURES every block of `pairs` has (dumps written before a figure existed lack it)."""
    return [k for k in AB_FIGURES if all(k in a and k in b for a, b in pairs)]


def tree_threads(pid: int) -> dict[int, list[int]]:
    """`pid` and all its live descendants, each with its thread ids."""
    out: dict[int, list[int]] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
            for task in tasks:
                todo += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
        out[p] = [int(t.name) for t in tasks]
    return out


def _tree_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (utime + stime) of `pid` and all its descendants, by pid."""
    out: dict[int, float] = {}
    for p in tree_threads(pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            out[p] = _proc_cpu_s(p)
    return out


CONCURRENCY = 2  # streams of the fixed load


def _block(url: str, model: str, prompts: int) -> dict[str, Any]:
    """One block of the fixed load, in process; per-request and per-token times on the monotonic
    clock (time.perf_counter) so they line up with the watcher's scrape spans."""
    import asyncio

    from kimictl.runtime.load.loadgen import run_load
    from kimictl.runtime.load.records import LoadPoint, LoadSettings, LoadTarget
    from kimictl.runtime.load.workloads import RandomWorkload, parse_length

    workload = RandomWorkload(parse_length("32"), parse_length("256"))
    settings = LoadSettings(points=(LoadPoint(concurrency=CONCURRENCY),), num_prompts=prompts)
    t_run = time.perf_counter()  # run_load's own t_run is taken microseconds later
    recs = asyncio.run(run_load([LoadTarget("ab", url, model)], workload, settings))
    ok = [r for r in recs if r.ok and not r.warmup]
    if len(ok) != prompts:
        raise RuntimeError(f"{prompts - len(ok)} of {prompts} requests failed: {recs[:1]}")
    ttft = [1000 * r.ttft for r in ok if r.ttft is not None]
    windows = [(t_run + r.start, t_run + r.start + r.ttft) for r in ok if r.ttft is not None]
    by_start = [1000 * (z - a) for a, z in sorted(windows)]
    tpot = [1000 * t for r in ok if (t := r.tpot) is not None]
    itl = sorted(1000 * g for r in ok for g in r.itls)
    first, last = min(r.start for r in ok), max(r.end for r in ok)
    tokens = [[t_run + r.start + c for c in r.chunk_times] for r in ok]
    return {
        "ttft_p50_ms": statistics.median(ttft),
        "ttft_mean_ms": statistics.fmean(ttft),
        # the first requests of the block (one per stream) meet a server that ran no block just
        # before; the later ones arrive as earlier ones finish
        "ttft_first_ms": statistics.fmean(by_start[:CONCURRENCY]),
        "ttft_later_ms": statistics.fmean(by_start[CONCURRENCY:] or by_start),
        "tpot_p50_ms": statistics.median(tpot),
        "output_tok_s": sum(r.output_tokens for r in ok) / (last - first),
        "itl_p99_ms": itl[int(0.99 * (len(itl) - 1))],
        "itl_max_ms": itl[-1],
        "t0": t_run + first,
        "t1": t_run + last,
        "token_times": tokens,
        "ttft_windows": windows,
    }


# The server's own view of a block: histogram sums and counts read just before and just after it
# (the same two small scrapes in both arms), so a block's client TTFT can be split into the part
# the server measured (arrival to first token: queue + prefill + the rest) and the part outside it.
SERVER_HISTOGRAMS = {
    "server_ttft": "vllm:time_to_first_token_seconds",
    "server_queue": "vllm:request_queue_time_seconds",
    "server_prefill": "vllm:request_prefill_time_seconds",
}


def server_sums(url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of each of SERVER_HISTOGRAMS over all label sets: the filtered scrape the
    monitor uses (a few lines), the full text where the server ignores the filter."""
    import httpx

    from kimictl.runtime.observe.prometheus import parse_prometheus_text
    from kimictl.runtime.observe.scrape import filter_path, metrics_url

    names = [f"{f}_{part}" for f in SERVER_HISTOGRAMS.values() for part in ("sum", "count")]
    text = httpx.get(metrics_url(url) + filter_path(names), timeout=30).text
    if f"{SERVER_HISTOGRAMS['server_ttft']}_count" not in text:
        text = httpx.get(metrics_url(url), timeout=30).text
    samples, _ = parse_prometheus_text(text, prefixes=tuple(SERVER_HISTOGRAMS.values()))
    got = dict.fromkeys(names, 0.0)
    for sample in samples:
        if sample.name in got:
            got[sample.name] += sample.value
    return {k: (got[f"{f}_sum"], got[f"{f}_count"]) for k, f in SERVER_HISTOGRAMS.items()}


def server_means(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
                 ) -> dict[str, float]:  # fmt: skip
    """Mean of each histogram over the requests between two server_sums, in ms."""
    out = {}
    for key, (s1, c1) in after.items():
        s0, c0 = before[key]
        out[f"{key}_mean_ms"] = 1000 * (s1 - s0) / max(c1 - c0, 1)
    return out


def _t975(df: int) -> float:
    """Student's t 97.5 % quantile (Cornish-Fisher expansion; within 0.3 % for df >= 5)."""
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def ratio_interval(ratios: list[float], *, boot: int = 20000, seed: int = 0) -> dict[str, float]:
    """Paired on/off ratios: the geometric mean with a 95 % t interval and a bootstrap percentile
    interval, and the median with a bootstrap interval (all on log ratios, so x1.02 and x0.98
    weigh alike). The median resists the whole-response stalls that hit single blocks."""
    import math
    import random

    logs = [math.log(r) for r in ratios]
    n, mean = len(logs), statistics.fmean(logs)
    half = _t975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    rng = random.Random(seed)
    means, medians = [], []
    for _ in range(boot):
        sample = rng.choices(logs, k=n)
        means.append(statistics.fmean(sample))
        medians.append(statistics.median(sample))
    means.sort()
    medians.sort()
    lo, hi = int(0.025 * boot), int(0.975 * boot)
    return {
        "n": n,
        "ratio": math.exp(mean),
        "t95_lo": math.exp(mean - half),
        "t95_hi": math.exp(mean + half),
        "boot95_lo": math.exp(means[lo]),
        "boot95_hi": math.exp(means[hi]),
        "median_ratio": math.exp(statistics.median(logs)),
        "median_boot95_lo": math.exp(medians[lo]),
        "median_boot95_hi": math.exp(medians[hi]),
    }


def stalled(block: dict[str, float]) -> bool:
    """A block where streaming stalled: whole responses at once (TPOT p50 under 0.5 ms) or a
    TTFT p50 over 0.5 s (the issue's symptom; ~4-10 ms TPOT and ~10-40 ms TTFT otherwise)."""
    return block["tpot_p50_ms"] < 0.5 or block["ttft_p50_ms"] > 500


def ab_summary(pairs: list[tuple[dict[str, float], dict[str, float]]]) -> dict[str, Any]:
    """(on, off) block figures -> each figure's on/off interval, over all pairs and over the pairs
    where neither block stalled, and how many blocks of each arm stalled."""
    out: dict[str, Any] = {"pairs": len(pairs)}
    clean = [(a, b) for a, b in pairs if not stalled(a) and not stalled(b)]
    for name, chosen in (("on_over_off", pairs), ("on_over_off_unstalled_pairs", clean)):
        out[name] = {
            key: ratio_interval([a[key] / b[key] for a, b in chosen if a[key] > 0 and b[key] > 0])
            for key in _figures(chosen)
            if len(chosen) >= 3
        }
    out["stalled_blocks"] = {
        "on": sum(stalled(a) for a, _ in pairs),
        "off": sum(stalled(b) for _, b in pairs),
    }
    return out


def _dumped_pairs(paths: list[Path]) -> list[tuple[dict[str, float], dict[str, float]]]:
    """(on, off) blocks from the per-block JSONL of `--mode ab --dump` runs (pairs stay within a
    run)."""
    pairs = []
    for path in paths:
        by_pair: dict[int, dict[str, dict[str, float]]] = {}
        for line in path.read_text().splitlines():
            row = json.loads(line)
            by_pair.setdefault(row["pair"], {})[row["arm"]] = row
        pairs += [(p["on"], p["off"]) for p in by_pair.values() if len(p) == 2]
    return pairs


def ab_from_dumps(paths: list[Path], null_paths: list[Path] | None = None) -> dict[str, Any]:
    """Pool `--mode ab --dump` runs; with `null_paths` (A/A runs, `--null`) also the effect net
    of the method's own spread (effect_vs_null)."""
    pairs = _dumped_pairs(paths)
    out = {"dumps": [str(p) for p in paths], **ab_summary(pairs)}
    if null_paths:
        out["null_dumps"] = [str(p) for p in null_paths]
        out["net_of_null"] = effect_vs_null(pairs, _dumped_pairs(null_paths))
    return out


def effect_vs_null(
    ab: list[tuple[dict[str, float], dict[str, float]]],
    null: list[tuple[dict[str, float], dict[str, float]]],
    *,
    boot: int = 20000,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """The A/B's on/off ratio divided by the A/A control's, per figure: the ratio of their median
    (and mean) log ratios with 95 % bootstrap intervals, resampling the pairs of each run on its
    own. What the A/A shows with nothing different (drift, order, noise) is taken out, and its
    spread widens the interval, as it should."""
    import math
    import random

    rng = random.Random(seed)
    out: dict[str, dict[str, float]] = {}
    for key in (k for k in _figures(ab) if k in _figures(null)):
        logs = [
            [math.log(a[key] / b[key]) for a, b in pairs if a[key] > 0 and b[key] > 0]
            for pairs in (ab, null)
        ]
        if min(len(x) for x in logs) < 3:
            continue
        medians, means = [], []
        for _ in range(boot):
            s_ab, s_null = (rng.choices(x, k=len(x)) for x in logs)
            medians.append(statistics.median(s_ab) - statistics.median(s_null))
            means.append(statistics.fmean(s_ab) - statistics.fmean(s_null))
        medians.sort()
        means.sort()
        lo, hi = int(0.025 * boot), int(0.975 * boot)
        out[key] = {
            "n_ab": len(logs[0]),
            "n_null": len(logs[1]),
            "median_ratio": math.exp(statistics.median(logs[0]) - statistics.median(logs[1])),
            "median_boot95_lo": math.exp(medians[lo]),
            "median_boot95_hi": math.exp(medians[hi]),
            "mean_ratio": math.exp(statistics.fmean(logs[0]) - statistics.fmean(logs[1])),
            "mean_boot95_lo": math.exp(means[lo]),
            "mean_boot95_hi": math.exp(means[hi]),
        }
    return out


SCRAPE_TAIL_S = 0.005  # a scrape holds the server a little past its answer's arrival


def _meets_scrape(a: float, z: float, spans: list[tuple[float, float]], shift: float) -> bool:
    """Whether [a, z] overlaps one of `spans` moved `shift` seconds later (to SCRAPE_TAIL_S past
    its end)."""
    return any(a < s1 + shift + SCRAPE_TAIL_S and z > s0 + shift for s0, s1 in spans)


def _gaps_near(
    blocks: list[dict[str, Any]], spans: list[tuple[float, float]], interval: float
) -> dict[str, Any]:
    """Inter-token gaps of the "on" blocks that overlap a scrape (its start to 5 ms past its end:
    the server renders while the client waits for the answer), and, as the control, those that
    overlap the same spans moved half an interval later (between scrapes). A long gap is more
    likely to overlap any span, so only the difference to the control is the scrape's stall."""

    def overlapping(shift: float) -> list[float]:
        got = []
        for b in blocks:
            mine = [(s0, s1) for s0, s1 in spans if b["t0"] - 1 <= s0 <= b["t1"]]
            for times in b["token_times"]:
                for a, z in zip(times, times[1:], strict=False):
                    if _meets_scrape(a, z, mine, shift):
                        got.append(1000 * (z - a))
        return got

    near, control = overlapping(0.0), overlapping(interval / 2)
    out: dict[str, Any] = {
        "near_scrape": _dist(near),
        "control_half_interval_later": _dist(control),
    }
    if near and control:
        out["stall_per_scrape_ms"] = statistics.fmean(near) - statistics.fmean(control)
    return out


def _ttft_near(
    blocks: dict[str, list[dict[str, Any]]], spans: list[tuple[float, float]], interval: float
) -> dict[str, Any]:
    """Client TTFTs of the "on" blocks' requests whose send-to-first-token window overlaps a
    scrape (to 5 ms past its end), of those that overlap none, the control (overlapping the same
    spans moved half an interval later), and all of the "off" blocks'. A TTFT effect confined to
    the overlapping requests is the scrape's own stall; one spread over every request is not."""

    on = [(1000 * (z - a), (a, z)) for b in blocks["on"] for a, z in b["ttft_windows"]]
    return {
        "on_overlapping_scrape": _dist([t for t, w in on if _meets_scrape(*w, spans, 0.0)]),
        "on_clear_of_scrapes": _dist([t for t, w in on if not _meets_scrape(*w, spans, 0.0)]),
        "control_half_interval_later": _dist(
            [t for t, w in on if _meets_scrape(*w, spans, interval / 2)]
        ),
        "off": _dist([1000 * (z - a) for b in blocks["off"] for a, z in b["ttft_windows"]]),
    }


def _dist(ms: list[float]) -> dict[str, float] | None:
    if not ms:
        return None
    s = sorted(ms)
    return {"count": len(s), "mean_ms": statistics.fmean(s), "p50_ms": statistics.median(s),
            "p99_ms": s[int(0.99 * (len(s) - 1))], "max_ms": s[-1]}  # fmt: skip


def paired_ab(
    url: str,
    model: str,
    server_pid: int | None,
    pairs: int,
    prompts: int,
    interval: float,
    dump: Path | None = None,
    *,
    watch_mode: str = "now",
    max_s: float = 480.0,
    null: bool = False,
    settle_s: float = 0.0,
    placebo: bool = False,
    background: int = 0,
    server_view: bool = True,
) -> dict[str, Any]:
    """Up to `pairs` ABBA pairs of blocks (after one warm-up block) within `max_s`, the monitor's
    loop (`watch_mode`, see _observer_watch.py) running or idle; `null`: idle in both arms (an
    A/A control: the spread the method shows when nothing differs). `settle_s`: wait this long
    plus a random part of one interval after switching the monitor, in both arms, so that a block
    meets a monitor in its steady rhythm at a random phase, not the scrape it makes on resuming
    (nor, with a whole-second wait, one of its ticks). `placebo`: the "off" arm runs a second
    monitor process in `placebo` mode (the same loop on a canned copy of the text, see
    _observer_watch.py) instead of no monitor, so "on"/"off" is what scraping the server costs
    it, with the monitor's own presence on the client's CPUs the same in both arms.
    `background`: that many more streams (a `kimictl bench` process) run through the whole A/B, so
    the server never idles between blocks (an idle vLLM CPU engine stops spinning after 1 s and
    the box's cores go idle; the first tokens after that are slower). `server_view=False` leaves
    out the two small scrapes around each block (and with them the server's own figures), as the
    design was before they existed."""
    import random

    phase = random.Random(0)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        record, out = Path(tmp) / "rec.jsonl", Path(tmp) / "watch.json"
        p_record, p_out = Path(tmp) / "placebo.jsonl", Path(tmp) / "placebo.json"
        mon = _start_watch(url, watch_mode, record, out, interval)
        plc = _start_watch(url, "placebo", p_record, p_out, interval) if placebo else None
        bg = None
        if background:
            bg = subprocess.Popen(
                [sys.executable, "-m", "kimictl", "bench", "-t", url, "--input-len", "32",
                 "--output-len", "256", "--concurrency", str(background), "--warmup", "0",
                 "--duration", str(max_s + 3600), "--no-metrics"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        blocks: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        cpu: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
        try:
            # it starts running (a USR signal before its handlers are set would kill it): its
            # imports (seconds of CPU here) and two rounds settle before it is paused
            deadline = time.monotonic() + 120
            for proc, rec in ((mon, record), (plc, p_record)):
                if proc is not None and not _steady(proc, rec, deadline):
                    raise RuntimeError("the monitor did not start")
            for proc in (mon, plc):
                if proc is not None:
                    proc.send_signal(signal.SIGUSR1)
            _block(url, model, prompts)  # warm-up
            t_end = time.monotonic() + max_s
            for i in range(pairs):
                if time.monotonic() > t_end:  # keep the run inside its time budget
                    break
                for arm in ("off", "on") if i % 2 == 0 else ("on", "off"):
                    on = arm == "on" and not null
                    mon.send_signal(signal.SIGUSR2 if on else signal.SIGUSR1)
                    if plc is not None:
                        plc.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)
                    if settle_s:
                        time.sleep(settle_s + phase.random() * interval)
                    c0 = _tree_cpu_s(server_pid) if server_pid else {}
                    m0, w0 = _proc_cpu_s(mon.pid), time.perf_counter()
                    before = server_sums(url) if server_view else None
                    blk = _block(url, model, prompts)
                    wall = time.perf_counter() - w0
                    if before is not None:
                        blk.update(server_means(before, server_sums(url)))
                    c1 = _tree_cpu_s(server_pid) if server_pid else {}
                    api = (c1.get(server_pid, 0) - c0.get(server_pid, 0)) if server_pid else 0.0
                    every = sum(v - c0.get(p, 0.0) for p, v in c1.items())
                    cpu[arm].append({"wall_s": wall, "server_api_cpu_s": api,
                                     "server_all_cpu_s": every,
                                     "monitor_cpu_s": _proc_cpu_s(mon.pid) - m0})  # fmt: skip
                    blocks[arm].append(blk)
                    if dump is not None:  # a crash later keeps what was measured
                        row = {k: blk[k] for k in AB_FIGURES if k in blk}
                        with dump.open("a") as fh:
                            fh.write(json.dumps({"pair": i, "arm": arm, **row, **cpu[arm][-1]}))
                            fh.write("\n")
        finally:
            for proc in (mon, plc, bg):
                if proc is not None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=30)
        watch = json.loads(out.read_text())
        placebo_scrapes = len(json.loads(p_out.read_text())["scrape_spans"]) if placebo else 0
    spans = [tuple(s) for s in watch["scrape_spans"]]
    on_spans = [s for s in spans if any(b["t0"] - 1 <= s[0] <= b["t1"] for b in blocks["on"])]
    stray = [
        s for s in spans if any(b["t0"] <= s[0] <= b["t1"] for b in blocks["off"])
    ]  # a scrape inside an "off" block would make the A/B wrong
    on_wall = sum(c["wall_s"] for c in cpu["on"])
    sums = {arm: {k: sum(c[k] for c in cs) for k in cs[0]} for arm, cs in cpu.items()}
    return {
        "watch_mode": watch_mode,
        "null": null,
        "placebo": placebo,
        "placebo_scrapes": placebo_scrapes,
        "background_streams": background,
        "server_view": server_view,
        "settle_s": settle_s,
        "prompts_per_block": prompts,
        "interval_s": interval,
        **ab_summary(list(zip(blocks["on"], blocks["off"], strict=True))),
        "blocks": {
            arm: [{k: b[k] for k in AB_FIGURES if k in b} for b in bs] for arm, bs in blocks.items()
        },
        "ttft_near_scrape": _ttft_near(blocks, on_spans, interval),
        "cpu_totals": sums,
        "scrapes_in_on_blocks": len(on_spans),
        "scrape_rate_hz": len(on_spans) / on_wall,
        "scrapes_in_off_blocks": len(stray),
        "scrape_ms": _dist([1000 * (s1 - s0) for s0, s1 in on_spans]),
        "token_gaps_on_blocks": _gaps_near(blocks["on"], on_spans, interval),
        "token_gaps_off_blocks": _dist(
            [
                1000 * (z - a)
                for b in blocks["off"]
                for t in b["token_times"]
                for a, z in zip(t, t[1:], strict=False)
            ]
        ),  # fmt: skip
        "load_avg_start_end": [load0, os.getloadavg()[0]],
    }


def print_ratios(result: dict[str, Any]) -> None:
    """The on/off table of ab_summary: mean and median ratios with their 95 % intervals."""
    stalls = result["stalled_blocks"]
    print(f"{result['pairs']} pairs; stalled blocks: on {stalls['on']}, off {stalls['off']}")
    for name in ("on_over_off", "on_over_off_unstalled_pairs"):
        print(f"{name:<16}{'n':>4}{'geo mean':>10}{'t 95%':>18}{'boot 95%':>18}"
              f"{'median':>9}{'boot 95%':>18}")  # fmt: skip
        for key, ci in result[name].items():
            print(f"  {key:<14}{ci['n']:>4}{ci['ratio']:>10.4f}"
                  f"  [{ci['t95_lo']:.3f}, {ci['t95_hi']:.3f}]"
                  f"  [{ci['boot95_lo']:.3f}, {ci['boot95_hi']:.3f}]{ci['median_ratio']:>9.4f}"
                  f"  [{ci['median_boot95_lo']:.3f}, {ci['median_boot95_hi']:.3f}]")  # fmt: skip


def print_net(result: dict[str, Any]) -> None:
    """effect_vs_null's table, when the pooled result has one."""
    if "net_of_null" not in result:
        return
    print(f"{'net of A/A':<16}{'n':>9}{'median':>9}{'boot 95%':>18}{'mean':>9}{'boot 95%':>18}")
    for key, ci in result["net_of_null"].items():
        print(f"  {key:<14}{ci['n_ab']:>4}/{ci['n_null']:<4}{ci['median_ratio']:>9.4f}"
              f"  [{ci['median_boot95_lo']:.3f}, {ci['median_boot95_hi']:.3f}]"
              f"{ci['mean_ratio']:>9.4f}"
              f"  [{ci['mean_boot95_lo']:.3f}, {ci['mean_boot95_hi']:.3f}]")  # fmt: skip


def print_ab(result: dict[str, Any]) -> None:
    print_ratios(result)
    print(
        f"scrapes in on blocks: {result['scrapes_in_on_blocks']} "
        f"({result['scrape_rate_hz']:.2f} Hz), in off blocks: {result['scrapes_in_off_blocks']}"
    )
    print(f"scrape latency in on blocks: {result['scrape_ms']}")
    for arm, c in result["cpu_totals"].items():
        print(f"cpu {arm}: {c}")
    print(f"token gaps on: {result['token_gaps_on_blocks']}")
    print(f"token gaps off: {result['token_gaps_off_blocks']}")
    for name, dist in result["ttft_near_scrape"].items():
        print(f"TTFT {name}: {dist}")
