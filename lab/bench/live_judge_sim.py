"""The live judge watched continuously: false alarms of `monitor --canary`'s judgement when both
arms are the same server (A/A), against the textbook fixed-n interval read at the same looks, and
how fast it detects a known speed-up.

Each simulated run draws requests, with replacement, from ONE pool of real requests (the
per-request CSV of a real `kimictl bench --csv` run: TPOT, prompt and output tokens), sends each to
tuned with probability PCT% (a canary split), and looks after every STEP requests, as a monitor
does every second. At each look both judgements get the same estimate (the judge's own
stratified difference of mean log interactivity, runtime.verdict.strata) and read it with:
- mSPRT / its confidence sequence (runtime.verdict.sequential.Watch, the product's), and
- the fixed-n z interval (Watch(fixed_n=True)), valid only at one look fixed in advance.
A run is a false alarm when its state is ever "tuned better" or "tuned worse". With --speedup X,
tuned's TPOT is divided by X (a known effect): the rate becomes the detection rate, and the
requests until the decision are reported.

    PYTHONPATH=. python lab/bench/live_judge_sim.py --pool bench.csv --runs 1000 --requests 600
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

from kimictl.runtime.verdict.sequential import BETTER, WORSE, Watch
from kimictl.runtime.verdict.strata import Shaped, stratified_estimate
from lab.bench.ab_false_alarms import wilson


def load_pool(path: Path) -> list[tuple[float, int, int]]:
    """(TPOT s, prompt tokens, output tokens) of the measured, successful requests of a bench CSV
    with a TPOT (2+ output tokens)."""
    out = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["ok"] != "1" or row["warmup"] == "1" or not row["tpot_ms"]:
                continue
            out.append(
                (float(row["tpot_ms"]) / 1000, int(row["prompt_tokens"]), int(row["output_tokens"]))
            )
    return out


def one_run(
    pool: list[tuple[float, int, int]],
    rng: random.Random,
    *,
    requests: int,
    pct: float,
    step: int,
    speedup: float,
    floor: float,
) -> dict[str, int | None]:
    """The request count at which each judgement first said better/worse (None: never)."""
    tuned: list[Shaped] = []
    stock: list[Shaped] = []
    watches = {"msprt": Watch(floor=floor), "fixed_n": Watch(floor=floor, fixed_n=True)}
    first: dict[str, int | None] = dict.fromkeys(watches)
    for i in range(1, requests + 1):
        tpot, prompt, output = rng.choice(pool)
        if rng.random() * 100 < pct:
            tuned.append(Shaped(-math.log(tpot / speedup), prompt, output))
        else:
            stock.append(Shaped(-math.log(tpot), prompt, output))
        if i % step:
            continue
        est, _ = stratified_estimate(tuned, stock)
        for name, w in watches.items():
            if first[name] is None and w.look(est, float(i)) in (BETTER, WORSE):
                first[name] = i
    return first


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=Path, required=True, help="a `kimictl bench --csv` file")
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=600, help="requests per run, both arms")
    ap.add_argument("--pct", type=float, default=50.0, help="canary share, percent")
    ap.add_argument("--step", type=int, default=5, help="requests between looks")
    ap.add_argument("--speedup", type=float, default=1.0, help="tuned TPOT divided by this")
    ap.add_argument("--floor", type=float, default=0.05, help="effect-size floor (0.05 = 5%%)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args(argv)
    pool = load_pool(args.pool)
    if len(pool) < 50:
        print(f"error: {args.pool} holds {len(pool)} usable requests; need >= 50", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    firsts = [
        one_run(
            pool,
            rng,
            requests=args.requests,
            pct=args.pct,
            step=args.step,
            speedup=args.speedup,
            floor=args.floor,
        )
        for _ in range(args.runs)
    ]
    n = args.runs
    result: dict[str, object] = {
        "pool": str(args.pool),
        "pool_requests": len(pool),
        "runs": n,
        "requests_per_run": args.requests,
        "pct": args.pct,
        "looks_per_run": args.requests // args.step,
        "speedup": args.speedup,
        "floor": args.floor,
        "seconds": round(time.monotonic() - t0, 1),
    }
    word = "false alarm" if args.speedup == 1.0 else "detected"
    for name in ("msprt", "fixed_n"):
        hits = [f[name] for f in firsts if f[name] is not None]
        lo, hi = wilson(len(hits), n)
        result[name] = {
            "count": len(hits),
            "rate": len(hits) / n,
            "wilson95": [round(lo, 4), round(hi, 4)],
            "median_requests_to_decide": statistics.median(hits) if hits else None,
        }
        med = f", median at request {statistics.median(hits):.0f}" if hits else ""
        print(
            f"{name:8s} {word}: {len(hits)}/{n} = {len(hits) / n:.3f} (95% {lo:.3f}-{hi:.3f}){med}"
        )
    print(f"{result['seconds']} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
