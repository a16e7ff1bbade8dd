"""The paired study's replays judged as an operator runs them: several A/A passes first, then each
replay judged net of them (`bench --paired --aa-report aa1.json --aa-report aa2.json ...`).

Reads one or more `paired_aa_study.py` results (a study run in chunks: their replays in order;
per replay, the per-row log ratios from the spans) and judges
each replay with the product's own functions (runtime.verdict.paired: paired_verdict,
aa_calibration), floor 5%:

- `--passes K` preceding: A/A replay i (i >= K) judged with the calibration of A/A replays
  i-K..i-1 (false alarms); each B-slower replay with the calibration of the last K A/A replays
  (detections), both within its own study file (the same two servers). What an operator does:
  K passes, then the A/B.
- leave-one-out: A/A replay i judged with all the other A/A replays (of every file given); each
  B-slower replay with all of them (the most this study's A/A can give).
- uncalibrated: the row bootstrap alone (what one replay without `--aa-report` says).
- scaled_not_the_product: the same judgements with a candidate calibration (`scaled`), kept
  apart from the product's figures.

    PYTHONPATH=. python lab/bench/paired_aa_calibrated.py lab/data/paired_whole_c1.json \
        lab/data/paired_whole_c2.json --passes 5
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("study", type=Path, nargs="+")
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    docs = [json.loads(p.read_text()) for p in args.study]
    k = args.passes

    def judged(doc: dict[str, Any], phase: str) -> list[dict[str, Any]]:
        return [r for r in doc.get(phase, {}).get("runs", []) if r["decision"] is not None]

    aa_runs = [r for d in docs for r in judged(d, "aa")]
    slow_runs = [r for d in docs for r in judged(d, "b_slower")]
    aa = [verdict(r, i) for i, r in enumerate(aa_runs)]
    slow = [verdict(r, 100 + i) for i, r in enumerate(slow_runs)]
    either, worse = (BETTER, WORSE), (WORSE,)
    out: dict[str, Any] = {"aa_replays": len(aa), "slow_replays": len(slow), "passes": k}
    out["uncalibrated"] = {
        "aa_false": rate([v.decision for v in aa], either),
        "slow_detected": rate([v.decision for v in slow], worse),
    }
    # preceding passes: within each study file (the same two servers, as an operator's session)
    pre_aa: list[str] = []
    pre_slow: list[Verdict] = []
    alt_aa: list[str] = []
    alt_slow: list[str] = []
    lasts = []
    i0 = j0 = 0
    for d in docs:
        n_aa, d_slow = len(judged(d, "aa")), judged(d, "b_slower")
        own = aa[i0 : i0 + n_aa]
        pre_aa += [
            verdict(aa_runs[i0 + i], i0 + i, calibration(own[i - k : i])).decision
            for i in range(k, n_aa)
        ]
        alt_aa += [scaled(own[i], own[i - k : i]) for i in range(k, n_aa)]
        if d_slow and n_aa >= k:
            last = calibration(own[-k:])
            lasts.append(last.to_json())
            pre_slow += [verdict(r, 100 + j0 + j, last) for j, r in enumerate(d_slow)]
            alt_slow += [scaled(v, own[-k:]) for v in slow[j0 : j0 + len(d_slow)]]
        i0, j0 = i0 + n_aa, j0 + len(d_slow)
    out[f"preceding_{k}"] = {
        "aa_false": rate(pre_aa, either),
        "slow_detected": rate([v.decision for v in pre_slow], worse),
        "slow_ratio_net": sorted(round(v.ratio, 3) for v in pre_slow),
        "calibration_of_last": lasts,
    }
    loo_aa = [
        verdict(r, i, calibration(aa[:i] + aa[i + 1 :])).decision for i, r in enumerate(aa_runs)
    ]
    every = calibration(aa)
    loo_slow = [verdict(r, 100 + i, every) for i, r in enumerate(slow_runs)]
    out["leave_one_out"] = {
        "aa_false": rate(loo_aa, either),
        "slow_detected": rate([v.decision for v in loo_slow], worse),
        "calibration_all": every.to_json(),
    }
    out["scaled_not_the_product"] = {
        f"preceding_{k}": {
            "aa_false": rate(alt_aa, either),
            "slow_detected": rate(alt_slow, worse),
        },
        "leave_one_out": {
            "aa_false": rate([scaled(v, aa[:i] + aa[i + 1 :]) for i, v in enumerate(aa)], either),
            "slow_detected": rate([scaled(v, aa) for v in slow], worse),
        },
    }
    out["aa_pass_log_sd"] = math.sqrt(every.spread)  # sd of a pass's mean log ratio B/A
    out["aa_raw_ratios"] = sorted(round(math.exp(v.raw_log), 3) for v in aa)
    out["slow_raw_ratios"] = sorted(round(math.exp(v.raw_log), 3) for v in slow)
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
