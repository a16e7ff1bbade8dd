"""What the replay verdict (verdict.paired) and the live judge (verdict.sequential, .strata)
share: the effect-size floor and the small arithmetic both read it with. Pure arithmetic."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["DEFAULT_FLOOR", "log_band", "mean_ss", "mean_var", "wilson"]

# The practical-difference band on a ratio B/A (tuned/stock): within 1/1.05 .. 1.05 is
# "no practical difference". One floor for the replay verdict and the live judge.
DEFAULT_FLOOR = 0.05


def log_band(floor: float) -> float:
    """A relative floor (0.05 = 5%) as a band on the log-ratio scale: log(1 + floor)."""
    return math.log1p(floor)


def mean_ss(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sum of squared deviations from it); `values` must not be empty."""
    mean = math.fsum(values) / len(values)
    return mean, math.fsum((x - mean) ** 2 for x in values)


def mean_var(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample variance); the variance is inf below two values."""
    n = len(values)
    mean, ss = mean_ss(values)
    return mean, ss / (n - 1) if n > 1 else math.inf


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (the A/A false-alarm and detection rates)."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))
