"""A/B comparison of two targets' summaries: bootstrap intervals, permutation p-values, and a
verdict that keeps its error rate over many metrics (docs/bench.md, "How the verdict is made")."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kimictl.runtime.load.records import RequestRecord
from kimictl.runtime.load.summary import interactivity_of
from kimictl.runtime.observe.window import percentile

__all__ = [
    "AB_METRICS",
    "ALPHA",
    "HEADLINE",
    "NOT_DISTINGUISHABLE",
    "NOT_MEASURED",
    "compare",
    "holm",
    "single_run_caveat",
]

# The default A/B's measured false call rate: two identical real vLLM CPU servers, 20 runs of the
# default schedule, 1 "faster/slower" (docs/results.md, "The A/B verdict (A/A studies)").
AA_FALSE_CALLS = (1, 20, 0.9, 23.6)  # calls, runs, Wilson 95% low and high (%)


def single_run_caveat(verdict: str, repeats: int) -> str | None:
    """What a one-run "faster"/"slower" leaves out: it is one run, identical servers get such a
    call in about 1 run of 20, and what --repeat adds. None for another verdict or repeats."""
    if repeats > 1 or verdict in (NOT_DISTINGUISHABLE, NOT_MEASURED):
        return None
    calls, runs, low, high = AA_FALSE_CALLS
    return (
        f"one run: two identical servers got such a call in {calls} of {runs} A/A runs "
        f"({100 * calls / runs:.0f}%, 95% {low:g}-{high:g}%; docs/results.md); `--repeat 3` "
        "runs the point 3 times: the requests of all runs are pooled and tokens/s gets an "
        "interval over the runs"
    )


# ---------------------------------------------------------------------------------------------
# A/B


def _inter_list(rs: Sequence[RequestRecord]) -> list[float]:
    return [x for x in (interactivity_of(r) for r in rs) if x is not None]


def _ms_list(attr: str) -> Any:
    def get(rs: Sequence[RequestRecord]) -> list[float]:
        if attr == "tpot":
            return [t * 1000 for t in (r.tpot for r in rs) if t is not None]
        return [getattr(r, attr) * 1000 for r in rs if getattr(r, attr) is not None]

    return get


# per-request value lists the bootstrap resamples; metrics on one list share its resamples
PER_REQUEST: dict[str, Any] = {
    "interactivity": _inter_list,
    "ttft": _ms_list("ttft"),
    "tpot": _ms_list("tpot"),
    "latency": _ms_list("latency"),
}


def _k(key: str) -> Any:
    return lambda s: s.get(key)


def _ki(key: str) -> Any:
    return lambda s: s["kimictl"]["interactivity_tok_s_per_user"].get(key)


AB_METRICS: tuple[tuple[str, Any, bool, str | None, Any], ...] = (
    # label, summary getter, higher is better, PER_REQUEST list (None: run-level, over repeats),
    # statistic on that list
    ("output tokens/s", _k("output_throughput"), True, None, None),
    ("output tokens/s/GPU", lambda s: s["kimictl"]["output_throughput_per_gpu"], True, None, None),
    ("requests/s", _k("request_throughput"), True, None, None),
    ("interactivity p10 (slow tail) tok/s/user", _ki("p10_slow_tail"), True, "interactivity", 10),
    ("interactivity p50 tok/s/user", _ki("p50"), True, "interactivity", 50),
    ("interactivity p90 (fast tail) tok/s/user", _ki("p90_fast_tail"), True, "interactivity", 90),
    ("TTFT mean ms", _k("mean_ttft_ms"), False, "ttft", "mean"),
    ("TTFT p99 ms", _k("p99_ttft_ms"), False, "ttft", 99),
    ("TPOT mean ms", _k("mean_tpot_ms"), False, "tpot", "mean"),
    ("TPOT median ms", _k("median_tpot_ms"), False, "tpot", 50),
    ("TPOT p90 ms", _k("p90_tpot_ms"), False, "tpot", 90),
    ("ITL mean ms", _k("mean_itl_ms"), False, None, None),
    ("E2E latency mean ms", _k("mean_e2el_ms"), False, "latency", "mean"),
    ("E2E latency p90 ms", _k("p90_e2el_ms"), False, "latency", 90),
    ("spec acceptance length", _k("spec_decode_acceptance_length"), True, None, None),
)
HEADLINE = "interactivity p50 tok/s/user"
# The headline's verdict when neither side has a per-request TPOT: every response was one token, or
# arrived in one read (a stalled server flushing whole responses), so no time per token exists.
NOT_MEASURED = "not measured (no request had a time per output token)"
NOT_DISTINGUISHABLE = "no significant difference"
# The error rate of each verdict: the primary metric is tested alone at ALPHA; the secondary
# metrics of a point are one family, Holm-Bonferroni at ALPHA family-wise (docs/bench.md).
ALPHA = 0.05
# A bootstrap needs this many requests per side, and MIN_TAIL of them beyond a tail percentile;
# below that a metric gets no interval and no verdict (lab/bench/ab_false_alarms.py: the rate).
MIN_SAMPLES = 10
MIN_TAIL = 3
MIN_ROUNDS = 1000  # 1/(1000+1) < ALPHA/15: Holm can reject even the first of 15 metrics
_DRAW_BUDGET = 2_000_000  # resampled values per metric group and point, bounds a big run's cost
_MAX_SPLITS = 5000  # permutations over repeats: exact below this count, sampled above


def _sorted_stat(xs: Sequence[float], how: Any) -> float:
    """The mean or percentile `how` of an already sorted, non-empty list (the bootstrap's inner
    loop)."""
    if how == "mean":
        return math.fsum(xs) / len(xs)
    k = (len(xs) - 1) * float(how) / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _enough(n: int, how: Any) -> bool:
    """Enough requests for a bootstrap of this statistic: MIN_SAMPLES in all, and MIN_TAIL beyond
    a tail percentile (the resampled p99 of 30 requests is one of its top two values)."""
    if n < MIN_SAMPLES:
        return False
    if how == "mean":
        return True
    return n * min(float(how), 100.0 - float(how)) / 100.0 >= MIN_TAIL


@dataclass(frozen=True)
class _Test:
    ci: tuple[float, float]
    p: float


def _bootstrap_group(
    a_turns: Sequence[Sequence[float]],
    b_turns: Sequence[Sequence[float]],
    hows: Sequence[Any],
    *,
    rounds: int,
    rng: random.Random,
    sized: bool = True,
) -> dict[Any, _Test | None]:
    """For each statistic in `hows`: the percentile-bootstrap 95% interval of stat(A)/stat(B)
    (requests resampled within each side) and a permutation p-value for "A and B are one
    distribution" (exact under that null at any sample size, which the bootstrap's own tail is
    not, lab/bench/ab_false_alarms.py). The permutation shuffles whole turns between the sides
    (each inner list is one turn's values): requests of one turn share the machine's state then,
    so they are not exchangeable one by one (lab/bench/ab_aa_study.py); a turn of one request is
    the plain request-level test. Statistics on one list share the resamples."""
    out: dict[Any, _Test | None] = {h: None for h in hows}
    a = [x for turn in a_turns for x in turn]
    b = [x for turn in b_turns for x in turn]
    usable = [h for h in hows if not sized or (_enough(len(a), h) and _enough(len(b), h))]
    if not usable or not a or not b:
        return out
    na, nb = len(a), len(b)
    turns = [list(t) for t in a_turns if t] + [list(t) for t in b_turns if t]
    ka = sum(1 for t in a_turns if t)
    rounds = min(rounds, max(MIN_ROUNDS, _DRAW_BUDGET // (na + nb)))  # bound big runs' cost
    sa0, sb0 = sorted(a), sorted(b)
    observed = {h: _log_ratio(_sorted_stat(sa0, h), _sorted_stat(sb0, h)) for h in usable}
    ratios: dict[Any, list[float]] = {h: [] for h in usable}
    hits = dict.fromkeys(usable, 0)
    for _ in range(rounds):
        xa = sorted(rng.choices(a, k=na))
        xb = sorted(rng.choices(b, k=nb))
        shuffled = rng.sample(turns, len(turns))
        pa = sorted(x for t in shuffled[:ka] for x in t)
        pb = sorted(x for t in shuffled[ka:] for x in t)
        for h in usable:
            sb = _sorted_stat(xb, h)
            if sb:
                ratios[h].append(_sorted_stat(xa, h) / sb)
            obs = observed[h]
            permuted = _log_ratio(_sorted_stat(pa, h), _sorted_stat(pb, h))
            if obs is not None and (permuted is None or permuted >= obs):
                hits[h] += 1
    for h in usable:
        rs = ratios[h]
        if len(rs) < rounds // 2 or observed[h] is None:
            continue
        lo, hi = percentile(rs, 2.5), percentile(rs, 97.5)
        assert lo is not None and hi is not None
        out[h] = _Test((lo, hi), (hits[h] + 1) / (rounds + 1))
    return out


def _turns(records: Sequence[RequestRecord]) -> list[list[RequestRecord]]:
    """A side's requests by the turn of the A/B schedule they ran in (loadgen: `part`); requests
    that ran in no sequential turn (one target, --interleave) are each their own."""
    groups: dict[tuple[int, int], list[RequestRecord]] = {}
    for i, r in enumerate(records):
        key = (r.repeat, r.part) if r.part else (-1, i)
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def _log_ratio(x: float, y: float) -> float | None:
    """|log(x / y)|, less a hair so the observed split counts as a hit; None if undefined."""
    if x <= 0 or y <= 0:
        return None
    return abs(math.log(x / y)) * (1 - 1e-12)


def _repeats_test(
    xa: Sequence[float], xb: Sequence[float], *, rounds: int, rng: random.Random
) -> _Test | None:
    """Run-level metrics (one value per repeat): the bootstrap interval of the ratio of means as
    shown, and an exact permutation p over the repeats' labels (a bootstrap of 2-5 values puts
    all its mass on one side of 1 by chance, so its p would be near 0 with no evidence)."""
    if len(xa) < 2 or len(xb) < 2 or not statistics.fmean(xb):
        return None
    boot = _bootstrap_group(
        [[x] for x in xa], [[x] for x in xb], ["mean"], rounds=rounds, rng=rng, sized=False
    )["mean"]
    if boot is None:
        return None
    pooled = list(xa) + list(xb)
    na = len(xa)

    def dist(sa: Sequence[float], sb: Sequence[float]) -> float:
        ma, mb = statistics.fmean(sa), statistics.fmean(sb)
        return abs(math.log(ma / mb)) if ma > 0 and mb > 0 else math.inf

    observed = dist(xa, xb) * (1 - 1e-12)  # the observed split counts as a hit
    if math.comb(len(pooled), na) <= _MAX_SPLITS:
        splits = list(itertools.combinations(range(len(pooled)), na))
        hits = sum(dist(*_split(pooled, idx)) >= observed for idx in splits)
        return _Test(boot.ci, hits / len(splits))
    hits = sum(
        dist(*_split(pooled, rng.sample(range(len(pooled)), na))) >= observed
        for _ in range(_MAX_SPLITS)
    )
    return _Test(boot.ci, (hits + 1) / (_MAX_SPLITS + 1))


def _split(pooled: Sequence[float], idx: Iterable[int]) -> tuple[list[float], list[float]]:
    chosen = set(idx)
    return [pooled[i] for i in sorted(chosen)], [v for i, v in enumerate(pooled) if i not in chosen]


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm-Bonferroni adjusted p-values: reject where adjusted < alpha keeps the family-wise
    error at alpha under any dependence between the tests."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m = len(order)
    out: dict[str, float] = {}
    running = 0.0
    for i, key in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[key]))
        out[key] = running
    return out


def _mean_of(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.fmean(xs) if xs else None


def _unmeasured_headline(point: str, higher: bool, a: str, b: str) -> dict[str, Any]:
    return {
        "point": point,
        "metric": HEADLINE,
        "role": "primary",
        "higher_is_better": higher,
        a: None,
        b: None,
        "ratio": None,
        "ci95": None,
        "p": None,
        "p_adjusted": None,
        "better": None,
        "verdict": NOT_MEASURED,
    }


def compare(
    summaries: Sequence[Mapping[str, Any]],
    records: Sequence[RequestRecord],
    *,
    a: str,
    b: str,
    primary: str = HEADLINE,
    rounds: int = 1000,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """A/B table per point: value of A and B (mean over repeats), ratio A/B, a 95% bootstrap CI
    and a permutation p-value for "A and B are one distribution".

    Per-request metrics resample requests (repeats pooled); run-level metrics need --repeat >= 2
    (bootstrap interval over repeats, exact permutation p over the repeats' labels). `better`
    names the side that wins where the test rejects and the interval excludes 1: the `primary`
    metric (role "primary") alone at ALPHA, the other metrics of the point (role "secondary") as
    one Holm-Bonferroni family at ALPHA (`p_adjusted` < ALPHA). The primary row carries the
    point's verdict ("faster", "slower", NOT_DISTINGUISHABLE, NOT_MEASURED) and is always there.
    """
    rng = random.Random(seed)
    points: list[str] = []
    for s in summaries:
        p = s["kimictl"]["point"]
        if p not in points:
            points.append(p)
    rows = []
    for point in points:
        sa = [
            s for s in summaries if s["kimictl"]["point"] == point and s["kimictl"]["target"] == a
        ]
        sb = [
            s for s in summaries if s["kimictl"]["point"] == point and s["kimictl"]["target"] == b
        ]
        if not sa or not sb:
            continue
        ra = [r for r in records if r.point == point and r.target == a and r.ok and not r.warmup]
        rb = [r for r in records if r.point == point and r.target == b and r.ok and not r.warmup]
        tests: dict[str, _Test | None] = {}
        for key, extract in PER_REQUEST.items():
            hows = [how for _, _, _, k, how in AB_METRICS if k == key]
            group = _bootstrap_group(
                [extract(t) for t in _turns(ra)],
                [extract(t) for t in _turns(rb)],
                hows,
                rounds=rounds,
                rng=rng,
            )
            for label, _, _, k, how in AB_METRICS:
                if k == key:
                    tests[label] = group[how]
        point_rows = []
        for label, getter, higher, per_req, _how in AB_METRICS:
            va_list = [getter(s) for s in sa]
            vb_list = [getter(s) for s in sb]
            va, vb = _mean_of(va_list), _mean_of(vb_list)
            if va is None and vb is None:
                if label == primary:  # the point's verdict row is always there
                    point_rows.append(_unmeasured_headline(point, higher, a, b))
                    point_rows[-1]["metric"] = label
                continue
            ratio = va / vb if va is not None and vb else None
            test = tests.get(label) if per_req is not None else None
            if per_req is None:
                xa = [v for v in va_list if v is not None]
                xb = [v for v in vb_list if v is not None]
                test = _repeats_test(xa, xb, rounds=rounds, rng=rng)
            row: dict[str, Any] = {
                "point": point,
                "metric": label,
                "role": "primary" if label == primary else "secondary",
                "higher_is_better": higher,
                a: va,
                b: vb,
                "ratio": ratio,
                "ci95": list(test.ci) if test else None,
                "p": None if test is None else round(test.p, 5),
                "p_adjusted": None,
                "better": None,
            }
            point_rows.append(row)
        family = {
            r["metric"]: r["p"]
            for r in point_rows
            if r["role"] == "secondary" and r["p"] is not None
        }
        adjusted = holm(family)
        for row in point_rows:
            if row["role"] == "primary":
                row["p_adjusted"] = row["p"]
            else:
                row["p_adjusted"] = adjusted.get(row["metric"])
            if "verdict" in row:  # not measured
                continue
            ci = row["ci95"]
            # the test rejects AND the shown interval agrees, so a mark never sits on an
            # interval that holds 1
            if row["p_adjusted"] is not None and row["p_adjusted"] < ALPHA and ci:
                if ci[0] > 1 or ci[1] < 1:
                    a_wins = (ci[0] > 1) == row["higher_is_better"]
                    row["better"] = a if a_wins else b
            if row["role"] == "primary":
                better = row["better"]
                row["verdict"] = (
                    NOT_DISTINGUISHABLE
                    if better is None
                    else ("faster" if better == a else "slower")
                )
        rows.extend(point_rows)
    return rows
