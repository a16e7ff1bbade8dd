"""How often the paired replay verdict (`kimictl bench --paired`) is wrong, on REAL servers.

Starts two identical traced vLLM CPU servers (the tiny K2-architecture model, the same flags, each
engine bound to its own core, `--cores`, each sending its spans to one receiver port). Then:

1. `--aa-runs` A/A replays: each a fresh synthetic Mooncake trace (`--rows` rows, Poisson arrivals
   at `--rate` rows/s, input 16-96 and output 16-40 tokens, seeded by the run) replayed paired to
   the two identical servers through `run_paired` (what the command runs). Each replay keeps its
   per-row log ratios, so `paired_aa_calibrated.py` can judge it as the product does, with or
   without an A/A calibration made of the other A/A replays.
2. B made slower: B's whole process group (API server and engine) is stopped with SIGSTOP for
   `--stop` of every `--period-ms` and continued with SIGCONT (what cpulimit does): whatever B's
   threads do when they run (vLLM CPU's OMP threads spin, so a busy loop beside them did not slow
   them), B runs only (1 - stop) of the wall time. `--runs` paired replays; "B worse" = detected.
3. The true slowdown, measured apart: the same traces replayed to one server at a time (A alone,
   B alone, B alone duty-cycled, `--apart` rounds), the same requests and span figures; B slowed
   / B plain and B / A of the per-row geometric mean interactivity.

`--million`: only the checking pass over a million-row trace, time and peak Python memory
(tracemalloc); no server.

`--whole-server` keeps each server's processes on its engine's core (taskset), as docs/bench.md
tells an operator to; `--first` seeds a later chunk's traces apart from an earlier one's.
`--chain K` runs phases 1 and 2 as one sequence whose every K-th pass is B-slowed, so each
replay has A/A passes on both sides (`paired_aa_calibrated.py --bracket`); each pass keeps its
place (`seq`).

    PYTHONPATH=. flock /tmp/kimictl-vllm.lock nice python lab/bench/paired_aa_study.py \
        --aa-runs 14 --runs 20 --rows 64 --rate 4 --stop 0.5 --apart 2 --whole-server \
        --first 100 --out lab/data/paired_whole_c1.json
    PYTHONPATH=. flock /tmp/kimictl-vllm.lock nice python lab/bench/paired_aa_study.py \
        --aa-runs 26 --runs 10 --chain 3 --rows 64 --rate 4 --stop 0.3 --apart 1 \
        --whole-server --no-command --first 300 --out lab/data/paired_chain_c1.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx

from kimictl.core.http1 import own_request_headers
from kimictl.deployment.traces import kimictl_endpoint, tracing_env
from kimictl.runtime.load.mooncake import scan_trace
from kimictl.runtime.load.paired import PairedConfig, run_paired
from kimictl.runtime.load.records import LoadTarget
from kimictl.runtime.observe.otlp import OtlpReceiver, TraceStore
from kimictl.runtime.serving import cpu_runtime, launcher, tinymodel
from kimictl.runtime.verdict.paired import wilson


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(
    run_dir: Path, traces_port: int, core: str, whole: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    """One traced server; its engine's OMP thread bound to `core`, and with `whole` all of its
    processes (API server, engine core, worker) kept on that core (taskset)."""
    port = free_port()
    endpoint = kimictl_endpoint(traces_port)
    env = cpu_runtime.server_env(run_dir) | tracing_env(endpoint, host="127.0.0.1", port=port)
    env["VLLM_CPU_OMP_THREADS_BIND"] = core  # each engine its own core (auto puts both on 0)
    if core == "nobind":  # one unbound thread: the kernel places both engines alike
        env["OMP_NUM_THREADS"] = "1"
    argv = cpu_runtime.server_argv(
        tinymodel.build(0, None), port=port, extra=["--otlp-traces-endpoint", endpoint]
    )
    if whole and core != "nobind":
        argv = ["taskset", "-c", core, *argv]
    log = (run_dir / "vllm.log").open("wb")
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=launcher.child_setup(os.getpid(), cpu_runtime.SERVER_NICE),
    )
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(900):
        if proc.poll() is not None:
            raise SystemExit(f"server {url} exited with {proc.returncode}")
        try:
            r = httpx.post(
                f"{url}/v1/completions",
                json={"model": "tiny-k2", "prompt": "hi", "max_tokens": 1},
                headers=own_request_headers("probe"),
                timeout=10,
            )
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"server {url} not ready")


class DutyCycle:
    """Stop a process group for `stop` of every `period_s` (SIGSTOP, then SIGCONT), in a thread,
    as cpulimit does; `close()` always leaves the group running."""

    def __init__(self, pgid: int, stop: float, period_s: float) -> None:
        self.pgid, self.stop, self.period = pgid, stop, period_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            os.killpg(self.pgid, signal.SIGSTOP)
            time.sleep(self.stop * self.period)
            os.killpg(self.pgid, signal.SIGCONT)
            self.done.wait((1.0 - self.stop) * self.period)

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        os.killpg(self.pgid, signal.SIGCONT)


def write_trace(path: Path, rows: int, rate: float, seed: int) -> Path:
    rng = random.Random(f"paired-study/{seed}")
    t = 0.0
    lines = []
    for _ in range(rows):
        lines.append(
            json.dumps(
                {
                    "timestamp": int(t * 1000),
                    "input_length": rng.randint(16, 96),
                    "output_length": rng.randint(16, 40),
                }
            )
        )
        t += rng.expovariate(rate)
    path.write_text("\n".join(lines) + "\n")
    return path


def row_logs(rows: list[Any], a: str, b: str) -> list[float | None]:
    """Per row, log(interactivity B / A) from the spans (TPOT A / TPOT B); None if unjoined."""
    out: list[float | None] = []
    for r in rows:
        sa, sb = r.arms[a].span, r.arms[b].span
        ok = sa is not None and sb is not None and sa.tpot_s and sb.tpot_s
        out.append(math.log(sa.tpot_s / sb.tpot_s) if ok else None)
    return out


async def replay(
    trace: Path, urls: list[str], store: TraceStore, seed: int, aa: bool, max_lag: float
) -> dict[str, Any]:
    cfg = PairedConfig(
        trace=trace,
        targets=(LoadTarget("a", urls[0], "tiny-k2"), LoadTarget("b", urls[1], "tiny-k2")),
        traces_port=0,
        aa=aa,
        seed=seed,
        max_lag_ms=max_lag,
    )
    out = await run_paired(cfg, store=store)
    doc = out.to_json()
    v = doc["verdict"]
    return {
        "decision": None if v is None else v["decision"],
        "ratio": None if v is None else v["ratio"],
        "lo": None if v is None else v["lo"],
        "hi": None if v is None else v["hi"],
        "withheld": doc["withheld"],
        "joins": doc["span_joins"],
        "late_p99_ms": doc["fidelity"]["late_p99_ms"],
        "logs": row_logs(out.rows, "a", "b"),
    }


async def replay_alone(
    trace: Path, url: str, arm: str, store: TraceStore, seed: int
) -> list[float]:
    """The trace replayed to ONE server on its clock (the paired replay's requests, ids and span
    join, no second arm): per row, the span's interactivity (1 / TPOT); nan if unjoined."""
    from kimictl.core.http1 import Endpoint
    from kimictl.runtime.load import paired as P
    from kimictl.runtime.load.mooncake import iter_trace

    t = LoadTarget(arm, url, "tiny-k2")
    cfg = PairedConfig(trace=trace, targets=(t, t), traces_port=0, seed=seed)
    spans = P._Spans(time.time())
    store.listeners.append(spans.take)
    ep = Endpoint(url, None)
    results = []
    try:
        t_run = time.perf_counter()
        tasks = []
        for row in iter_trace(trace):
            await asyncio.sleep(max(0.0, t_run + row.at_s - time.perf_counter()))
            res = P.ArmResult(row.at_s)
            results.append((row.index, res))
            prompt = P._prompt(seed, row)
            tasks.append(asyncio.create_task(P._send(ep, t, row, prompt, res, cfg, t_run)))
        await asyncio.gather(*tasks)
        deadline = time.monotonic() + P.SPAN_WAIT_S
        while len(spans.by_key) < len(results) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        store.listeners.remove(spans.take)
        ep.close()
    out = []
    for i, _ in results:
        span = spans.by_key.get(f"{i}-{arm}")
        out.append(1.0 / span.tpot_s if span is not None and span.tpot_s else math.nan)
    return out


def million_rows(tmp: Path) -> dict[str, Any]:
    path = tmp / "million.jsonl"
    with path.open("w") as fh:
        for i in range(1_000_000):
            fh.write(f'{{"timestamp": {i * 10}, "input_length": 512, "output_length": 64}}\n')
    tracemalloc.start()
    t0 = time.perf_counter()
    scan = scan_trace(path, max_context=4096)
    took = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "rows": scan.rows,
        "bytes": path.stat().st_size,
        "scan_s": took,
        "peak_python_mb": peak / 2**20,
    }


def command_run(tmp: Path, urls: list[str], traces_port: int, slow: Any) -> str:
    """`kimictl bench --paired` as an operator runs it (docs/bench.md quotes it): 3 A/A passes,
    the A/B (B duty-cycled) judged net of them with --aa-report, 2 A/A passes after it, then the
    A/B judged again with all 5 (`--judge`, a bracket)."""
    base = [sys.executable, "-m", "kimictl", "bench", "--paired"]
    arms = ["--target", f"a={urls[0]}", "--target", f"b={urls[1]}",
            "--traces-port", str(traces_port)]  # fmt: skip
    shown = []
    reports: list[str] = []

    def kimictl(argv: list[str]) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        shown.append(
            f"$ {' '.join(argv[3:])}  (exit {done.returncode})\n{done.stdout}{done.stderr}"
        )

    for i in range(6):
        trace = write_trace(tmp / f"command-{i}.jsonl", 24, 4.0, 90 + i)
        ab = i == 3
        extra = [x for r in reports for x in ("--aa-report", r)] if ab else ["--aa"]
        out = tmp / ("ab.json" if ab else f"aa{len(reports) + 1}.json")
        cycle = slow() if ab else None
        try:
            kimictl([*base, *arms, "--trace", str(trace), *extra, "-o", str(out)])
        finally:
            if cycle is not None:
                cycle.close()
        if not ab:
            reports.append(str(out))
    judge = [x for r in reports for x in ("--aa-report", r)]
    kimictl([*base, "--judge", str(tmp / "ab.json"), *judge, "-o", str(tmp / "ab-judged.json")])
    return "\n".join(shown)


def tally(runs: list[dict[str, Any]], hit: tuple[str, ...]) -> dict[str, Any]:
    judged = [r for r in runs if r["decision"] is not None]
    k = sum(1 for r in judged if r["decision"] in hit)
    lo, hi = wilson(k, len(judged))
    return {"runs": len(runs), "judged": len(judged), "hits": k, "wilson95": [lo, hi]}


def gmean_ratio(num: list[float], den: list[float]) -> float:
    pairs = [(x, y) for x, y in zip(num, den, strict=True) if x > 0 and y > 0]
    return math.exp(sum(math.log(x / y) for x, y in pairs) / len(pairs))


def apart(
    tmp: Path, urls: list[str], store: TraceStore, rounds: int, slow: Any, rows: int, rate: float
) -> dict[str, Any]:
    """A alone, B alone, B alone slowed: the same traces, one server at a time, `rounds` each."""
    got: dict[str, list[float]] = {"a": [], "b": [], "b_slowed": []}
    for i in range(rounds):
        trace = write_trace(tmp / f"apart-{i}.jsonl", rows, rate, 1000 + i)
        for name in ("a", "b", "b_slowed"):
            cycle = slow() if name == "b_slowed" else None
            try:
                url = urls[0] if name == "a" else urls[1]
                got[name] += asyncio.run(replay_alone(trace, url, name[0], store, 1000 + i))
            finally:
                if cycle is not None:
                    cycle.close()
            time.sleep(1)
    return {
        "rows": len(got["a"]),
        "b_slowed_over_b": gmean_ratio(got["b_slowed"], got["b"]),
        "b_over_a": gmean_ratio(got["b"], got["a"]),
        "b_slowed_over_a": gmean_ratio(got["b_slowed"], got["a"]),
        "per_row": got,
    }


def plan(args: argparse.Namespace) -> list[tuple[str, int]]:
    """The passes in order, (phase, trace seed): all A/A passes then all B-slowed ones, or with
    `--chain K` one sequence whose every K-th pass is B-slowed, so each has A/A passes on both
    sides (a bracketed calibration, `paired_aa_calibrated.py --bracket`)."""
    aa = [("aa", args.first + i) for i in range(args.aa_runs)]
    slow = [("b_slower", args.first + i) for i in range(args.runs)]
    if not args.chain:
        return aa + slow
    out: list[tuple[str, int]] = []
    while aa or slow:
        take_slow = slow and (not aa or len(out) % args.chain == args.chain - 1)
        out.append(slow.pop(0) if take_slow else aa.pop(0))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aa-runs", type=int, default=25)
    ap.add_argument("--runs", type=int, default=20, help="replays with B slowed")
    ap.add_argument("--first", type=int, default=0, help="first trace seed (a study in chunks)")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--stop", type=float, default=0.5, help="share of each period B is stopped")
    ap.add_argument("--period-ms", type=float, default=100.0)
    ap.add_argument("--apart", type=int, default=4, help="rounds of the slowdown measured apart")
    ap.add_argument(
        "--apart-also",
        type=float,
        nargs="*",
        default=[],
        help="more stop shares whose slowdown is measured apart (an earlier chunk's)",
    )
    ap.add_argument("--max-lag-ms", type=float, default=250.0)
    ap.add_argument(
        "--cores",
        default="0,1",
        help="the engines' cores (vLLM's OMP binding), or nobind: one unbound thread each",
    )
    ap.add_argument(
        "--whole-server",
        action="store_true",
        help="keep each server's processes (API server, engine core, worker) on its engine's core",
    )
    ap.add_argument(
        "--chain", type=int, default=0, help="one sequence, every K-th pass B-slowed (K >= 2)"
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--million", action="store_true", help="only check a million-row trace")
    ap.add_argument("--no-command", action="store_true", help="skip the command's own run")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: save what was measured
    tmp = Path(tempfile.mkdtemp(prefix="paired-study-"))
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.million:  # no server: outside the vLLM lock
        result["million_rows"] = million_rows(tmp)
        args.out.write_text(json.dumps(result, indent=2))
        print("million rows:", result["million_rows"], flush=True)
        return 0
    traces_port = free_port()
    receiver = None
    procs = []
    t0 = time.monotonic()

    def save() -> None:
        result["wall_s"] = time.monotonic() - t0
        args.out.write_text(json.dumps(result, indent=2))

    try:
        for name in ("a", "b"):
            (tmp / name).mkdir()
            cores = args.cores.split(",") if args.cores != "nobind" else ["nobind"] * 2
            procs.append(start(tmp / name, traces_port, cores[len(procs)], args.whole_server))
        for proc, url in procs:
            wait_ready(url, proc)
        urls = [url for _, url in procs]
        print(f"servers ready after {time.monotonic() - t0:.0f} s", flush=True)

        def slow() -> DutyCycle:
            return DutyCycle(procs[1][0].pid, args.stop, args.period_ms / 1000.0)

        # the command's own receiver first, then the study's on the same port
        if not args.no_command:
            result["command_run"] = command_run(tmp, urls, traces_port, slow)
            print(result["command_run"], flush=True)
            save()
        receiver = OtlpReceiver(port=traces_port).start()

        for seq, (phase, i) in enumerate(plan(args)):
            aa = phase == "aa"
            cycle = None if aa else slow()
            try:
                trace = write_trace(tmp / f"{phase}-{i}.jsonl", args.rows, args.rate, i)
                r = asyncio.run(replay(trace, urls, receiver.store, i, aa, args.max_lag_ms))
            finally:
                if cycle is not None:
                    cycle.close()
            r["seq"] = seq  # its place in the study's order (bracketing A/A passes around it)
            runs = result.setdefault(phase, {"runs": []})["runs"]
            runs.append(r)
            print(phase, i, {k: v for k, v in r.items() if k != "logs"}, flush=True)
            result[phase]["called"] = tally(runs, ("B better", "B worse") if aa else ("B worse",))
            save()  # a cut run keeps what it measured
        for stop in [args.stop, *args.apart_also] if args.apart > 0 else []:

            def slowed(stop: float = stop) -> DutyCycle:
                return DutyCycle(procs[1][0].pid, stop, args.period_ms / 1000.0)

            got = apart(tmp, urls, receiver.store, args.apart, slowed, args.rows, args.rate)
            result["apart" if stop == args.stop else f"apart_stop_{stop}"] = got
            shown = {k: v for k, v in got.items() if k != "per_row"}
            print(f"apart, stop {stop}:", shown, flush=True)
            save()
    finally:
        if receiver is not None:
            receiver.close()
        for proc, _ in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
        save()
    print(json.dumps({k: v["called"] for k, v in result.items() if k in ("aa", "b_slower")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
