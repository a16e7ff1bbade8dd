"""The paired study's replays judged as an operator runs them: several A/A passes first, then each
replay judged net of them (`bench --paired --aa-report aa1.json --aa-report aa2.json ...`).

Reads a `paired_aa_study.py` result (per replay, the per-row log ratios from the spans) and judges
each replay with the product's own functions (runtime.verdict.paired: paired_verdict,
aa_calibration), floor 5%:

- `--passes K` preceding: A/A replay i (i >= K) judged with the calibration of A/A replays
  i-K..i-1 (false alarms); each B-slower replay with the calibration of the last K A/A replays
  (detections). What an operator does: K passes, then the A/B.
- leave-one-out: A/A replay i judged with all the other A/A replays; each B-slower replay with all
  of them (the most this study's A/A can give).
- uncalibrated: the row bootstrap alone (what one replay without `--aa-report` says).

    PYTHONPATH=. python lab/bench/paired_aa_calibrated.py lab/data/paired_study.json --passes 5
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from kimictl.runtime.verdict.paired import (
    BETTER,
    WORSE,
    AaCalibration,
    Verdict,
    aa_calibration,
    paired_verdict,
    wilson,
)


def verdict(run: dict[str, Any], seed: int, cal: AaCalibration | None = None) -> Verdict:
    logs = [math.nan if x is None else x for x in run["logs"]]
    return paired_verdict(logs, seed=seed, calibration=cal)


def calibration(passes: list[Verdict]) -> AaCalibration:
    return aa_calibration([v.raw_log for v in passes], [v.boot_var for v in passes])


def rate(decisions: list[str], hit: tuple[str, ...]) -> dict[str, Any]:
    k = sum(d in hit for d in decisions)
    lo, hi = wilson(k, len(decisions))
    n = len(decisions)
    return {"hits": k, "n": n, "rate": k / max(1, n), "wilson95": [lo, hi]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("study", type=Path)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    doc = json.loads(args.study.read_text())
    k = args.passes
    aa_runs = [r for r in doc["aa"]["runs"] if r["decision"] is not None]
    slow_runs = [r for r in doc["b_slower"]["runs"] if r["decision"] is not None]
    aa = [verdict(r, i) for i, r in enumerate(aa_runs)]
    slow = [verdict(r, 100 + i) for i, r in enumerate(slow_runs)]
    either, worse = (BETTER, WORSE), (WORSE,)
    out: dict[str, Any] = {"aa_replays": len(aa), "slow_replays": len(slow), "passes": k}
    out["uncalibrated"] = {
        "aa_false": rate([v.decision for v in aa], either),
        "slow_detected": rate([v.decision for v in slow], worse),
    }
    pre_aa = [
        verdict(aa_runs[i], i, calibration(aa[i - k : i])).decision for i in range(k, len(aa))
    ]
    last = calibration(aa[-k:])
    pre_slow = [verdict(r, 100 + i, last) for i, r in enumerate(slow_runs)]
    out[f"preceding_{k}"] = {
        "aa_false": rate(pre_aa, either),
        "slow_detected": rate([v.decision for v in pre_slow], worse),
        "slow_ratio_net": sorted(round(v.ratio, 3) for v in pre_slow),
        "calibration_of_last": last.to_json(),
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
    out["aa_raw_ratios"] = sorted(round(math.exp(v.raw_log), 3) for v in aa)
    out["slow_raw_ratios"] = sorted(round(math.exp(v.raw_log), 3) for v in slow)
    if "apart" in doc:
        out["apart"] = {key: v for key, v in doc["apart"].items() if key != "per_row"}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
