"""Can a histogram percentile be trusted? Bucket resolution of the interactivity figures.

A Prometheus percentile is a linear interpolation inside one bucket: it is only as exact as the
bucket is narrow. vLLM's default inter-token buckets start at 10 ms, so a 1-5 ms TPOT (K3's fast
path) interpolates to some number below 10 ms that says nothing. A percentile is UNRESOLVED when
it falls in the first bucket (no lower bound), in the +Inf bucket (no upper bound), or in a bucket
wider than `MAX_RELATIVE_WIDTH` of its geometric centre; the window then carries a bound
("< 10 ms TPOT" = "> 100 tok/s/user") or a range, never a number. The fix is
`--custom-histogram-buckets` (deployment.buckets).

Only the inter_token_latency family (TPOT per request and ITL) is judged here: it is the family
whose buckets the shipped profiles set; TTFT and e2e keep vLLM's buckets and figures as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kimictl.deployment.buckets import MAX_RELATIVE_WIDTH
from kimictl.runtime.observe.names import INTER_TOKEN_LATENCY as ITL
from kimictl.runtime.observe.names import TIME_PER_OUTPUT_TOKEN as TPOT

if TYPE_CHECKING:
    from kimictl.runtime.observe.prometheus import Histogram

__all__ = ["Reading", "describe", "read_quantile", "unresolved_figures"]


@dataclass(frozen=True, slots=True)
class Reading:
    """One percentile and the bucket it fell in (seconds; lower 0 = first, upper inf = +Inf)."""

    quantile: float
    value: float
    lower: float
    upper: float
    reason: str = ""  # empty = resolved

    @property
    def resolved(self) -> bool:
        return not self.reason


def read_quantile(h: Histogram, q: float) -> Reading | None:
    """The percentile `q` of `h` with its bucket; None when the histogram is empty."""
    value = h.quantile(q)
    if value is None:
        return None
    rank = q * h.cumulative[-1]
    idx = 0
    while idx < len(h.cumulative) - 1 and h.cumulative[idx] < rank:
        idx += 1
    upper = h.bounds[idx]
    lower = h.bounds[idx - 1] if idx > 0 else 0.0
    if idx == 0:
        reason = f"in the first bucket (<= {_ms(upper)})"
    elif math.isinf(upper):
        reason = f"in the overflow bucket (> {_ms(lower)})"
    elif (upper - lower) / math.sqrt(lower * upper) > MAX_RELATIVE_WIDTH:
        width = (upper - lower) / math.sqrt(lower * upper)
        reason = f"in the bucket {_ms(lower)}..{_ms(upper)} ({width:.0%} wide)"
    else:
        reason = ""
    return Reading(q, value, lower, upper, reason)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:g} ms"


def _inv(seconds: float) -> float:
    return math.inf if seconds <= 0 else 1.0 / seconds


# WindowStats key -> (metric, quantile, as interactivity (tok/s/user) instead of ms)
_FIGURES: dict[str, tuple[str, float, bool]] = {
    "interactivity_p10": (TPOT, 0.90, True),
    "interactivity_p50": (TPOT, 0.50, True),
    "interactivity_p90": (TPOT, 0.10, True),
    "tpot_p10_ms": (TPOT, 0.10, False),
    "tpot_p50_ms": (TPOT, 0.50, False),
    "tpot_p90_ms": (TPOT, 0.90, False),
    "itl_p50_ms": (ITL, 0.50, False),
    "itl_p90_ms": (ITL, 0.90, False),
    "itl_p99_ms": (ITL, 0.99, False),
}


def _entry(reading: Reading, metric: str, as_speed: bool) -> dict[str, Any]:
    """JSON for one unresolved figure: the bound (or range) in the figure's own unit."""
    if as_speed:  # tok/s/user = 1/TPOT: bounds swap sides
        low, high = _inv(reading.upper), _inv(reading.lower)
    else:
        low, high = reading.lower * 1000.0, reading.upper * 1000.0
    if low <= 0:
        bound, shown = "<", high
    elif math.isinf(high):
        bound, shown = ">", low
    else:
        bound, shown = "range", None
    return {
        "bound": bound,
        "value": shown,
        "low": low if low > 0 else None,
        "high": None if math.isinf(high) else high,
        "metric": metric,
        "quantile": reading.quantile,
        "bucket_s": [reading.lower, None if math.isinf(reading.upper) else reading.upper],
        "reason": reading.reason,
    }


def unresolved_figures(histograms: Mapping[str, Histogram]) -> dict[str, dict[str, Any]]:
    """WindowStats keys whose percentile the buckets cannot resolve -> the bound to show instead."""
    out: dict[str, dict[str, Any]] = {}
    for key, (metric, q, as_speed) in _FIGURES.items():
        h = histograms.get(metric)
        reading = None if h is None else read_quantile(h, q)
        if reading is not None and not reading.resolved:
            out[key] = _entry(reading, metric, as_speed)
    return out


def describe(entry: Mapping[str, Any], fmt: str = ".1f", scale: float = 1.0) -> str:
    """'< 10.0', '> 100.0' or '40.0-100.0' for an unresolved entry."""
    if entry["bound"] == "range":
        return f"{format(entry['low'] * scale, fmt)}-{format(entry['high'] * scale, fmt)}"
    return f"{entry['bound']} {format(entry['value'] * scale, fmt)}"
