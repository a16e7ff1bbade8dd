"""Does a shadow hurt the primary? `kimictl serve --ab --shadow 100` starts the pair; this script
puts three nginx edges of the same rendered config in front of the same stock server: `off` (the
`mirror` lines removed), `keepalive` (mirror on, client keep-alive as nginx's default: the config
before `keepalive_timeout 0`), `on` (the config `serve` renders now). The tuned server (the shadow)
is made slow (its process group SIGSTOPped for `--slow` of every 0.2 s) or dead (stopped
throughout); in each state, rounds of one block per edge (rotating order) run `kimictl bench` at
fixed concurrency through that edge; the primary's TTFT/TPOT come from the client's own timings
(bench's per-request CSV). A round's figure is the ratio of the block's median to the `off` block's.

    PYTHONPATH=. python lab/bench/shadow_harm.py --rounds 4 --block 20 \
        --json /tmp/shadow_harm.json                     # under the vLLM lock
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from kimictl.runtime.serving.proxy import nginx_binary, plan_edge, render_nginx
from lab.bench._duty import DutyCycle, pgid_of_port
from lab.bench.edge_live import bench_argv, free_port, kimictl, wait_edge

VARIANTS = ("off", "keepalive", "on")


def variant_config(name: str, tuned: str, stock: str, run_dir: Path) -> tuple[str, int]:
    """The rendered shadow config, changed for `name`; and its port."""
    port = free_port()
    plan = plan_edge(canary=None, shadow=100, host="127.0.0.1", port=port, tuned=tuned, stock=stock)
    conf = render_nginx(plan, run_dir)
    if name == "off":
        conf = conf.replace("mirror /_kimictl_mirror;", "").replace("mirror_request_body on;", "")
    elif name == "keepalive":
        conf = conf.replace("keepalive_timeout 0;", "")
    return conf, port


def start_nginx(name: str, tuned: str, stock: str, root: Path) -> tuple[subprocess.Popen, str]:
    run_dir = root / name
    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (run_dir / "tmp" / kind).mkdir(parents=True, exist_ok=True)
    conf, port = variant_config(name, tuned, stock, run_dir)
    (run_dir / "nginx.conf").write_text(conf)
    proc = subprocess.Popen(
        [nginx_binary(), "-p", str(run_dir), "-c", str(run_dir / "nginx.conf")],
        start_new_session=True,
    )
    time.sleep(0.5)
    return proc, f"http://127.0.0.1:{port}"


def block(edge: str, args: argparse.Namespace, out: Path, seed: int) -> dict:
    subprocess.run(
        bench_argv(
            f"edge={edge}",
            args.concurrency,
            args.block,
            seed,
            "--timeout",
            str(args.timeout),
            "--no-metrics",
            "--csv",
            str(out),
            "--json",
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    if not out.exists():  # bench failed whole (its stderr is not kept)
        return {"requests": 0, "ok": 0, "failed": 0, "ttft_ms": None, "tpot_ms": None,
                "e2el_ms": None, "ttft_p90_ms": None}  # fmt: skip
    rows = [r for r in csv.DictReader(out.open()) if r["warmup"] in ("False", "0", "false", "")]
    ok = [r for r in rows if r["ok"] in ("True", "1", "true")]

    def med(key: str) -> float | None:
        vals = [float(r[key]) for r in ok if r[key] not in ("", "None", "nan")]
        return statistics.median(vals) if vals else None

    return {
        "requests": len(rows),
        "ok": len(ok),
        "failed": len(rows) - len(ok),
        "ttft_ms": med("ttft_ms"),
        "tpot_ms": med("tpot_ms"),
        "e2el_ms": med("e2el_ms"),
        "ttft_p90_ms": (
            statistics.quantiles([float(r["ttft_ms"]) for r in ok], n=10)[-1]
            if len(ok) > 10
            else None
        ),
    }


def summarise(blocks: list[dict]) -> dict:
    """Per state and variant: median over rounds of block/off ratios, and the raw medians."""
    out: dict = {}
    for state in sorted({b["state"] for b in blocks}):
        rounds = sorted({b["round"] for b in blocks if b["state"] == state})
        by = {(b["round"], b["variant"]): b for b in blocks if b["state"] == state}
        out[state] = {}
        for v in VARIANTS:
            cell: dict = {}
            for key in ("ttft_ms", "tpot_ms", "e2el_ms", "ttft_p90_ms"):
                ratios = [
                    by[r, v][key] / by[r, "off"][key]
                    for r in rounds
                    if (r, v) in by and by[r, v][key] and by[r, "off"][key]
                ]
                cell[key + "_ratio"] = [round(x, 3) for x in ratios]
                cell[key + "_ratio_median"] = (
                    round(statistics.median(ratios), 3) if ratios else None
                )
            cell["ok"] = sum(by[r, v]["ok"] for r in rounds if (r, v) in by)
            cell["failed"] = sum(by[r, v]["failed"] for r in rounds if (r, v) in by)
            out[state][v] = cell
    return out


@contextlib.contextmanager
def vllm_pair(args: argparse.Namespace) -> Iterator[tuple[str, str, int]]:
    """`serve --ab --shadow 100` (the cpu-demo pair), both warmed: (tuned, stock, tuned's
    process group)."""
    port = free_port()
    serve = subprocess.Popen(
        kimictl("serve", "--ab", "--shadow", "100", "--port", str(port), "--proxy-port",
                str(port + 2)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=dict(os.environ, COLUMNS="400"),
    )  # fmt: skip
    try:
        urls = wait_edge(serve, 900)
        tuned, stock = (t.split("=", 1)[1] for t in urls["monitor"].split()[:2])
        for url in (stock, tuned):  # each warmed alone: a cold server's first requests burn CPU
            warm = bench_argv(url, 4, 10, 0, "--no-metrics")
            subprocess.run(warm, capture_output=True, check=True)
        yield tuned, stock, pgid_of_port(int(tuned.rsplit(":", 1)[1]))
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=120)


@contextlib.contextmanager
def emitter_pair(args: argparse.Namespace) -> Iterator[tuple[str, str, int]]:
    """Two lab SSE emitters (TTFT 50 ms, TPOT 20 ms, one token a chunk) as a simulated pair."""
    procs = [
        subprocess.Popen(
            [sys.executable, "lab/bench/_sse_emitter.py", "--ttft-ms", "50", "--tpot-ms", "20"],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for _ in range(2)
    ]
    try:
        urls = [f"http://127.0.0.1:{int(p.stdout.readline().split()[1])}" for p in procs]  # type: ignore[union-attr]
        yield urls[0], urls[1], procs[0].pid
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--block", type=float, default=20.0, help="seconds of load a block")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=45.0, help="bench's per-request limit")
    ap.add_argument("--slow", type=float, default=0.8, help="share of time the shadow stops")
    ap.add_argument("--states", default="slow,dead")
    ap.add_argument(
        "--emitters", action="store_true", help="simulated servers: lab SSE emitters, no vLLM"
    )
    ap.add_argument("--out-dir", type=Path, default=Path("/tmp/shadow_harm"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    blocks: list[dict] = []
    t0 = time.time()
    pair = emitter_pair if args.emitters else vllm_pair
    try:
        with pair(args) as (tuned, stock, pgid):
            edges: dict[str, str] = {}
            for v in VARIANTS:
                proc, edges[v] = start_nginx(v, tuned, stock, args.out_dir)
                procs.append(proc)
            for state in args.states.split(","):
                stopped = 1.0 if state == "dead" else args.slow
                with DutyCycle(pgid, stopped=stopped):
                    for r in range(args.rounds):
                        for v in VARIANTS[r % 3 :] + VARIANTS[: r % 3]:  # rotating order
                            out = args.out_dir / f"{state}-{r}-{v}.csv"
                            b = block(edges[v], args, out, 1000 * r + len(blocks))
                            blocks.append({"state": state, "round": r, "variant": v} | b)
                            print(json.dumps(blocks[-1]), file=sys.stderr)
                time.sleep(3)  # the shadow drains what it was sent while stopped
                result = {
                    "servers": "lab SSE emitters (simulated)" if args.emitters else "vLLM CPU",
                    "rounds": args.rounds,
                    "block_s": args.block,
                    "concurrency": args.concurrency,
                    "slow_stopped_share": args.slow,
                    "minutes": round((time.time() - t0) / 60, 1),
                    "summary": summarise(blocks),
                    "blocks": blocks,
                }
                if args.json:
                    args.json.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)  # SIGQUIT would wait for hung mirrors
            proc.wait(timeout=5)
    print(json.dumps(summarise(blocks), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
