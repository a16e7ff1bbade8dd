"""A/A study of `kimictl bench`'s A/B on REAL servers: how often it calls one of two identical
vLLM CPU servers "better" than the other.

Starts two identical servers with `kimictl serve cpu-demo --detach` (same profile, same flags, own
ports, a private state dir), then runs the bench's own library call (`run_bench`, what
`kimictl bench --target a=URL --target b=URL` runs) `--runs` times against the pair, each run with
its own seed (fresh requests, the same for both sides). The pair is reused across runs: the study
measures the verdict's error rate given one pair of instances, plus anything that differs between
an A/B's turns (order, warm-up, the machine's drift). With `--schedules abba,turns` every run does
both schedules, in rotating order, so they see the same machine.

Counted per schedule and rule (the product's: whole turns shuffled; "per_request": the rule
before, every request its own unit, recomputed on the same records): the primary verdict
(interactivity p50, alone at ALPHA) says faster/slower; any secondary metric marked "better"
(Holm family at ALPHA); each metric's marks. A Wilson 95% interval on each rate, and the
one-sided binomial p of seeing that many if the true rate were the nominal ALPHA. Order bias
shows more sensitively in the mean log ratio A/B of the primary metric over runs (its 95%
t-interval): with "turns", A always runs first.

    PYTHONPATH=. python lab/bench/ab_aa_study.py --runs 20 --requests 16 --concurrency 2 \
        --schedules abba,turns,interleave --out lab/results/ab_aa_study.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kimictl.runtime.load.ab import ALPHA, HEADLINE, compare
from kimictl.runtime.load.bench import BenchConfig, run_bench
from kimictl.runtime.load.records import LoadPoint, LoadTarget
from kimictl.runtime.load.workloads import RandomWorkload, parse_length
from kimictl.runtime.verdict.common import wilson

# two-sided 95% t quantiles by degrees of freedom (for the mean log ratio over runs)
_T975 = {
    5: 2.571, 10: 2.228, 15: 2.131, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021,
}  # fmt: skip


# the product's rule (whole turns shuffled, ab._turns) and the one before it (each request)
RULES = ("product", "per_request")


def t975(df: int) -> float:
    known = [d for d in sorted(_T975) if d <= df]
    return _T975[known[-1]] if known else 12.706


def binom_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how surprising k alarms are at the nominal rate."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def kimictl(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kimictl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_pair(env: dict[str, str], ports: tuple[int, int]) -> list[str]:
    urls = []
    for port in ports:
        t0 = time.monotonic()
        done = kimictl(["serve", "cpu-demo", "--port", str(port), "--detach"], env, 1200)
        if done.returncode != 0:
            raise SystemExit(f"serve on port {port} failed: {done.stderr[-2000:]}")
        urls.append(f"http://127.0.0.1:{port}")
        print(f"server {port} ready after {time.monotonic() - t0:.0f} s", flush=True)
    return urls


async def one_run(urls: list[str], args: argparse.Namespace, seed: int, schedule: str) -> Any:
    lo, hi = args.input_len
    cfg = BenchConfig(
        targets=(LoadTarget("a", urls[0], "tiny-k2"), LoadTarget("b", urls[1], "tiny-k2")),
        workload=RandomWorkload(parse_length(f"{lo}:{hi}"), parse_length(str(args.output_len))),
        points=(LoadPoint(concurrency=args.concurrency),),
        num_prompts=args.requests,
        warmup=args.warmup,
        seed=seed,
        schedule=schedule,
    )
    return await run_bench(cfg)


def verdicts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    head = next(r for r in rows if r["metric"] == HEADLINE)
    return {
        "verdict": head["verdict"],
        "ratio": head["ratio"],
        "ci95": head["ci95"],
        "p": head["p"],
        "tested": [r["metric"] for r in rows if r["p"] is not None],
        "marked": [r["metric"] for r in rows if r["better"]],
        "secondary_marked": [r["metric"] for r in rows if r["better"] and r["role"] == "secondary"],
    }


def request_level(outcome: Any, seed: int) -> dict[str, Any]:
    """The verdict of the rule before turns were the test's unit: every request its own."""
    records = [dataclasses.replace(r, part=0) for r in outcome.records]
    return verdicts(compare(outcome.summaries, records, a="a", b="b", seed=seed))


def tally(runs: list[dict[str, Any]], schedule: str, rule: str) -> dict[str, Any]:
    mine = [r[rule] for r in runs if r["schedule"] == schedule]
    n = len(mine)
    primary = sum(r["verdict"] in ("faster", "slower") for r in mine)
    family = sum(bool(r["secondary_marked"]) for r in mine)
    per_metric: dict[str, int] = {}
    tested: dict[str, int] = {}
    for r in mine:
        for m in r["tested"]:
            tested[m] = tested.get(m, 0) + 1
        for m in r["marked"]:
            per_metric[m] = per_metric.get(m, 0) + 1
    logs = [math.log(r["ratio"]) for r in mine if r["ratio"]]
    mean_log = statistics.fmean(logs) if logs else None
    half = (
        t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        if len(logs) > 2
        else None
    )

    def rate(k: int, n: int) -> dict[str, Any]:
        lo, hi = wilson(k, n)
        return {"k": k, "n": n, "rate": k / n if n else None, "wilson95": [lo, hi],
                "p_if_nominal": binom_tail(k, n, ALPHA)}  # fmt: skip

    return {
        "schedule": schedule,
        "rule": rule,
        "runs": n,
        "primary_false": rate(primary, n),
        "any_secondary_false": rate(family, n),
        "per_metric_false": {m: rate(per_metric.get(m, 0), k) for m, k in sorted(tested.items())},
        "primary_ratio_geomean": math.exp(mean_log) if mean_log is not None else None,
        "primary_ratio_ci95": None
        if mean_log is None or half is None
        else [math.exp(mean_log - half), math.exp(mean_log + half)],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--requests", type=int, default=16, help="per side and run")
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--input-len", type=lambda s: tuple(map(int, s.split(":"))), default=(16, 64))
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--schedules", default="abba", help="comma list: abba, turns, interleave")
    ap.add_argument("--port", type=int, default=18841, help="A's port; B gets PORT+2")
    ap.add_argument("--urls", default=None, help="A,B of a running pair instead of starting one")
    ap.add_argument("--out", type=Path, default=Path("lab/results/ab_aa_study.json"))
    args = ap.parse_args()
    schedules = args.schedules.split(",")

    state = tempfile.mkdtemp(prefix="kimictl-aa-")
    env = {**os.environ, "KIMICTL_STATE_DIR": state}
    started = args.urls is None
    t0 = time.monotonic()
    urls = args.urls.split(",") if args.urls else start_pair(env, (args.port, args.port + 2))
    runs: list[dict[str, Any]] = []
    try:
        for i in range(args.runs):
            order = schedules[i % len(schedules) :] + schedules[: i % len(schedules)]
            for schedule in order:
                t_run = time.monotonic()
                outcome = asyncio.run(one_run(urls, args, seed=1000 + i, schedule=schedule))
                if outcome.stop_reason:
                    raise SystemExit(f"run {i} ({schedule}) stopped: {outcome.stop_reason}")
                runs.append(
                    {
                        "run": i,
                        "schedule": schedule,
                        "seed": 1000 + i,
                        "product": verdicts(outcome.ab or []),
                        "per_request": request_level(outcome, 1000 + i),
                        "turns": len(outcome.records.schedule),
                        "completed": [s["completed"] for s in outcome.summaries],
                        "warnings": outcome.warnings,
                        "seconds": time.monotonic() - t_run,
                    }
                )
                last = runs[-1]
                for rule in RULES:
                    v = last[rule]
                    print(
                        f"run {i:2d} {schedule:10s} {rule:11s} {v['verdict']:26s} ratio "
                        f"{v['ratio'] or 0:.3f} p={v['p']} marked={v['marked']} "
                        f"({last['seconds']:.0f} s)",
                        flush=True,
                    )
    finally:
        if started:
            kimictl(["stop", "--all"], env, 120)
    result = {
        "alpha": ALPHA,
        "pair": "two `kimictl serve cpu-demo` servers, started once, reused by every run",
        "urls": urls,
        "requests_per_side": args.requests,
        "output_len": args.output_len,
        "input_len": list(args.input_len),
        "concurrency": args.concurrency,
        "warmup": args.warmup,
        "minutes": (time.monotonic() - t0) / 60,
        "summary": [tally(runs, s, rule) for s in schedules for rule in RULES],
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for s in result["summary"]:
        p, f = s["primary_false"], s["any_secondary_false"]
        ci = s["primary_ratio_ci95"]
        print(
            f"{s['schedule']} / {s['rule']}: primary false {p['k']}/{p['n']} "
            f"(Wilson 95% {p['wilson95'][0]:.1%}-{p['wilson95'][1]:.1%}, P(>=k | {ALPHA:.0%}) "
            f"{p['p_if_nominal']:.3f}); any secondary {f['k']}/{f['n']}; primary A/B geomean "
            f"{s['primary_ratio_geomean']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
        )
        for m, r in s["per_metric_false"].items():
            if r["k"]:
                print(f"    {m}: {r['k']}/{r['n']}")
    print(f"wrote {args.out} ({result['minutes']:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
