"""A/B comparison of two targets' summaries, with bootstrap confidence intervals."""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kimictl.runtime.load.records import RequestRecord
from kimictl.runtime.load.summary import interactivity_of, percentile

__all__ = [
    "AB_METRICS",
    "HEADLINE",
    "NOT_MEASURED",
    "compare",
]


# ---------------------------------------------------------------------------------------------
# A/B


# (label, how to read it from a summary, higher is better, per-request extractor for the bootstrap)
def _inter_list(rs: Sequence[RequestRecord]) -> list[float]:
    return [x for x in (interactivity_of(r) for r in rs) if x is not None]


def _ms_list(attr: str) -> Any:
    def get(rs: Sequence[RequestRecord]) -> list[float]:
        if attr == "tpot":
            return [t * 1000 for t in (r.tpot for r in rs) if t is not None]
        return [getattr(r, attr) * 1000 for r in rs if getattr(r, attr) is not None]

    return get


def _k(key: str) -> Any:
    return lambda s: s.get(key)


def _ki(key: str) -> Any:
    return lambda s: s["kimictl"]["interactivity_tok_s_per_user"].get(key)


AB_METRICS: tuple[tuple[str, Any, bool, Any, Any], ...] = (
    # label, summary getter, higher is better, per-request list, statistic on that list
    ("output tokens/s", _k("output_throughput"), True, None, None),
    ("output tokens/s/GPU", lambda s: s["kimictl"]["output_throughput_per_gpu"], True, None, None),
    ("requests/s", _k("request_throughput"), True, None, None),
    ("interactivity p10 (slow tail) tok/s/user", _ki("p10_slow_tail"), True, _inter_list, 10),
    ("interactivity p50 tok/s/user", _ki("p50"), True, _inter_list, 50),
    ("interactivity p90 (fast tail) tok/s/user", _ki("p90_fast_tail"), True, _inter_list, 90),
    ("TTFT mean ms", _k("mean_ttft_ms"), False, _ms_list("ttft"), "mean"),
    ("TTFT p99 ms", _k("p99_ttft_ms"), False, _ms_list("ttft"), 99),
    ("TPOT mean ms", _k("mean_tpot_ms"), False, _ms_list("tpot"), "mean"),
    ("TPOT median ms", _k("median_tpot_ms"), False, _ms_list("tpot"), 50),
    ("TPOT p90 ms", _k("p90_tpot_ms"), False, _ms_list("tpot"), 90),
    ("ITL mean ms", _k("mean_itl_ms"), False, None, None),
    ("E2E latency mean ms", _k("mean_e2el_ms"), False, _ms_list("latency"), "mean"),
    ("E2E latency p90 ms", _k("p90_e2el_ms"), False, _ms_list("latency"), 90),
    ("spec acceptance length", _k("spec_decode_acceptance_length"), True, None, None),
)
HEADLINE = "interactivity p50 tok/s/user"
# The headline's verdict when neither side has a per-request TPOT: every response was one token, or
# arrived in one read (a stalled server flushing whole responses), so no time per token exists.
NOT_MEASURED = "not measured (no request had a time per output token)"


def _stat(values: Sequence[float], how: Any) -> float | None:
    if not values:
        return None
    if how == "mean":
        return statistics.fmean(values)
    return percentile(values, float(how))


def _bootstrap_ratio(
    a: Sequence[float], b: Sequence[float], how: Any, *, rounds: int, rng: random.Random
) -> tuple[float, float] | None:
    if len(a) < 2 or len(b) < 2:
        return None
    rounds = min(rounds, max(100, 400_000 // (len(a) + len(b))))  # bound the cost on big runs
    ratios = []
    na, nb = len(a), len(b)
    for _ in range(rounds):
        sa = _stat([a[rng.randrange(na)] for _ in range(na)], how)
        sb = _stat([b[rng.randrange(nb)] for _ in range(nb)], how)
        if sa is not None and sb:
            ratios.append(sa / sb)
    if len(ratios) < rounds // 2:
        return None
    lo, hi = percentile(ratios, 2.5), percentile(ratios, 97.5)
    assert lo is not None and hi is not None
    return lo, hi


def _mean_of(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.fmean(xs) if xs else None


def _unmeasured_headline(point: str, higher: bool, a: str, b: str) -> dict[str, Any]:
    return {
        "point": point,
        "metric": HEADLINE,
        "higher_is_better": higher,
        a: None,
        b: None,
        "ratio": None,
        "ci95": None,
        "better": None,
        "verdict": NOT_MEASURED,
    }


def compare(
    summaries: Sequence[Mapping[str, Any]],
    records: Sequence[RequestRecord],
    *,
    a: str,
    b: str,
    rounds: int = 400,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """A/B table per point: value of A and B (mean over repeats), ratio A/B and a 95% bootstrap CI.

    The CI resamples requests (per-request metrics, repeats pooled) or repeats (run-level metrics,
    needs --repeat >= 2). `better` says which side wins where the CI excludes 1; the row named
    HEADLINE carries the point's verdict ("faster", "slower", "no significant difference").
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
        for label, getter, higher, per_req, how in AB_METRICS:
            va_list = [getter(s) for s in sa]
            vb_list = [getter(s) for s in sb]
            va, vb = _mean_of(va_list), _mean_of(vb_list)
            if va is None and vb is None:
                if label == HEADLINE:  # the point's verdict row is always there
                    rows.append(_unmeasured_headline(point, higher, a, b))
                continue
            ratio = va / vb if va is not None and vb else None
            ci = None
            if per_req is not None:
                ci = _bootstrap_ratio(per_req(ra), per_req(rb), how, rounds=rounds, rng=rng)
            elif len(sa) >= 2 and len(sb) >= 2:
                xa = [v for v in va_list if v is not None]
                xb = [v for v in vb_list if v is not None]
                ci = _bootstrap_ratio(xa, xb, "mean", rounds=rounds, rng=rng)
            better = None
            if ci is not None:
                if ci[0] > 1:
                    better = a if higher else b
                elif ci[1] < 1:
                    better = b if higher else a
            row: dict[str, Any] = {
                "point": point,
                "metric": label,
                "higher_is_better": higher,
                a: va,
                b: vb,
                "ratio": ratio,
                "ci95": list(ci) if ci else None,
                "better": better,
            }
            if label == HEADLINE:
                row["verdict"] = (
                    "no significant difference"
                    if better is None
                    else ("faster" if better == a else "slower")
                )
            rows.append(row)
    return rows
