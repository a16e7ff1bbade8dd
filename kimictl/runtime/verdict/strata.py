"""The unpaired canary: compare within input x output length strata, reweight to one mix; and the
sample-ratio-mismatch check that blocks any verdict when the split is not the configured one.

A canary's two arms see different requests. Interactivity depends on the request's shape (a long
prompt or a short answer moves TPOT), so a plain difference of arm means mixes a shape difference
into the speed difference whenever the arms' shapes differ by chance or by routing. Post-
stratification: bucket each request by (input tokens, output tokens) on a power-of-two grid, take
the difference of mean log interactivity inside each bucket both arms reached, and weight the
buckets by one reference mix (both arms' requests together), so both arms are judged on the same
mix. Buckets only one arm reached are left out and counted (`coverage`).

SRM: a chi-square goodness-of-fit test of the arms' request counts against the configured
weights. A mismatch means the split is broken (a dead upstream, a sticky client, a wrong weight)
and any comparison of the arms is of different populations, so the judge reports SRM and decides
nothing. The threshold is strict (p < 0.001), as A/B platforms use, because it is read at every
look: a false SRM at a look only delays a verdict, it never makes a wrong one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kimictl.runtime.verdict.common import mean_ss
from kimictl.runtime.verdict.sequential import LogRatioSummary

__all__ = [
    "SRM_P",
    "Shaped",
    "Srm",
    "stratified_estimate",
    "stratum_of",
    "srm_check",
]

SRM_P = 0.001


@dataclass(frozen=True, slots=True)
class Shaped:
    """One request's log interactivity and its shape."""

    log_interactivity: float
    prompt_tokens: int
    output_tokens: int


def stratum_of(prompt_tokens: int, output_tokens: int) -> tuple[int, int]:
    """Power-of-two buckets: (floor log2 input, floor log2 output); 0 and 1 share bucket 0."""
    return (max(prompt_tokens, 1).bit_length() - 1, max(output_tokens, 1).bit_length() - 1)


def _groups(rows: Sequence[Shaped]) -> dict[tuple[int, int], list[float]]:
    out: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        out.setdefault(stratum_of(r.prompt_tokens, r.output_tokens), []).append(r.log_interactivity)
    return out


def stratified_estimate(
    tuned: Sequence[Shaped], stock: Sequence[Shaped]
) -> tuple[LogRatioSummary | None, float]:
    """(reweighted difference of mean log interactivity tuned - stock with its variance, the share
    of requests in strata both arms reached). A stratum counts when each arm has 2+ requests in
    it; a stratum's variance is pooled over both arms (one arm's 2 points say little alone)."""
    gt, gs = _groups(tuned), _groups(stock)
    total = len(tuned) + len(stock)
    common = [k for k in gt if len(gt[k]) >= 2 and len(gs.get(k, ())) >= 2]
    if not common or total == 0:
        return None, 0.0
    covered = sum(len(gt[k]) + len(gs[k]) for k in common)
    value = 0.0
    variance = 0.0
    for k in common:
        a, b = gt[k], gs[k]
        w = (len(a) + len(b)) / covered
        (ma, ssa), (mb, ssb) = mean_ss(a), mean_ss(b)
        pooled = (ssa + ssb) / (len(a) + len(b) - 2)
        value += w * (ma - mb)
        variance += w * w * pooled * (1 / len(a) + 1 / len(b))
    n = min(sum(len(gt[k]) for k in common), sum(len(gs[k]) for k in common))
    return LogRatioSummary(value, variance, n), covered / total


@dataclass(frozen=True, slots=True)
class Srm:
    """The sample-ratio check: observed shares against the configured weights."""

    observed: dict[str, int]
    expected_share: dict[str, float]
    chi2: float
    p: float

    @property
    def mismatch(self) -> bool:
        return self.p < SRM_P

    def to_json(self) -> dict[str, object]:
        total = sum(self.observed.values())
        return {
            "observed": self.observed,
            "observed_share": {k: v / total if total else None for k, v in self.observed.items()},
            "expected_share": self.expected_share,
            "chi2": self.chi2,
            "p": self.p,
            "mismatch": self.mismatch,
        }


def _chi2_sf(x: float, df: int) -> float:
    """P(chi2_df >= x) for df 1 or 2 (two or three arms), closed forms."""
    if df == 1:
        return math.erfc(math.sqrt(max(x, 0.0) / 2))
    if df == 2:
        return math.exp(-max(x, 0.0) / 2)
    raise ValueError(f"chi-square with {df} degrees of freedom is not needed here")


def srm_check(counts: Mapping[str, int], weights: Mapping[str, float]) -> Srm:
    """Chi-square goodness of fit of `counts` per arm to `weights` (any positive scale)."""
    if set(counts) != set(weights) or not 2 <= len(weights) <= 3:
        raise ValueError(f"arms {sorted(counts)} do not match the weights' {sorted(weights)}")
    wsum = sum(weights.values())
    share = {k: w / wsum for k, w in weights.items()}
    total = sum(counts.values())
    chi2 = 0.0
    for k, n in counts.items():
        expected = total * share[k]
        if expected > 0:
            chi2 += (n - expected) ** 2 / expected
        elif n > 0:
            chi2 = math.inf  # requests on an arm weighted 0
    p = 1.0 if total == 0 else _chi2_sf(chi2, len(weights) - 1) if math.isfinite(chi2) else 0.0
    return Srm(dict(counts), share, chi2, p)
