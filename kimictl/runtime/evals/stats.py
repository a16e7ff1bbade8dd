"""The statistics the checks use, in plain Python (no numpy/scipy on the operator's laptop).

- `chi2_sf(x, df)`: survival function of the chi-square distribution, via the regularized upper
  incomplete gamma Q(df/2, x/2) (power series below a+1, Lentz continued fraction above).
- `chi2_homogeneity(counts_a, counts_b)`: two-sample chi-square test on categorical counts; cells
  whose expected count is under `min_expected` are pooled into one "other" cell (the test's
  approximation needs expected counts of about 5 or more).
- `total_variation(counts_a, counts_b)`: 0.5 * sum |p_a - p_b| of the empirical distributions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "Chi2Result",
    "chi2_homogeneity",
    "chi2_sf",
    "gammaincc",
    "mean",
    "percentile",
    "total_variation",
]

_EPS = 1e-15
_TINY = 1e-300


def _gammainc_series(a: float, x: float) -> float:
    # P(a, x) = x^a e^-x / Gamma(a+1) * sum_n x^n / ((a+1)...(a+n))
    term = 1.0 / a
    total = term
    denom = a
    for _ in range(10_000):
        denom += 1.0
        term *= x / denom
        total += term
        if abs(term) < abs(total) * _EPS:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _gammaincc_fraction(a: float, x: float) -> float:
    # Q(a, x) = e^-x x^a / Gamma(a) * 1/(x+1-a- 1(1-a)/(x+3-a- 2(2-a)/(x+5-a- ...))), modified Lentz
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def gammaincc(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a), for a > 0, x >= 0."""
    if a <= 0:
        raise ValueError(f"gammaincc needs a > 0, got {a}")
    if x < 0:
        raise ValueError(f"gammaincc needs x >= 0, got {x}")
    if x == 0:
        return 1.0
    if x < a + 1.0:
        return max(0.0, 1.0 - _gammainc_series(a, x))
    return min(1.0, _gammaincc_fraction(a, x))


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df)."""
    if df <= 0:
        raise ValueError(f"chi-square needs df >= 1, got {df}")
    return gammaincc(df / 2.0, max(0.0, x) / 2.0)


@dataclass(frozen=True)
class Chi2Result:
    statistic: float
    df: int
    p_value: float
    cells: int  # categories after pooling (including the pooled "other" cell if any)
    pooled: int  # categories folded into "other"


def chi2_homogeneity(
    counts_a: Mapping[int, int], counts_b: Mapping[int, int], *, min_expected: float = 5.0
) -> Chi2Result:
    """Do two samples of categories come from one distribution? (2 x k contingency table)."""
    n_a = sum(counts_a.values())
    n_b = sum(counts_b.values())
    if n_a == 0 or n_b == 0:
        raise ValueError("chi-square homogeneity needs two non-empty samples")
    n = n_a + n_b
    keys = sorted(set(counts_a) | set(counts_b))
    cells: list[tuple[int, int]] = []
    other_a = other_b = pooled = 0
    for key in keys:
        a, b = counts_a.get(key, 0), counts_b.get(key, 0)
        # expected count of the smaller sample in this cell
        if (a + b) * min(n_a, n_b) / n < min_expected:
            other_a += a
            other_b += b
            pooled += 1
        else:
            cells.append((a, b))
    if pooled:
        if (other_a + other_b) * min(n_a, n_b) / n >= min_expected or not cells:
            cells.append((other_a, other_b))
        elif cells:
            # The pooled cell is itself too small: fold it into the smallest kept cell.
            i = min(range(len(cells)), key=lambda j: sum(cells[j]))
            cells[i] = (cells[i][0] + other_a, cells[i][1] + other_b)
    if len(cells) < 2:
        return Chi2Result(statistic=0.0, df=0, p_value=1.0, cells=len(cells), pooled=pooled)
    stat = 0.0
    for a, b in cells:
        total = a + b
        e_a = total * n_a / n
        e_b = total * n_b / n
        stat += (a - e_a) ** 2 / e_a + (b - e_b) ** 2 / e_b
    df = len(cells) - 1
    return Chi2Result(
        statistic=stat, df=df, p_value=chi2_sf(stat, df), cells=len(cells), pooled=pooled
    )


def total_variation(counts_a: Mapping[int, int], counts_b: Mapping[int, int]) -> float:
    n_a = sum(counts_a.values())
    n_b = sum(counts_b.values())
    if n_a == 0 or n_b == 0:
        raise ValueError("total variation needs two non-empty samples")
    keys = set(counts_a) | set(counts_b)
    return 0.5 * sum(abs(counts_a.get(k, 0) / n_a - counts_b.get(k, 0) / n_b) for k in keys)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 100]; 0.0 for an empty sequence."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]
