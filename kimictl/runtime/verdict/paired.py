"""One verdict from paired per-request figures: B against A on the same requests.

Each request (row) was served by both arms, so the per-row log ratio log(B/A) carries the whole
comparison and the rows' mix (input and output lengths, prefix hits) cancels out row by row.
`paired_verdict` takes those log ratios (signed so that > 0 means B is better), bootstraps their
mean over rows, or over sessions (clusters) where the rows have them, and decides:

- "B better":   the interval excludes 0 and the estimate is beyond the floor, in B's favour;
- "B worse":    the same, against B;
- "no practical difference": the whole interval lies inside (-floor, +floor): whatever a test's
  p-value, the difference is smaller than what matters (the effect-size floor);
- "inconclusive": none of these; `rows_needed` says about how many rows would settle it (the
  interval's half-width shrinks as 1/sqrt(n)).

`floor` is relative (0.05 = 5%); in log space it is log(1 + floor).

A row bootstrap sees only the noise inside one replay. Two server instances also differ as a whole,
and by an amount that changes from one replay to the next (load beside them, placement, caches):
a constant offset on every row of a replay, which no resampling of rows can see. An A/A
calibration measures it: several A/A passes (identical arms, the same two targets and path as the
A/B) give each a mean log ratio and a bootstrap variance (`AaCalibration`, `aa_calibration`). Their
mean is the path's own offset (B's slot faster or slower than A's, e.g. a less loaded host); the
spread of the pass means beyond what their bootstraps explain is the between-pass variance
component. A verdict judged with a calibration subtracts the offset and adds, to every bootstrap
draw, a Student-t draw (passes - 1 degrees of freedom: the component is estimated) scaled by the
component plus the offset's own uncertainty: the interval is then one for "a replay of this path",
not only for "these rows". `noise_floor(verdict)` of one A/A pass is kept as a figure.
`quantile_ratio` gives B/A of one percentile (p10/p50/p90 of interactivity, TTFT p50/p90) with
the same paired resampling (the same rows, or sessions, are drawn for both arms).
Pure arithmetic over numbers (numpy): no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kimictl.runtime.verdict.common import DEFAULT_FLOOR, log_band, mean_var, wilson

__all__ = [
    "BETTER",
    "DECISIONS",
    "DEFAULT_FLOOR",
    "INCONCLUSIVE",
    "MIN_AA_PASSES",
    "SAME",
    "WORSE",
    "AaCalibration",
    "BootstrapEstimate",
    "Verdict",
    "aa_calibration",
    "decide",
    "noise_floor",
    "paired_verdict",
    "quantile_ratio",
    "rows_needed",
    "wilson",
]

BETTER = "B better"
WORSE = "B worse"
SAME = "no practical difference"
INCONCLUSIVE = "inconclusive"
DECISIONS = (BETTER, WORSE, SAME, INCONCLUSIVE)
N_BOOT = 2000
_CHUNK = 200  # bootstrap samples per block (bounds memory at _CHUNK x rows)
MIN_AA_PASSES = 3  # an A/A calibration: fewer passes leave the between-pass spread unmeasured


@dataclass(frozen=True)
class AaCalibration:
    """What `passes` A/A passes through one path say about it, on the log-ratio scale (B/A):
    `offset` the mean of the passes' mean log ratios (the path's own offset), `spread` their
    sample variance (everything a pass's mean varies by: rows and the instances' state),
    `within` the mean of the passes' bootstrap variances (what rows alone explain)."""

    passes: int
    offset: float
    spread: float
    within: float

    @property
    def between(self) -> float:
        """The between-pass variance component: spread beyond the rows' own noise (>= 0)."""
        return max(0.0, self.spread - self.within)

    @property
    def added_var(self) -> float:
        """What a judged replay's mean gets beyond its own bootstrap: this replay's own offset
        (`between`) and the uncertainty of the subtracted `offset` (spread / passes)."""
        return self.between + self.spread / self.passes

    @property
    def offset_ratio(self) -> float:
        """The path's own offset as a ratio B/A."""
        return math.exp(self.offset)

    @property
    def between_sd(self) -> float:
        """The between-pass spread as a relative ratio (0.1 = a replay moves about 10%)."""
        return math.expm1(math.sqrt(self.between))

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out |= {"between": self.between, "added_var": self.added_var}
        out["offset_ratio"] = self.offset_ratio
        out["between_sd_pct"] = self.between_sd * 100
        return out


def aa_calibration(means: Sequence[float], variances: Sequence[float]) -> AaCalibration:
    """The calibration of A/A passes from each pass's mean log ratio (B/A) and the variance of
    its bootstrap mean (`Verdict.raw_log`, `Verdict.boot_var`): a method-of-moments variance
    component (as in random-effects meta-analysis). Needs `MIN_AA_PASSES` passes."""
    if len(means) != len(variances):
        raise ValueError(f"{len(means)} means for {len(variances)} variances")
    if len(means) < MIN_AA_PASSES:
        raise ValueError(f"{len(means)} A/A passes: a calibration needs {MIN_AA_PASSES} or more")
    values = [float(m) for m in means]
    if not all(math.isfinite(m) for m in values) or not all(v >= 0 for v in variances):
        raise ValueError("A/A passes need finite means and variances >= 0")
    offset, spread = mean_var(values)
    return AaCalibration(len(values), offset, spread, math.fsum(variances) / len(variances))


@dataclass(frozen=True)
class BootstrapEstimate:
    """A ratio B/A with its bootstrap interval (`level`), over `n` rows in `units` units."""

    ratio: float
    lo: float
    hi: float
    n: int
    units: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """The decision on one metric, and what it rests on. `ratio`, `lo`, `hi`: B/A as a ratio of
    the metric (geometric mean of the per-row ratios), higher = B better when
    `higher_is_better`."""

    decision: str
    metric: str
    ratio: float
    lo: float
    hi: float
    floor: float
    rows: int
    units: int
    unit: str  # "rows" or "sessions": what the bootstrap resampled
    level: float
    higher_is_better: bool = True
    rows_needed: int | None = None  # inconclusive: about how many rows would settle it
    aa: bool = False  # an A/A run: any "better"/"worse" is a false alarm
    figures: dict[str, BootstrapEstimate] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    raw_log: float = math.nan  # mean log ratio B/A of these rows, before any calibration
    boot_var: float = math.nan  # variance of its bootstrap (what the rows alone explain)
    calibration: AaCalibration | None = None  # the A/A calibration it was judged with

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["figures"] = {k: v.to_json() for k, v in self.figures.items()}
        out["notes"] = list(self.notes)
        out["calibration"] = None if self.calibration is None else self.calibration.to_json()
        if self.aa:
            out["noise_floor"] = noise_floor(self)
            out["false_alarm"] = self.decision in (BETTER, WORSE)
        return out

    def sentence(self) -> str:
        """One line: the decision, the ratio and its interval, the floor, the rows behind it."""
        pct = f"{int(round(self.level * 100))}%"
        # the resampled unit is named only when it is not the row itself (sessions)
        units = "" if self.unit == "rows" else f" ({self.units} {self.unit})"
        text = (
            f"{self.decision}: {self.metric} B/A {self.ratio:.3f} [{pct} {self.lo:.3f}, "
            f"{self.hi:.3f}] over {self.rows} rows{units}, floor {self.floor:.1%}"
        )
        if self.rows_needed:
            text += f"; about {self.rows_needed} rows would settle it"
        if self.aa:
            text += f"; A/A noise floor {noise_floor(self):.1%}"
        if self.calibration is not None:
            c = self.calibration
            text += (
                f"; net of {c.passes} A/A passes (offset x{c.offset_ratio:.3f}, between-pass "
                f"spread {c.between_sd:.1%})"
            )
        return text


def _np() -> Any:
    import numpy

    return numpy


def _unit_weights(units: Any, n_boot: int, rng: Any) -> Any:
    """Bootstrap weights per row (n_boot x rows): each unit (row or session) drawn with
    replacement, a row weighing as often as its unit was drawn."""
    np = _np()
    keys, inverse = np.unique(units, return_inverse=True)
    draws = rng.multinomial(len(keys), np.full(len(keys), 1.0 / len(keys)), size=n_boot)
    return draws[:, inverse]


def _blocks(n_boot: int) -> list[int]:
    return [min(_CHUNK, n_boot - i) for i in range(0, n_boot, _CHUNK)]


def _units(n: int, clusters: Sequence[Any] | None) -> tuple[Any, str]:
    np = _np()
    if clusters is None:
        return np.arange(n), "rows"
    if len(clusters) != n:
        raise ValueError(f"{len(clusters)} cluster labels for {n} rows")
    return np.asarray([str(c) for c in clusters]), "sessions"


def _interval(samples: Any, level: float) -> tuple[float, float]:
    np = _np()
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(samples, [tail, 100.0 - tail])
    return float(lo), float(hi)


def decide(lo: float, est: float, hi: float, floor: float) -> str:
    """The four-way decision on a log ratio (> 0 = B better) and its interval [lo, hi]."""
    band = log_band(floor)
    if lo > 0 and est >= band:
        return BETTER
    if hi < 0 and est <= -band:
        return WORSE
    if -band < lo and hi < band:
        return SAME
    return INCONCLUSIVE


def rows_needed(
    lo: float, est: float, hi: float, floor: float, n: int, fixed_half: float = 0.0
) -> int | None:
    """About how many rows would turn an inconclusive interval into a decision: the rows' part of
    the half-width shrinks as 1/sqrt(n) around the same estimate (`fixed_half`, an A/A
    calibration's part, does not; halves add in quadrature); to exclude 0 when the estimate is
    beyond the floor, to fit inside the floor band when it is within. None when no n settles it
    (the estimate on the band's edge, or the calibration's part alone too wide)."""
    band = log_band(floor)
    half = (hi - lo) / 2.0
    target = abs(est) if abs(est) >= band else band - abs(est)
    if half <= 0 or target <= fixed_half + 1e-9 or n < 1:
        return None
    rows_half2 = max(half * half - fixed_half * fixed_half, 1e-12)
    need = math.ceil(n * rows_half2 / (target * target - fixed_half * fixed_half))
    return need if need > n else n + 1


def quantile_ratio(
    a: Sequence[float],
    b: Sequence[float],
    p: float,
    *,
    clusters: Sequence[Any] | None = None,
    level: float = 0.95,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> BootstrapEstimate:
    """B/A of the p-th percentile (0-100) of a per-row figure served by both arms; each bootstrap
    sample draws the same rows (or sessions) for both. Rows where either value is missing or not
    positive are left out."""
    np = _np()
    av = np.asarray(a, dtype=float)
    bv = np.asarray(b, dtype=float)
    ok = np.isfinite(av) & np.isfinite(bv) & (av > 0) & (bv > 0)
    labels = None if clusters is None else [c for c, k in zip(clusters, ok, strict=True) if k]
    av, bv = av[ok], bv[ok]
    n = len(av)
    if n == 0:
        return BootstrapEstimate(math.nan, math.nan, math.nan, 0, 0)
    units, _ = _units(n, labels)
    rng = np.random.default_rng(seed)
    order_a, order_b = np.argsort(av), np.argsort(bv)
    sa, sb = av[order_a], bv[order_b]
    out = []
    for size in _blocks(n_boot):
        w = _unit_weights(units, size, rng)
        out.append(_weighted_q(sb, w[:, order_b], p) / _weighted_q(sa, w[:, order_a], p))
    ratios = np.concatenate(out)
    lo, hi = _interval(ratios, level)
    point = float(
        np.percentile(bv, p, method="inverted_cdf") / np.percentile(av, p, method="inverted_cdf")
    )
    return BootstrapEstimate(point, lo, hi, n, len(np.unique(units)))


def _weighted_q(sorted_values: Any, weights: Any, p: float) -> Any:
    """The p-th weighted percentile (inverted CDF) of `sorted_values`, per row of `weights`."""
    np = _np()
    cum = np.cumsum(weights, axis=1)
    k = np.argmax(cum >= (p / 100.0) * cum[:, -1:], axis=1)
    return sorted_values[k]


def paired_verdict(
    log_ratios: Sequence[float],
    *,
    floor: float = DEFAULT_FLOOR,
    clusters: Sequence[Any] | None = None,
    metric: str = "interactivity",
    higher_is_better: bool = True,
    level: float = 0.95,
    n_boot: int = N_BOOT,
    seed: int = 0,
    aa: bool = False,
    figures: dict[str, BootstrapEstimate] | None = None,
    calibration: AaCalibration | None = None,
) -> Verdict:
    """The verdict on per-row log ratios log(B/A) of a metric (`higher_is_better` says which way
    is good; the decision is always about B). Resamples rows, or `clusters` (session ids, one per
    row) where given. Non-finite ratios are left out (and counted in the notes). With an A/A
    `calibration` (of the same metric and path), judged net of its offset with its between-pass
    variance added to the interval (module docstring)."""
    np = _np()
    if not 0 <= floor < 1:
        raise ValueError(f"floor {floor!r} must be in [0, 1)")
    values = np.asarray(log_ratios, dtype=float)
    finite = np.isfinite(values)
    notes = []
    if not finite.all():
        notes.append(f"{int((~finite).sum())} rows without a figure on both arms left out")
    labels = None if clusters is None else [c for c, k in zip(clusters, finite, strict=True) if k]
    values = values[finite]
    n = len(values)
    if n < 2:
        return Verdict(
            INCONCLUSIVE,
            metric,
            math.nan,
            math.nan,
            math.nan,
            floor,
            n,
            n,
            "rows",
            level,
            higher_is_better,
            None,
            aa,
            dict(figures or {}),
            (*notes, "fewer than 2 paired rows"),
        )
    units, unit = _units(n, labels)
    rng = np.random.default_rng(seed)
    means = []
    for size in _blocks(n_boot):
        w = _unit_weights(units, size, rng)
        means.append((w @ values) / w.sum(axis=1))
    samples = np.concatenate(means)
    raw, boot_var = float(values.mean()), float(samples.var())
    est = raw
    fixed_half = 0.0  # the part of the interval's half-width more rows do not shrink
    if calibration is not None:
        scale = math.sqrt(calibration.added_var)
        df = calibration.passes - 1
        samples = samples - calibration.offset + scale * rng.standard_t(df, size=len(samples))
        est = raw - calibration.offset
        fixed_half = scale * float(np.quantile(rng.standard_t(df, size=20000), (1 + level) / 2))
    lo, hi = _interval(samples, level)
    sign = 1.0 if higher_is_better else -1.0
    # the decision is on "B better" = sign * log ratio > 0
    s_lo, s_est, s_hi = sorted((sign * lo, sign * hi))[0], sign * est, max(sign * lo, sign * hi)
    decision = decide(s_lo, s_est, s_hi, floor)
    needed = (
        rows_needed(s_lo, s_est, s_hi, floor, n, fixed_half) if decision == INCONCLUSIVE else None
    )
    return Verdict(
        decision,
        metric,
        math.exp(est),
        math.exp(lo),
        math.exp(hi),
        floor,
        n,
        int(len(np.unique(units))),
        unit,
        level,
        higher_is_better,
        needed,
        aa,
        dict(figures or {}),
        tuple(notes),
        raw,
        boot_var,
        calibration,
    )


def noise_floor(aa: Verdict) -> float:
    """What an A/A verdict says this path cannot tell apart: the largest relative distance from
    1 its interval reaches (0.03 = ratios within 3% of 1 are noise here)."""
    if math.isnan(aa.lo) or math.isnan(aa.hi):
        return math.nan
    reach = max(abs(math.log(aa.lo)), abs(math.log(aa.hi)))
    return math.expm1(reach)
