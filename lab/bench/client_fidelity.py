"""Does the bench client tell the truth at fast-path rates? Client figures / the emitter's log.

The truth is lab/bench/paced_emitter.c (built here with cc): one thread, one absolute timer, one
token per HTTP chunk, vLLM-shaped SSE, and a log of the time it wrote every token. Each cell of a
matrix, concurrency x token interval x client, runs one client against a fresh emitter and divides
the client's ITL p50 / p90, TPOT p50 and output tok/s by the same figures from the log (ITL: the
gaps between one request's writes; TPOT: (last - first write) / (tokens - 1); tok/s: tokens over
the first to the last write). The clients, side by side in one run: `kimictl bench --workers W`
for each W, and `vllm bench serve` from kimictl's CPU vLLM runtime (skipped without it). `--hog`
adds cells with two busy processes at nice 0 beside the client (the issue's loaded client): there
kimictl must either read true or say "client lagged".

    python lab/bench/client_fidelity.py [--concurrency 64,256] [--interval-ms 1.2,2]
        [--workers 1,2] [--tokens 300] [--waves 3] [--hog] [--no-vllm] [--json OUT]
        [--before DIR] [--loop auto|uvloop|asyncio]

Needs only the standard library, a C compiler and kimictl (run from the checkout); prints one
table, and with --json writes every cell (the device machine's scaling run reads that file).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TOKENIZER = Path.home() / ".cache/kimictl/models/tiny-k2-seed0"
VLLM = Path.home() / ".cache/kimictl/cpu-runtime/venv/bin/vllm"


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def build(tmp: Path) -> Path:
    exe = tmp / "paced_emitter"
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-o", str(exe), str(HERE / "paced_emitter.c")], check=True)
    return exe


def truth(log: Path) -> dict[str, float]:
    """ITL p50/p90, TPOT p50, tok/s and the emitter's own lateness, from its write log."""
    reqs: dict[int, list[tuple[int, int]]] = {}
    for line in log.read_text().splitlines():
        req, tok, due, wrote = (int(x) for x in line.split())
        reqs.setdefault(req, []).append((due, wrote))
    # a client's lone test request before the run (vllm bench sends one) is not the run
    order = sorted(reqs.values(), key=lambda toks: toks[0][1])
    while len(order) > 1 and order[0][-1][1] < order[1][0][1]:
        order.pop(0)
    gaps, tpots, late = [], [], []
    first, last, tokens = float("inf"), 0.0, 0
    for toks in order:
        w = [b for _, b in toks]
        late += [(b - a) / 1e6 for a, b in toks]
        gaps += [(w[i] - w[i - 1]) / 1e6 for i in range(1, len(w))]
        if len(w) > 1:
            tpots.append((w[-1] - w[0]) / 1e6 / (len(w) - 1))
        first, last, tokens = min(first, w[0]), max(last, w[-1]), tokens + len(w)
    return {
        "itl_p50": _pct(gaps, 50),
        "itl_p90": _pct(gaps, 90),
        "tpot_p50": _pct(tpots, 50),
        "tok_s": tokens / ((last - first) / 1e9),
        "emitter_late_ms_p99": _pct(late, 99),
        "requests": len(order),
    }


def kimictl_client(
    url: str,
    c: int,
    tokens: int,
    n: int,
    workers: int,
    out: Path,
    root: Path = ROOT,
    loop: str | None = None,
) -> dict:
    cmd = [
        sys.executable, "-m", "kimictl", "bench", "--target", url, "--model", "m",
        "--input-len", "8", "--output-len", str(tokens), "--concurrency", str(c),
        "--num-prompts", str(n), "--workers", str(workers), "--no-metrics", "-o", str(out),
    ]  # fmt: skip
    if loop is not None:
        cmd += ["--loop", loop]
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path)
    # `-m` puts the working folder first on sys.path: run in `root`, or its kimictl is not the one
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, check=False, timeout=600, cwd=root
    )
    if not out.exists():
        raise RuntimeError(f"kimictl bench failed: {proc.stderr[-1500:]}")
    run = json.loads(out.read_text())["runs"][0]
    k = run["kimictl"]
    return {
        "itl_p50": run["median_itl_ms"],
        "itl_p90": run["p90_itl_ms"],
        "tpot_p50": run["median_tpot_ms"],
        "tok_s": run["output_throughput"],
        "verdict": k["client_verdict"],
        "lag_p99": k["client_lag_ms_p99"],
        "cpu_us_tok": k["client_cpu_us_per_token"],
        "zero_gaps_pct": k["client_batched_gaps_pct"],
        "loop": k.get("client_loop"),
    }


def vllm_client(url: str, c: int, tokens: int, n: int, out: Path) -> dict:
    cmd = [
        str(VLLM), "bench", "serve", "--backend", "openai", "--base-url", url, "--model", "m",
        "--tokenizer", str(TOKENIZER), "--dataset-name", "random", "--random-input-len", "8",
        "--random-output-len", str(tokens), "--num-prompts", str(n), "--max-concurrency", str(c),
        "--ignore-eos", "--disable-tqdm", "--save-result", "--result-dir", str(out.parent),
        "--result-filename", out.name, "--percentile-metrics", "ttft,tpot,itl",
        "--metric-percentiles", "50,90",
    ]  # fmt: skip
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=900)
    if not out.exists():
        raise RuntimeError(f"vllm bench serve failed: {proc.stderr[-1500:]}")
    run = json.loads(out.read_text())
    return {
        "itl_p50": run["median_itl_ms"],
        "itl_p90": run["p90_itl_ms"],
        "tpot_p50": run["median_tpot_ms"],
        "tok_s": run["output_throughput"],
        "verdict": "-",
    }


def cell(
    exe: Path, tmp: Path, args: argparse.Namespace, c: int, ms: float, client: str, *, hog: bool
) -> dict:
    log = tmp / f"log-{time.monotonic_ns()}.txt"
    us = str(round(ms * 1000))
    em = subprocess.Popen([str(exe), "0", us, us, str(log)], stdout=subprocess.PIPE, text=True)
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        assert em.stdout is not None
        url = f"http://127.0.0.1:{int(em.stdout.readline().split()[1])}"
        if hog:
            spin = "while True: pass"
            hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
        n = c * args.waves
        load = os.getloadavg()[0]
        out = tmp / f"r-{time.monotonic_ns()}.json"
        if client == "vllm bench":
            got = vllm_client(url, c, args.tokens, n, out)
        else:
            root = args.before if client.startswith("before") else ROOT
            w = int(client.split("=")[1])
            loop = None if client.startswith("before") else args.loop
            got = kimictl_client(url, c, args.tokens, n, w, out, root, loop)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        em.send_signal(signal.SIGTERM)
        em.wait(timeout=60)
    t = truth(log)
    ratio = {k: got[k] / t[k] for k in ("itl_p50", "itl_p90", "tpot_p50", "tok_s") if got[k]}
    return {
        "concurrency": c, "interval_ms": ms, "client": client, "hog": hog, "load": load,
        "client_figures": got, "truth": t, "ratio": ratio,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="64,256")
    ap.add_argument("--interval-ms", default="1.2,2")
    ap.add_argument("--workers", default="1,2", help="kimictl --workers values, one cell each")
    ap.add_argument("--tokens", type=int, default=300, help="tokens per request")
    ap.add_argument("--waves", type=int, default=3, help="requests per stream")
    ap.add_argument("--hog", action="store_true", help="also 64 x 1.2 ms beside two busy processes")
    ap.add_argument("--no-vllm", action="store_true", help="kimictl only")
    ap.add_argument("--json", type=Path, help="write every cell here")
    ap.add_argument("--loop", choices=("auto", "uvloop", "asyncio"),
                    help="this checkout's `kimictl bench --loop` (default: bench's)")  # fmt: skip
    ap.add_argument(
        "--before",
        type=Path,
        help="another kimictl (a folder holding its kimictl package, e.g. `git archive REV "
        "kimictl | tar -x -C DIR`): its cells run beside this checkout's, as 'before w=N'",
    )
    args = ap.parse_args()
    if args.before is not None:
        args.before = args.before.resolve()
    sides = ("kimictl", "before") if args.before is not None else ("kimictl",)
    clients = [  # the two sides alternate which runs first
        f"{side} w={w}"
        for i, w in enumerate(args.workers.split(","))
        for side in (sides if i % 2 == 0 else sides[::-1])
    ]
    if not args.no_vllm and VLLM.exists() and TOKENIZER.exists():
        clients.append("vllm bench")
    cells: list[dict] = []
    print(f"machine: {os.cpu_count()} cores; {args.tokens} tokens/request, {args.waves} waves")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = build(tmp)
        plan = [
            (int(c), float(ms), cl, False)
            for c in args.concurrency.split(",")
            for ms in args.interval_ms.split(",")
            for cl in clients
        ]
        if args.hog:
            plan += [(64, 1.2, cl, True) for cl in clients]
        for c, ms, cl, hog in plan:
            try:
                r = cell(exe, tmp, args, c, ms, cl, hog=hog)
            except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                print(f"{c} x {ms} ms {cl}{' +hog' if hog else ''}: failed: {exc}")
                continue
            cells.append(r)
            _row(r)
    if args.json:
        args.json.write_text(json.dumps(cells, indent=1))
    if cells:
        load = statistics.median(r["load"] for r in cells)
        print(f"\nmedian load average over the cells: {load:.1f}")


def _row(r: dict) -> None:
    g, t, q = r["client_figures"], r["truth"], r["ratio"]
    lag = f"{g['lag_p99']:.2f}" if g.get("lag_p99") is not None else "-"
    cpu = f"{g['cpu_us_tok']:.1f}" if g.get("cpu_us_tok") else "-"
    print(
        f"{r['concurrency']:4d} x {r['interval_ms']:4.1f} ms {r['client']:11s}"
        f"{' +hog' if r['hog'] else '     '} | ITL p50 {q.get('itl_p50', 0):5.2f} p90 "
        f"{q.get('itl_p90', 0):5.2f} TPOT {q.get('tpot_p50', 0):5.3f} "
        f"tok/s {q.get('tok_s', 0):5.3f}"
        f" | truth {t['tok_s']:7.0f} tok/s, emitter late p99 {t['emitter_late_ms_p99']:5.2f} ms"
        f" | {g['verdict']}, lag p99 {lag} ms, {cpu} us/tok, load {r['load']:.1f}"
        f"{', ' + g['loop'] if g.get('loop') else ''}",
        flush=True,
    )


if __name__ == "__main__":
    main()
