"""Histogram buckets that resolve interactivity (tokens/s/user = 1/TPOT) at fast-path speeds.

vLLM's default `inter_token_latency` buckets start at 10 ms (0.01, 0.025, 0.05, ...): a 1-5 ms
TPOT lands in the first bucket and every percentile reads "somewhere below 10 ms". vLLM 0.32 (the
CPU build) and 0.33 accept `--custom-histogram-buckets '{"inter_token_latency": [...]}'`; that
family sets the buckets of both `vllm:inter_token_latency_seconds` and
`vllm:request_time_per_output_token_seconds` (vllm/v1/metrics/loggers.py).

`interactivity_buckets(lo, hi)` derives a geometric series with ratio `RATIO` covering
`lo..hi` tokens/s/user: the middle of any bucket is within (RATIO-1)/(RATIO+1) = 4.8% of every
value in it, and a bucket is 9.5% wide relative to its geometric centre, under the monitor's
10% limit (runtime.observe.resolution). 20..4000 tok/s/user takes 59 bounds plus a coarse tail
for stalls: one time series per bound per metric, kept that small on purpose.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from kimictl.core.errors import InputError

__all__ = [
    "DEFAULT_RANGE",
    "FAMILIES",
    "FAMILY",
    "MAX_RELATIVE_WIDTH",
    "RATIO",
    "VLLM_DEFAULT_ITL_BUCKETS",
    "check_buckets",
    "flag_for",
    "flag_value",
    "interactivity_buckets",
    "range_of",
    "summarise_argv",
    "unresolved_speeds",
]

FAMILY = "inter_token_latency"
# vLLM's bucket families (vllm/v1/metrics/buckets.py BUCKET_FAMILY_KEYS, 0.32 CPU build and 0.33).
FAMILIES = frozenset(
    {
        "request_latency",
        "time_to_first_token",
        "inter_token_latency",
        "iteration_tokens",
        "request_params_n",
        "request_num_preemptions",
        "request_tokens",
        "kv_cache_residency",
    }
)
# vLLM's INTER_TOKEN_LATENCY_BUCKETS (same in 0.32 and 0.33).
VLLM_DEFAULT_ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
RATIO = 1.1
MAX_RELATIVE_WIDTH = 0.10  # width / geometric centre above this: the bucket cannot resolve
DEFAULT_RANGE = (20.0, 4000.0)  # tokens/s/user every shipped profile resolves
_TAIL = (0.1, 0.5, 2.5, 10.0, 80.0)  # seconds: stalls stay visible, coarsely


def _round4(x: float) -> float:
    """4 significant digits: keeps the ratio within 0.1% of RATIO and the JSON short."""
    return float(f"{x:.4g}")


def interactivity_buckets(lo_tok_s: float, hi_tok_s: float) -> list[float]:
    """Seconds bounds that resolve lo..hi tokens/s/user: the first bound is below 1/(hi*RATIO)
    and the geometric series runs past RATIO/lo, so no value in range lands in the first bucket
    (no lower bound) or past the series (coarse)."""
    if not (0 < lo_tok_s < hi_tok_s) or not math.isfinite(hi_tok_s):
        raise InputError(
            f"interactivity range {lo_tok_s:g}..{hi_tok_s:g} tok/s/user must be two positive "
            "numbers, low before high."
        )
    first = 1.0 / (hi_tok_s * RATIO)
    last = RATIO / lo_tok_s
    n = math.ceil(math.log(last / first) / math.log(RATIO))
    bounds = [_round4(first * RATIO**k) for k in range(n + 1)]
    bounds += [t for t in _TAIL if t > bounds[-1] * RATIO]
    return bounds


def range_of(bounds: Sequence[float]) -> tuple[float, float] | None:
    """The whole-number (lo, hi) tok/s/user `interactivity_buckets` derived `bounds` from, or
    None (a hand-written list)."""
    if len(bounds) < 2 or bounds[0] <= 0:
        return None
    n = 1
    while n < len(bounds) and abs(bounds[n] / bounds[n - 1] / RATIO - 1) < 0.01:
        n += 1
    end = bounds[n - 1]  # the series' last bound: RATIO/lo <= end < RATIO**2/lo
    hi = round(1.0 / (bounds[0] * RATIO))
    fits = [
        lo
        for lo in range(max(1, math.floor(RATIO / end)), math.ceil(RATIO**2 / end) + 1)
        if lo < hi and interactivity_buckets(lo, hi) == list(bounds)
    ]
    if not fits:
        return None
    # several ends derive the same list: the roundest one is what a person wrote
    lo = max(fits, key=lambda v: (len(str(v)) - len(str(v).rstrip("0")), -v))
    return (float(lo), float(hi))


def _relative_width(lower: float, upper: float) -> float:
    if lower <= 0 or math.isinf(upper):
        return math.inf
    return (upper - lower) / math.sqrt(lower * upper)


def unresolved_speeds(
    bounds: Sequence[float], lo_tok_s: float, hi_tok_s: float
) -> list[tuple[float, float]]:
    """Sub-ranges of lo..hi tok/s/user whose TPOT falls in a bucket that cannot resolve it
    (first bucket, overflow bucket, or wider than MAX_RELATIVE_WIDTH), merged, as tok/s pairs."""
    edges = [0.0, *bounds, math.inf]
    t_lo, t_hi = 1.0 / hi_tok_s, 1.0 / lo_tok_s  # seconds per token
    bad: list[tuple[float, float]] = []
    for lower, upper in zip(edges, edges[1:], strict=False):
        a, b = max(lower, t_lo), min(upper, t_hi)
        if a >= b or _relative_width(lower, upper) <= MAX_RELATIVE_WIDTH + 1e-9:
            continue
        if bad and math.isclose(bad[-1][1], a):
            bad[-1] = (bad[-1][0], b)
        else:
            bad.append((a, b))
    return [(1.0 / b, 1.0 / a) for a, b in reversed(bad)]


def check_buckets(value: Any) -> dict[str, list[float]]:
    """vLLM's own validation of `--custom-histogram-buckets` (ObservabilityConfig): known family,
    non-empty, positive finite, strictly increasing. ValueError text = what is allowed."""
    if not isinstance(value, Mapping):
        raise ValueError(
            "a table of bucket families, e.g. { inter_token_latency = [0.001, 0.002] }"
        )
    out: dict[str, list[float]] = {}
    for family, bounds in value.items():
        if family not in FAMILIES:
            raise ValueError(f"keyed by vLLM's bucket families ({', '.join(sorted(FAMILIES))})")
        if not isinstance(bounds, Sequence) or isinstance(bounds, str) or not bounds:
            raise ValueError(f"a non-empty list of seconds for {family}")
        nums: list[float] = []
        for b in bounds:
            if isinstance(b, bool) or not isinstance(b, (int, float)):
                raise ValueError(f"numbers in {family}, not {b!r}")
            if not math.isfinite(b) or b <= 0:
                raise ValueError(f"finite bounds above 0 in {family}, not {b!r}")
            nums.append(float(b))
        if any(a >= b for a, b in zip(nums, nums[1:], strict=False)):
            raise ValueError(f"strictly increasing bounds in {family}")
        out[str(family)] = nums
    return out


def _short_number(x: float) -> str:
    """The shortest JSON number that parses back to exactly `x` as a float (JSON allows an
    integer mantissa with an exponent: 0.0002273 -> 2273e-7, 80.0 -> 8e1; vLLM reads the flag
    with json.loads, so each bound is the same float)."""
    plain = repr(float(x))
    sign, digits, exp = Decimal(plain).normalize().as_tuple()
    assert isinstance(exp, int)
    mantissa = ("-" if sign else "") + "".join(map(str, digits))
    sci = f"{mantissa}e{exp}" if exp else f"{mantissa}.0"
    best = min((plain, sci), key=len)
    assert float(best) == x
    return best


def flag_value(buckets: Mapping[str, Sequence[float]]) -> str:
    """The flag's JSON, as short as an exact form gets: no spaces, each bound in its shortest
    exact spelling (vLLM 0.33 parses it with json.loads; a list is the only form it accepts, so
    every bound is spelled out)."""
    body = ",".join(
        f"{json.dumps(k)}:[{','.join(_short_number(b) for b in v)}]" for k, v in buckets.items()
    )
    return "{" + body + "}"


def flag_for(buckets: Mapping[str, Sequence[float]]) -> list[str]:
    """argv words of the vLLM flag."""
    return ["--custom-histogram-buckets", flag_value(buckets)]


def summarise_argv(argv: Sequence[str]) -> list[str]:
    """`argv` for a plan line: the --custom-histogram-buckets value (often 60 bounds) replaced by
    one summary word per family, e.g. `<inter_token_latency: 64 bounds, 0.000227-80 s>`. Not a
    command to run: the exact argv is in `--dry-run --json`."""
    out = list(argv)
    for i, word in enumerate(out[:-1]):
        if word != "--custom-histogram-buckets":
            continue
        try:
            parsed = json.loads(out[i + 1])
            parts = [f"{k}: {len(v)} bounds, {min(v):g}-{max(v):g} s" for k, v in parsed.items()]
        except (ValueError, TypeError, AttributeError):
            continue
        out[i + 1] = "<" + "; ".join(parts) + ">"
    return out
