"""How often the paired replay verdict (`kimictl bench --paired`) is wrong, on REAL servers.

Starts two identical traced vLLM CPU servers (the tiny K2-architecture model, the same flags,
each sending its spans to one receiver port). Then:

1. `--runs` A/A replays: each a fresh synthetic Mooncake trace (`--rows` rows, Poisson arrivals at
   `--rate` rows/s, input 16-96 and output 16-40 tokens, seeded by the run) replayed paired to the
   two identical servers through `run_paired` (what the command runs); a "B better"/"B worse" is a
   false alarm. Rate and its Wilson 95% interval.
   Each engine is bound to its own core (`--cores`, vLLM's VLLM_CPU_OMP_THREADS_BIND): with
   vLLM's `auto` binding both engines take core 0 and, loaded at once, one starves the other
   for seconds (the first study, lab/data/paired_aa_study_shared_core.json: 14/20 false).
2. B made slower: a busy loop pinned to B's core, niced and grouped as the servers are, so B's
   engine gets about half of its core. `--runs` replays; the rate of "B worse" (detection).
3. The true slowdown measured apart: B alone (no paired load, one request at a time, client
   timings, `run_bench`), interactivity p50 with the busy loop / without it.

`--million`: only the checking pass over a million-row trace, time and peak Python memory
(tracemalloc); no server.

    PYTHONPATH=. flock /tmp/kimictl-vllm.lock nice python lab/bench/paired_aa_study.py \
        --runs 20 --rows 16 --rate 4 --out lab/results/paired_aa_study.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
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


def start(run_dir: Path, traces_port: int, core: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    endpoint = kimictl_endpoint(traces_port)
    env = cpu_runtime.server_env(run_dir) | tracing_env(endpoint, host="127.0.0.1", port=port)
    env["VLLM_CPU_OMP_THREADS_BIND"] = core  # each engine its own core (auto puts both on 0)
    argv = cpu_runtime.server_argv(
        tinymodel.build(0, None), port=port, extra=["--otlp-traces-endpoint", endpoint]
    )
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


def start_hog(core: int) -> subprocess.Popen[bytes]:
    """A busy loop on `core`, niced and grouped as the servers are: B's engine gets about half of
    its core while it runs."""
    code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass\n"
    return subprocess.Popen(
        [sys.executable, "-c", code],
        start_new_session=True,
        preexec_fn=launcher.child_setup(os.getpid(), cpu_runtime.SERVER_NICE),
    )


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
    }


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


async def alone(url: str) -> float:
    """B alone (no paired load), one request at a time: interactivity p50 from the client."""
    from kimictl.runtime.load.bench import BenchConfig, run_bench
    from kimictl.runtime.load.records import LoadPoint
    from kimictl.runtime.load.workloads import RandomWorkload, parse_length

    cfg = BenchConfig(
        targets=(LoadTarget("b", url, "tiny-k2"),),
        workload=RandomWorkload(parse_length("16:96"), parse_length("16:40")),
        points=(LoadPoint(concurrency=1),),
        num_prompts=12,
        warmup=2,
        scrape_metrics=False,
    )
    out = await run_bench(cfg)
    return float(out.summaries[0]["kimictl"]["interactivity_tok_s_per_user"]["p50"])


def command_run(tmp: Path, urls: list[str], traces_port: int) -> str:
    """`kimictl bench --paired --aa` as an operator runs it (docs/bench.md quotes it)."""
    trace = write_trace(tmp / "command.jsonl", 24, 4.0, 99)
    argv = [sys.executable, "-m", "kimictl", "bench", "--paired", "--aa", "--trace", str(trace),
            "--target", f"a={urls[0]}", "--target", f"b={urls[1]}",
            "--traces-port", str(traces_port), "-o", str(tmp / "command.json")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return f"$ kimictl bench --paired --aa --trace trace.jsonl ... (exit {done.returncode})\n" + (
        done.stdout + done.stderr
    )


def tally(runs: list[dict[str, Any]], hit: tuple[str, ...]) -> dict[str, Any]:
    judged = [r for r in runs if r["decision"] is not None]
    k = sum(1 for r in judged if r["decision"] in hit)
    lo, hi = wilson(k, len(judged))
    return {"runs": len(runs), "judged": len(judged), "hits": k, "wilson95": [lo, hi]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--max-lag-ms", type=float, default=250.0)
    ap.add_argument("--cores", default="0,1", help="the engines' cores (vLLM's OMP binding)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--million", action="store_true", help="only check a million-row trace")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="paired-study-"))
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.million:  # no server: outside the vLLM lock
        result["million_rows"] = million_rows(tmp)
        args.out.write_text(json.dumps(result, indent=2))
        print("million rows:", result["million_rows"], flush=True)
        return 0
    # one receiver for the whole study, after the command's own run below: each server's exporter
    # keeps its connection to the receiver it meets
    traces_port = free_port()
    receiver = OtlpReceiver(port=traces_port)
    procs = []
    hog = None
    t0 = time.monotonic()
    try:
        for name in ("a", "b"):
            (tmp / name).mkdir()
            procs.append(start(tmp / name, traces_port, args.cores.split(",")[len(procs)]))
        for proc, url in procs:
            wait_ready(url, proc)
        urls = [url for _, url in procs]
        print(f"servers ready after {time.monotonic() - t0:.0f} s", flush=True)
        result["command_run"] = command_run(tmp, urls, traces_port)
        print(result["command_run"], flush=True)
        receiver.start()
        for phase, aa in (("aa", True), ("b_slower", False)):
            if phase == "b_slower":
                hog = start_hog(int(args.cores.split(",")[1]))
            runs = []
            for i in range(args.runs):
                trace = write_trace(tmp / f"{phase}-{i}.jsonl", args.rows, args.rate, i)
                r = asyncio.run(replay(trace, urls, receiver.store, i, aa, args.max_lag_ms))
                runs.append(r)
                print(phase, i, r, flush=True)
            result[phase] = {
                "runs": runs,
                "called": tally(runs, ("B better", "B worse") if aa else ("B worse",)),
            }
        slowed = asyncio.run(alone(urls[1]))
        assert hog is not None
        hog.kill()
        hog.wait()
        plain = asyncio.run(alone(urls[1]))
        result["apart"] = {"b_alone_p50_hog": slowed, "b_alone_p50": plain, "ratio": slowed / plain}
        print("apart:", result["apart"], flush=True)
    finally:
        if hog is not None and hog.poll() is None:
            hog.kill()
        receiver.close()
        for proc, _ in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
    result["wall_s"] = time.monotonic() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v["called"] for k, v in result.items() if k in ("aa", "b_slower")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
