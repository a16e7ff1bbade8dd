"""A/A study of `kimictl bench`'s A/B verdict: how often it calls one side "better" when both sides
are the same server.

Both sides of every trial draw their requests, with replacement, from ONE pool of real requests
(the per-request CSV of a real `kimictl bench --csv` run), so every "better" is a false alarm. Each
trial goes through the product's own path: `summary.summarize` per side, then `ab.compare`. The
rates reported:
- primary: the headline verdict (interactivity p50, tested alone at ALPHA) says faster/slower;
- family: any secondary metric marked "better" after Holm-Bonferroni (family-wise, at ALPHA);
- per-metric rule: any metric whose own 95% interval excludes 1 (the rule the verdict replaces).
Drift between the two turns of a real A/B (a machine's load changing) is outside this study: a
shared pool has none by construction.

    PYTHONPATH=. python lab/bench/ab_false_alarms.py --pool bench.csv --trials 200 --requests 40
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from pathlib import Path

from kimictl.runtime.load.ab import ALPHA, compare
from kimictl.runtime.load.records import RequestRecord
from kimictl.runtime.load.summary import summarize
from kimictl.runtime.verdict.common import wilson


def load_pool(path: Path) -> list[RequestRecord]:
    """The measured, successful requests of a bench CSV as records (chunk times spread evenly
    between first and last chunk: the CSV keeps TTFT, E2E latency and the chunk count)."""
    pool = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["ok"] != "1" or row["warmup"] == "1" or not row["e2el_ms"]:
                continue
            ttft, e2el = float(row["ttft_ms"]) / 1000, float(row["e2el_ms"]) / 1000
            chunks = max(1, int(row["chunks"]))
            step = (e2el - ttft) / (chunks - 1) if chunks > 1 else 0.0
            r = RequestRecord(
                target="pool",
                point=row["point"],
                repeat=0,
                index=int(row["index"]),
                warmup=False,
                session=int(row["session"]),
                turn=int(row["turn"]),
                input_len=int(row["input_len"]),
                output_len=int(row["output_len"]),
            )
            r.ttft, r.latency = ttft, e2el
            r.chunk_times = [ttft + i * step for i in range(chunks)]
            r.output_tokens = int(row["output_tokens"])
            r.chunk_tokens = [1] * chunks
            r.status, r.ok = 200, True
            pool.append(r)
    return pool


def _draw(pool: list[RequestRecord], target: str, n: int, rng: random.Random):
    out = []
    for i, src in enumerate(rng.choices(pool, k=n)):
        r = RequestRecord(**{**src.__dict__, "target": target, "point": "aa", "index": i})
        r.start = float(i)
        out.append(r)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=Path, required=True, help="a `kimictl bench --csv` file")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--requests", type=int, default=40, help="requests per side per trial")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args(argv)
    pool = load_pool(args.pool)
    if len(pool) < 20:
        print(f"error: {args.pool} holds {len(pool)} usable requests; need >= 20", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    primary = family = per_metric = 0
    flagged: dict[str, int] = {}
    t0 = time.monotonic()
    for trial in range(args.trials):
        records = _draw(pool, "a", args.requests, rng) + _draw(pool, "b", args.requests, rng)
        summaries = [
            summarize(
                [r for r in records if r.target == t],
                window=(0.0, float(args.requests)),
                extras={"target": t, "point": "aa", "repeat": 0},
            )
            for t in ("a", "b")
        ]
        rows = compare(summaries, records, a="a", b="b", seed=trial)
        primary += any(r["role"] == "primary" and r["better"] for r in rows)
        family += any(r["role"] == "secondary" and r["better"] for r in rows)
        per_metric += any(r["ci95"] and not r["ci95"][0] <= 1 <= r["ci95"][1] for r in rows)
        for r in rows:
            if r["better"]:
                flagged[r["metric"]] = flagged.get(r["metric"], 0) + 1
    n = args.trials
    result = {
        "pool": str(args.pool),
        "pool_requests": len(pool),
        "trials": n,
        "requests_per_side": args.requests,
        "alpha": ALPHA,
        "seconds": round(time.monotonic() - t0, 1),
        "false_better": {
            name: {"count": k, "rate": k / n, "wilson95": [round(x, 4) for x in wilson(k, n)]}
            for name, k in (
                ("primary", primary),
                ("secondary_family", family),
                ("old_per_metric_rule", per_metric),
            )
        },
        "flagged_by_metric": flagged,
    }
    for name, v in result["false_better"].items():
        lo, hi = v["wilson95"]
        print(f"{name:22s} {v['count']:4d}/{n} = {v['rate']:.3f}  (95% {lo:.3f}-{hi:.3f})")
    print(f"nominal: {ALPHA} per verdict; {result['seconds']} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
