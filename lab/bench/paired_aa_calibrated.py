"""The paired study's runs judged as an operator runs them: A/A first, then the A/B with the floor
raised to that A/A's noise floor (`bench --paired --aa-report AA.json`).

Reads a `paired_aa_study.py` result. Each A/A replay i+1 is judged with the floor of A/A replay i
(false alarms of the calibrated procedure); each B-slower replay i with the floor of A/A replay i
(detections). Same decision rule as the product (runtime.verdict.paired.decide).

    PYTHONPATH=. python lab/bench/paired_aa_calibrated.py lab/results/paired_aa_study.json
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from kimictl.runtime.verdict.paired import decide, effective_floor, wilson


def floor_of(run: dict[str, Any]) -> float:
    return math.expm1(max(abs(math.log(run["lo"])), abs(math.log(run["hi"]))))


def judged(run: dict[str, Any], floor: float) -> str:
    return decide(math.log(run["lo"]), math.log(run["ratio"]), math.log(run["hi"]), floor)


def main() -> int:
    doc = json.loads(open(sys.argv[1]).read())
    aa = [r for r in doc["aa"]["runs"] if r["decision"] is not None]
    slow = [r for r in doc["b_slower"]["runs"] if r["decision"] is not None]
    false = [judged(aa[i + 1], effective_floor(0.05, floor_of(aa[i]))) for i in range(len(aa) - 1)]
    hits = [judged(r, effective_floor(0.05, floor_of(aa[i % len(aa)]))) for i, r in enumerate(slow)]
    k_false = sum(d in ("B better", "B worse") for d in false)
    k_hit = sum(d == "B worse" for d in hits)
    out = {
        "aa_calibrated_false": [k_false, len(false), wilson(k_false, len(false))],
        "b_slower_calibrated_detected": [k_hit, len(hits), wilson(k_hit, len(hits))],
        "aa_noise_floors": sorted(round(floor_of(r), 3) for r in aa),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
