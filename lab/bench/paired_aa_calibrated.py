"""The paired study's replays judged as an operator runs them: several A/A passes first, then each
replay judged net of them (`bench --paired --aa-report aa1.json --aa-report aa2.json ...`).

Reads one or more `paired_aa_study.py` results (a study run in chunks: their replays in order;
per replay, the per-row log ratios from the spans) and judges
each replay with the product's own functions (runtime.verdict.paired: paired_verdict,
aa_calibration), floor 5%:

- `--passes K` preceding: each replay (A/A: false alarms; B-slower: detections) judged with the
  calibration of the K A/A replays that ran just before it in its own study file (the same two
  servers). What an operator does: K passes, then the A/B.
- `--bracket P,Q`: the same with the P nearest A/A replays before it and the Q nearest after it
  (`bench --paired --judge` with passes made on both sides); a chained study (`--chain`) has
  A/A passes on both sides of every B-slower one.
- leave-one-out: A/A replay i judged with all the other A/A replays (of every file given); each
  B-slower replay with all of them (the most this study's A/A can give).
- uncalibrated: the row bootstrap alone (what one replay without `--aa-report` says).
- scaled_not_the_product: the same judgements with a candidate calibration (`scaled`), kept
  apart from the product's figures.

    PYTHONPATH=. python lab/bench/paired_aa_calibrated.py lab/data/paired_whole_c1.json \
        lab/data/paired_whole_c2.json --passes 5 --bracket 2,2
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from kimictl.runtime.verdict.paired import (
    BETTER,
    DEFAULT_FLOOR,
    WORSE,
    AaCalibration,
    Verdict,
    aa_calibration,
    decide,
    paired_verdict,
    wilson,
)


def verdict(run: dict[str, Any], seed: int, cal: AaCalibration | None = None) -> Verdict:
    logs = [math.nan if x is None else x for x in run["logs"]]
    return paired_verdict(logs, seed=seed, calibration=cal)


def calibration(passes: list[Verdict]) -> AaCalibration:
    return aa_calibration([v.raw_log for v in passes], [v.boot_var for v in passes])


def scaled(v: Verdict, passes: list[Verdict]) -> str:
    """NOT the product's rule (a candidate, `scaled` in the output): the A/A passes' spread taken
    as a multiple (design effect) of their own bootstrap variances rather than an added
    constant, so it grows and shrinks with the judged replay's own noise (rows correlated over
    seconds, more so on a loaded box); t with passes - 1 df."""
    import numpy as np

    means = np.array([p.raw_log for p in passes])
    boots = np.array([p.boot_var for p in passes])
    k, offset = len(passes), float(means.mean())
    phi = float(((means - offset) ** 2 / boots).sum() / (k - 1))
    t = float(np.quantile(np.random.default_rng(k).standard_t(k - 1, 100000), 0.975))
    half = t * math.sqrt(phi * (v.boot_var + float(boots.mean()) / k))
    est = v.raw_log - offset
    return decide(est - half, est, est + half, DEFAULT_FLOOR)


def rate(decisions: list[str], hit: tuple[str, ...]) -> dict[str, Any]:
    k = sum(d in hit for d in decisions)
    lo, hi = wilson(k, len(decisions))
    n = len(decisions)
    return {"hits": k, "n": n, "rate": k / max(1, n), "wilson95": [lo, hi]}


def passes_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A study file's judged replays in the order they ran (`seq`; a file without it ran all its
    A/A passes first), each with its kind ("aa" or "b_slower")."""
    out = []
    for phase in ("aa", "b_slower"):
        out += [r | {"kind": phase} for r in doc.get(phase, {}).get("runs", [])]
    if any("seq" not in r for r in out):
        out = [r | {"seq": i} for i, r in enumerate(out)]
    return sorted((r for r in out if r["decision"] is not None), key=lambda r: r["seq"])


def around(seq: list[dict[str, Any]], at: int, before: int, after: int) -> list[int] | None:
    """The places of the `before` nearest A/A passes ahead of place `at` and the `after` nearest
    behind it (never itself), or None when the file has too few on either side."""
    ahead = [i for i in range(at) if seq[i]["kind"] == "aa"][::-1][:before]
    behind = [i for i in range(at + 1, len(seq)) if seq[i]["kind"] == "aa"][:after]
    return ahead + behind if len(ahead) == before and len(behind) == after else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("study", type=Path, nargs="+")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument(
        "--bracket",
        default="2,2",
        help="BEFORE,AFTER: also judge each replay with the nearest A/A passes on both sides",
    )
    args = ap.parse_args()
    k = args.passes
    before, after = (int(x) for x in args.bracket.split(","))
    files = [passes_of(json.loads(p.read_text())) for p in args.study]
    either, worse = (BETTER, WORSE), (WORSE,)
    seed = 0
    # per file: (pass, its verdict alone), the same seeds whatever is judged with them
    judged = []
    for runs in files:
        judged.append([(r, verdict(r, seed := seed + 1)) for r in runs])
    aa = [v for f in judged for r, v in f if r["kind"] == "aa"]
    slow = [v for f in judged for r, v in f if r["kind"] == "b_slower"]
    out: dict[str, Any] = {"aa_replays": len(aa), "slow_replays": len(slow), "passes": k}
    out["uncalibrated"] = {
        "aa_false": rate([v.decision for v in aa], either),
        "slow_detected": rate([v.decision for v in slow], worse),
    }

    def with_calibration(b: int, a: int, rule: Any) -> dict[str, Any]:
        got: dict[str, list[str]] = {"aa": [], "b_slower": []}
        for f in judged:
            for at, (r, v) in enumerate(f):
                idx = around([x for x, _ in f], at, b, a)
                if idx is not None:
                    got[r["kind"]].append(rule(r, v, [f[i][1] for i in idx], 1000 + at))
        return {"aa_false": rate(got["aa"], either), "slow_detected": rate(got["b_slower"], worse)}

    def product(r: dict[str, Any], v: Verdict, cal: list[Verdict], s: int) -> str:
        return verdict(r, s, calibration(cal)).decision

    def candidate(r: dict[str, Any], v: Verdict, cal: list[Verdict], s: int) -> str:
        return scaled(v, cal)

    # what an operator does: K passes, then the A/B; or passes on both sides of it
    out[f"preceding_{k}"] = with_calibration(k, 0, product)
    out[f"bracket_{before}_{after}"] = with_calibration(before, after, product)
    out["scaled_not_the_product"] = {
        f"preceding_{k}": with_calibration(k, 0, candidate),
        f"bracket_{before}_{after}": with_calibration(before, after, candidate),
    }
    every = calibration(aa)
    aa_runs = [r for f in judged for r, _ in f if r["kind"] == "aa"]
    slow_runs = [r for f in judged for r, _ in f if r["kind"] != "aa"]
    loo = [calibration(aa[:i] + aa[i + 1 :]) for i in range(len(aa))]
    loo_aa = [verdict(r, 2000 + i, loo[i]).decision for i, r in enumerate(aa_runs)]
    loo_slow = [verdict(r, 3000 + i, every).decision for i, r in enumerate(slow_runs)]
    out["leave_one_out"] = {
        "aa_false": rate(loo_aa, either),
        "slow_detected": rate(loo_slow, worse),
        "calibration_all": every.to_json(),
    }
    out["aa_pass_log_sd"] = math.sqrt(every.spread)  # sd of a pass's mean log ratio B/A
    out["aa_raw_ratios"] = sorted(round(math.exp(v.raw_log), 3) for v in aa)
    out["slow_raw_ratios"] = sorted(round(math.exp(v.raw_log), 3) for v in slow)
    docs = [json.loads(p.read_text()) for p in args.study]
    aparts = [(name, a) for d in docs for name, a in d.items() if name.startswith("apart")]
    if aparts:
        out["apart"] = [
            {"stop": name} | {key: v for key, v in a.items() if key != "per_row"}
            for name, a in aparts
        ]
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
