"""Client CPU per streamed token: this checkout's `kimictl bench` engine against a git revision's,
or (`--loops`) this checkout on asyncio's own event loop against uvloop.

Both run the same in-process load (`run_load`, one worker, no /metrics scrape) against a fresh
lab/bench/paced_emitter.c (built here with cc, one token per HTTP chunk, its own process, so its
CPU is not counted), each in its own fresh Python process, alternating (A B B A ...), so load
that comes and goes on the machine hits both alike. Each run reports the CPU time (user + sys) of
its request phase only, divided by the chunks it received; the table gives each side's median
and the after / before ratio of the medians, with the share of gaps that read zero (two chunks of
one stream in one read: the client read late) and the ITL p50 / p90 over the emitter's log's.
The trees compared with --before both run on --loop (asyncio by default); with --loops, A is
asyncio and B uvloop, the same code in the same process shape.

    python lab/bench/client_cpu_ab.py (--before REV|DIR [--loop asyncio|uvloop] | --loops)
        [--concurrency 64,256] [--interval-ms 1.2] [--tokens 300] [--waves 2] [--pairs 4]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from client_fidelity import ROOT, build, truth

CLIENT = r"""
import asyncio, json, resource, sys, time
from kimictl.runtime.load.loadgen import LoadPoint, LoadSettings, LoadTarget, run_load
from kimictl.runtime.load.workloads import RandomWorkload, parse_length
url, c, tokens, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
factory = None
if sys.argv[5] == "uvloop":
    import uvloop
    factory = uvloop.new_event_loop
ran = []
async def main():
    ran.append(type(asyncio.get_running_loop()).__module__.split(".")[0])
    return await run_load([LoadTarget("e", url, "m")], w, s)
w = RandomWorkload(parse_length(8), parse_length(tokens))
s = LoadSettings(points=(LoadPoint(concurrency=c),), num_prompts=n, workers=1,
                 scrape_metrics=False)
u0 = resource.getrusage(resource.RUSAGE_SELF)
c0, t0 = time.process_time(), time.perf_counter()
with asyncio.Runner(loop_factory=factory) as runner:
    recs = runner.run(main())
cpu, wall = time.process_time() - c0, time.perf_counter() - t0
u1 = resource.getrusage(resource.RUSAGE_SELF)
ok = [r for r in recs if r.ok]
gaps = sorted(g for r in ok for g in r.itls)
print(json.dumps({"loop": ran[0], "cpu_s": cpu, "wall_s": wall,
                  "chunks": sum(len(r.chunk_times) for r in ok),
                  "tokens": sum(r.output_tokens for r in ok), "failed": len(recs) - len(ok),
                  "zero_pct": 100 * sum(g == 0 for g in gaps) / max(len(gaps), 1),
                  "sleeps": u1.ru_nvcsw - u0.ru_nvcsw, "sys_s": u1.ru_stime - u0.ru_stime,
                  "itl_p50": 1e3 * gaps[len(gaps) // 2],
                  "itl_p90": 1e3 * gaps[len(gaps) * 9 // 10]}))
"""


def _checkout(rev: str, dest: Path) -> Path:
    """`rev`'s kimictl package, unpacked under `dest`."""
    tar = dest / "before.tar"
    with tar.open("wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "kimictl"], stdout=f, check=True)
    with tarfile.open(tar) as t:
        t.extractall(dest / "before", filter="data")
    return dest / "before"


def _run(
    exe: Path, side: tuple[Path, str], script: Path, c: int, us: int, tokens: int, n: int
) -> dict:
    path, loop = side
    log = script.parent / "log.txt"
    em = subprocess.Popen([str(exe), "0", str(us), str(us), str(log)], stdout=subprocess.PIPE)
    try:
        assert em.stdout is not None
        url = f"http://127.0.0.1:{int(em.stdout.readline().split()[1])}"
        paths = (str(path), os.environ.get("PYTHONPATH", ""))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
        cmd = [sys.executable, str(script), url, str(c), str(tokens), str(n), loop]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    finally:
        em.send_signal(signal.SIGTERM)
        em.wait(timeout=60)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-800:])
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if r["loop"] != loop:
        raise RuntimeError(f"asked for the {loop} loop, {r['loop']} ran")
    r["us_per_chunk"] = r["cpu_s"] / max(r["chunks"], 1) * 1e6
    t = truth(log)
    r["itl_p50_ratio"] = r["itl_p50"] / t["itl_p50"]
    r["itl_p90_ratio"] = r["itl_p90"] / t["itl_p90"]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    how = ap.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--before", help="git revision to compare against, or a folder holding its kimictl package"
    )
    how.add_argument("--loops", action="store_true", help="asyncio (A) against uvloop (B)")
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                    help="with --before: both trees' loop")  # fmt: skip
    ap.add_argument("--concurrency", default="64,256")
    ap.add_argument("--interval-ms", default="1.2")
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--waves", type=int, default=2, help="requests per stream")
    ap.add_argument("--pairs", type=int, default=4, help="A B pairs per cell (order alternates)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = build(tmp)
        if args.loops:
            sides = {"asyncio": (ROOT, "asyncio"), "uvloop": (ROOT, "uvloop")}
        else:
            given = Path(args.before)
            old = given.resolve() if (given / "kimictl").is_dir() else _checkout(args.before, tmp)
            sides = {"before": (old, args.loop), "after": (ROOT, args.loop)}
        a, b = sides
        print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, load "
              f"{os.getloadavg()[0]:.1f}; A = {a} {sides[a]}, B = {b} {sides[b]}")  # fmt: skip
        print(f"{'cell':>16s} {a + ' us/tok':>14s} {b + ' us/tok':>14s} {'B/A':>6s} "
              f"{'zero gaps % A/B':>16s} {'ITL p50 / truth A/B':>20s} {'p90 A/B':>11s} "
              f"{'failed':>6s}")  # fmt: skip
        script = tmp / "client.py"
        script.write_text(CLIENT)
        for c in (int(x) for x in args.concurrency.split(",")):
            for ms in (float(x) for x in args.interval_ms.split(",")):
                got: dict[str, list[dict]] = {a: [], b: []}
                for i in range(args.pairs):
                    for side in (a, b) if i % 2 == 0 else (b, a):
                        r = _run(exe, sides[side], script, c, round(ms * 1000), args.tokens,
                                 c * args.waves)  # fmt: skip
                        got[side].append(r)
                med = {k: statistics.median(r["us_per_chunk"] for r in v) for k, v in got.items()}
                zero = {k: statistics.median(r["zero_pct"] for r in v) for k, v in got.items()}
                p50 = {k: statistics.median(r["itl_p50_ratio"] for r in v) for k, v in got.items()}
                p90 = {k: statistics.median(r["itl_p90_ratio"] for r in v) for k, v in got.items()}
                failed = sum(r["failed"] for v in got.values() for r in v)
                print(f"{c:5d} x {ms:4.1f} ms {med[a]:14.1f} {med[b]:14.1f} "
                      f"{med[b] / med[a]:6.2f} {zero[a]:7.1f}/{zero[b]:<7.1f} "
                      f"{p50[a]:9.2f}/{p50[b]:<9.2f}  {p90[a]:5.2f}/{p90[b]:<5.2f} {failed:6d}",
                      flush=True)  # fmt: skip
                pairs = zip(got[a], got[b], strict=True)
                per_pair = [y["us_per_chunk"] / x["us_per_chunk"] for x, y in pairs]
                print(f"{'':16s} B/A per pair: " + " ".join(f"{q:.2f}" for q in per_pair))


if __name__ == "__main__":
    main()
