"""A/A through the real edge, judged live: `kimictl serve --ab --canary PCT` (or `--shadow PCT`)
starts the cpu-demo pair (both arms the same stock vLLM CPU path) behind nginx; each arm gets
WARMUP requests alone first (a fresh server's first requests are slower: without it the first run
of a 10% canary reads tuned's warm-up as "tuned worse"); each run starts a
fresh `kimictl monitor --canary PCT --no-tui --json` (a judgement every second), sends `kimictl
bench` through the edge for DURATION seconds, and reads the monitor's last line. A run whose state
was ever "tuned better/worse" is a false alarm (both arms are the same build). Shadow runs also
report pairs by request id and unpaired mirrors. `--slow-tuned S` makes it an A/B: tuned's
processes are SIGSTOPped S of every 0.2 s, the true slowdown is measured apart first (each arm
alone, the client's own TPOT), and a run's first "tuned worse" is its decision.

    PYTHONPATH=. python lab/bench/edge_live.py --canary 50 --runs 20 --duration 40 \
        --json lab/results/edge_aa.json     # under the vLLM lock
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from lab.bench._duty import DutyCycle, pgid_of_port
from lab.bench.ab_false_alarms import wilson


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kimictl(*args: str) -> list[str]:
    return [sys.executable, "-m", "kimictl", *args]


def wait_edge(proc: subprocess.Popen[str], timeout: float) -> dict[str, str]:
    """Read serve's output until the edge and monitor lines; their URLs and arms."""
    deadline = time.monotonic() + timeout
    found: dict[str, str] = {}
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited with {proc.returncode}")
            continue
        print("serve:", line.rstrip(), file=sys.stderr)
        if line.startswith("edge "):
            found["edge"] = line.split(": ", 1)[1].split()[0]
        if line.startswith("monitor: "):
            found["monitor"] = line.split("kimictl monitor ", 1)[1].strip()
            return found
    raise RuntimeError("serve did not become ready")


def bench_argv(target: str, concurrency: int, duration: float, seed: int, *extra: str) -> list[str]:
    """`kimictl bench` with the studies' request mix for `duration` seconds."""
    return kimictl(
        "bench", "--target", target, "--input-len", "32:256", "--output-len", "16:64",
        "--concurrency", str(concurrency), "--duration", str(duration),
        "--num-prompts", "100000", "--seed", str(seed), *extra,
    )  # fmt: skip


def one_run(args: argparse.Namespace, edge: str, monitor: str, traces_port: int, n: int) -> dict:
    record = Path(args.out_dir) / f"run{n}.jsonl"
    mon = subprocess.Popen(
        kimictl(
            "monitor",
            *monitor.split(),
            "--no-tui",
            "--json",
            "--duration",
            str(args.duration + args.tail),
            "--traces-port",
            str(traces_port),
            "--record",
            str(record),
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2)
    bench = subprocess.run(
        bench_argv(f"edge={edge}", args.concurrency, args.duration, n, "--json"),
        capture_output=True,
        text=True,
        check=False,
    )
    mon.wait(timeout=args.duration + 60)
    lines = [json.loads(x) for x in record.read_text().splitlines() if x.strip()]
    judged = [doc["judge"] for doc in lines if doc.get("judge")]
    states = [j["state"] for j in judged]
    last = judged[-1]
    alarm = next((j for j in judged if j["state"] in ("tuned better", "tuned worse")), None)
    return {
        "run": n,
        "bench_rc": bench.returncode,
        "looks": len(judged),
        "states": sorted(set(states)),
        "false_alarm": alarm is not None,
        "alarm_at_s": None if alarm is None else alarm["since"] - last["started_at"],
        "last": {
            k: last.get(k) for k in ("state", "ratio", "ci", "srm", "pairs", "unpaired_mirrors")
        }
        | {"n": {a: v["n"] for a, v in last["arms"].items()}},
    }


def measure_apart(urls: list[str], args: argparse.Namespace) -> dict:
    """The slowed arm's true slowdown, apart from the edge and the monitor: each arm alone in
    alternating blocks (tuned, stock, stock, tuned) at half the edge's concurrency; the client's
    own median TPOT, tuned over stock, per pair of blocks."""
    import csv
    import statistics

    med: dict[str, list[float]] = {"tuned": [], "stock": []}
    half = max(1, args.concurrency // 2)
    for i, arm in enumerate(("tuned", "stock", "stock", "tuned")):
        url = urls[0 if arm == "tuned" else 1].split("=", 1)[1]
        out = Path(args.out_dir) / f"apart{i}.csv"
        subprocess.run(
            bench_argv(url, half, 15, i, "--no-metrics", "--csv", str(out)),
            capture_output=True,
            check=True,
        )
        rows = [r for r in csv.DictReader(out.open()) if r["tpot_ms"] not in ("", "None")]
        med[arm].append(statistics.median(float(r["tpot_ms"]) for r in rows))
    ratios = [t / s for t, s in zip(med["tuned"], med["stock"], strict=True)]
    return {"tpot_ms": med, "tuned_over_stock": [round(x, 3) for x in ratios]}


def summary(args: argparse.Namespace, flag: list[str], runs: list[dict], t0: float) -> dict:
    """The study so far; written to --json."""
    # a decision either way: a false alarm in an A/A study, a detection with --slow-tuned
    k = sum(r["false_alarm"] for r in runs)
    lo, hi = wilson(k, len(runs))
    called = "detections" if args.slow_tuned else "false_alarms"
    result = {
        "mode": flag,
        "runs": len(runs),
        "duration_s": args.duration,
        "concurrency": args.concurrency,
        "slow_tuned_stopped_share": args.slow_tuned,
        "true_slowdown": getattr(args, "truth", None),
        called: k,
        "tuned_worse": sum("tuned worse" in r["states"] for r in runs),
        "decision_s": sorted(r["alarm_at_s"] for r in runs if r["alarm_at_s"] is not None),
        "wilson95": [round(lo, 4), round(hi, 4)],
        "minutes": round((time.time() - t0) / 60, 1),
        "per_run": runs,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--canary", type=float)
    mode.add_argument("--shadow", type=float)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of load a run")
    ap.add_argument("--tail", type=float, default=15.0, help="monitor seconds after the load")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=32, help="requests to each arm first")
    ap.add_argument(
        "--slow-tuned",
        type=float,
        default=0.0,
        help="A/B: SIGSTOP tuned's processes this share of every 0.2 s (0: A/A)",
    )
    ap.add_argument("--out-dir", default="lab/results/edge_live")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: stop the pair too
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    flag = (
        ["--canary", str(args.canary)]
        if args.canary is not None
        else ["--shadow", str(args.shadow)]
    )
    traces_port, port = free_port(), free_port()
    serve = subprocess.Popen(
        kimictl(
            "serve",
            "--ab",
            *flag,
            "--port",
            str(port),
            "--proxy-port",
            str(port + 2),
            "--traces",
            f"http://127.0.0.1:{traces_port}/v1/traces",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=dict(os.environ, COLUMNS="400"),  # serve's lines unwrapped
    )
    runs = []
    stack = contextlib.ExitStack()
    t0 = time.time()
    try:
        urls = wait_edge(serve, 900)
        for target in urls["monitor"].split()[:2]:  # tuned=URL stock=URL: warm each arm alone
            if args.warmup:
                warm = ["--input-len", "32:256", "--output-len", "16:64", "--concurrency", "4"]
                subprocess.run(
                    kimictl("bench", "--target", target, *warm, "--num-prompts", str(args.warmup)),
                    capture_output=True,
                    check=True,
                )
        if args.slow_tuned:
            tuned_port = int(urls["monitor"].split()[0].rsplit(":", 1)[1])
            slow = DutyCycle(pgid_of_port(tuned_port), stopped=args.slow_tuned)
            stack.enter_context(slow)
            args.truth = measure_apart(urls["monitor"].split()[:2], args)
            print("true slowdown:", json.dumps(args.truth), file=sys.stderr)
        for n in range(args.runs):
            runs.append(one_run(args, urls["edge"], urls["monitor"], traces_port, n))
            print(json.dumps(runs[-1]), file=sys.stderr)
            summary(args, flag, runs, t0)  # kept after every run: a cut study keeps its runs
    finally:
        stack.close()
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=120)
    result = summary(args, flag, runs, t0)
    called = "detections" if args.slow_tuned else "false_alarms"
    k, (lo, hi), minutes = result[called], result["wilson95"], result["minutes"]
    print(f"{called.replace('_', ' ')} {k}/{len(runs)} (95% {lo:.3f}-{hi:.3f}), {minutes} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
