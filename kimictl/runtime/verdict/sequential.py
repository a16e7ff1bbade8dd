"""A judgement that stays valid while someone keeps watching: mSPRT on log interactivity, read as
its confidence sequence.

Why this one. Tuned against stock is a question about a ratio of interactivities (tokens/s/user),
so the statistic is the difference of mean log interactivity between the arms (the log of the
ratio of their geometric means); per request it is roughly normal on the log scale, the effect-size
floor of a replay verdict is a band on the same scale, and the paired (shadow) and unpaired
(canary) cases differ only in the estimate and its variance. For an estimate D with variance v, the
normal-mixture likelihood ratio of Johari, Pekelis and Walsh (mSPRT, "Peeking at A/B tests",
KDD 2017), with a N(0, tau2) mixture over the effect,

    L = sqrt(v / (v + tau2)) * exp(D^2 tau2 / (2 v (v + tau2)))

is a (nonnegative super)martingale under "no effect", so by Ville's inequality P(ever L >= 1/alpha)
<= alpha however often it is read: the always-valid p-value is min(1, 1/max L). Inverted, it is the
normal-mixture confidence sequence (Robbins; Howard et al., Ann. Stat. 2021)

    D +- sqrt(v (v + tau2) / tau2 * log((v + tau2) / (v alpha^2)))

which covers the true difference at every look at once. Variances are estimated from the data
(plug-in), which makes the guarantee asymptotic (Waudby-Smith et al., "Time-uniform central limit
theory and asymptotic confidence sequences", 2021); lab/bench/live_judge_sim.py measures the
false-alarm rate it reaches on recorded requests. A confidence sequence for a quantile ratio
(Howard & Ramdas 2022) needs no normality but is wider at these sample sizes and does not pair as
simply; the mean of logs is what a per-request ratio already is.

Pure arithmetic: no I/O, no numpy (the monitor imports it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kimictl.runtime.verdict.common import DEFAULT_FLOOR, log_band, mean_var

__all__ = [
    "ALPHA",
    "BETTER",
    "COLLECTING",
    "MOVED",
    "NO_DIFFERENCE",
    "WORSE",
    "Watch",
    "MIN_PER_ARM",
    "PLANNED_N",
    "LogRatioSummary",
    "Interval",
    "confidence_sequence",
    "fixed_n_interval",
    "mixture_variance",
    "msprt_p",
    "paired_estimate",
    "two_sample_estimate",
]

ALPHA = 0.05
MIN_PER_ARM = 20  # below this many requests in an arm, the plug-in variance is not to be trusted
# The mixture is tuned so the sequence is tightest when each arm has this many requests (a few
# minutes of one replica's traffic): earlier and later looks are valid, only a little wider.
PLANNED_N = 400


@dataclass(frozen=True, slots=True)
class LogRatioSummary:
    """A mean/variance summary of a log ratio (tuned over stock): the estimate and its variance
    (the normal approximation the mSPRT reads; paired.BootstrapEstimate is the replay's bootstrap
    interval instead); `n` = requests (or pairs)."""

    value: float
    variance: float
    n: int


@dataclass(frozen=True, slots=True)
class Interval:
    """A confidence interval (or sequence, at one look) on the log ratio."""

    estimate: float
    lo: float
    hi: float

    @property
    def ratio(self) -> float:
        return math.exp(self.estimate)

    @property
    def ratio_ci(self) -> tuple[float, float]:
        return math.exp(self.lo), math.exp(self.hi)


def paired_estimate(log_ratios: Sequence[float]) -> LogRatioSummary | None:
    """Shadow: one log ratio per request id (tuned / stock of the same request)."""
    if len(log_ratios) < 2:
        return None
    mean, var = mean_var(log_ratios)
    return LogRatioSummary(mean, var / len(log_ratios), len(log_ratios))


def two_sample_estimate(tuned: Sequence[float], stock: Sequence[float]) -> LogRatioSummary | None:
    """Canary without strata: mean log interactivity of tuned minus that of stock."""
    if len(tuned) < 2 or len(stock) < 2:
        return None
    mt, vt = mean_var(tuned)
    ms, vs = mean_var(stock)
    return LogRatioSummary(mt - ms, vt / len(tuned) + vs / len(stock), min(len(tuned), len(stock)))


def _best_ratio(alpha: float) -> float:
    """r = tau2 / v minimising the half-width sqrt(v (1 + r) / r * log((1 + r) / alpha^2)) at a
    given v (a constant of alpha: one golden-section search on log r)."""

    def width2(log_r: float) -> float:
        r = math.exp(log_r)
        return (1 + r) / r * math.log((1 + r) / alpha**2)

    a, b = math.log(1e-3), math.log(1e4)
    g = (math.sqrt(5) - 1) / 2
    for _ in range(80):
        c, d = b - g * (b - a), a + g * (b - a)
        if width2(c) < width2(d):
            b = d
        else:
            a = c
    return math.exp((a + b) / 2)


def mixture_variance(
    est: LogRatioSummary, *, planned_n: int = PLANNED_N, alpha: float = ALPHA
) -> float:
    """tau2 of the mixture: the one that makes the sequence tightest when the estimate's variance
    is what it will be at `planned_n` requests (v scales as 1/n)."""
    v_planned = est.variance * est.n / planned_n
    return _best_ratio(alpha) * v_planned


def msprt_p(est: LogRatioSummary, *, tau2: float) -> float:
    """One look's likelihood-ratio p-value, 1/L (the always-valid p is the running minimum)."""
    v = est.variance
    if not (v > 0 and math.isfinite(v)):
        return 1.0
    log_l = 0.5 * math.log(v / (v + tau2)) + est.value**2 * tau2 / (2 * v * (v + tau2))
    return 1.0 if log_l <= 0 else math.exp(-log_l)


def confidence_sequence(
    est: LogRatioSummary, *, alpha: float = ALPHA, planned_n: int = PLANNED_N
) -> Interval:
    """The normal-mixture confidence sequence at this look (valid at all looks at once)."""
    v = est.variance
    if not (v > 0 and math.isfinite(v)):
        return Interval(est.value, -math.inf, math.inf)
    tau2 = mixture_variance(est, planned_n=planned_n, alpha=alpha)
    half = math.sqrt(v * (v + tau2) / tau2 * math.log((v + tau2) / (v * alpha**2)))
    return Interval(est.value, est.value - half, est.value + half)


def fixed_n_interval(est: LogRatioSummary, *, alpha: float = ALPHA) -> Interval:
    """The textbook fixed-sample (Welch / z) interval: valid at one look chosen in advance only.
    Kept to show what peeking does to it (lab/bench/live_judge_sim.py)."""
    v = est.variance
    if not (v > 0 and math.isfinite(v)):
        return Interval(est.value, -math.inf, math.inf)
    z = _z(1 - alpha / 2)
    half = z * math.sqrt(v)
    return Interval(est.value, est.value - half, est.value + half)


def _z(p: float) -> float:
    """The standard normal quantile (bisection on erfc; enough for a critical value)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(-mid / math.sqrt(2)) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# --- a watched judgement -------------------------------------------------------------------------
COLLECTING = "collecting"
NO_DIFFERENCE = "no practical difference"
BETTER = "tuned better"
WORSE = "tuned worse"
MOVED = "moved"  # the running intersection became empty: the difference changed under watch


@dataclass
class Watch:
    """One judgement read at every look: the running intersection of the confidence sequence
    (an intersection of a confidence sequence is one too, so it only narrows), and the state it
    gives against the effect-size floor, with when that state was first reached.

    States: collecting (too few requests, or the interval still spans a practical difference and
    no difference); no practical difference (inside +-floor); tuned better / tuned worse (the
    interval excludes 1 and reaches past the floor); moved (the difference changed under watch:
    restart the judge)."""

    floor: float = DEFAULT_FLOOR  # the replay verdict's floor too (verdict.common)
    alpha: float = ALPHA
    planned_n: int = PLANNED_N
    min_n: int = MIN_PER_ARM
    fixed_n: bool = False  # the fixed-sample interval instead (for the simulation only)
    lo: float = -math.inf
    hi: float = math.inf
    state: str = COLLECTING
    since: float | None = None
    last: Interval | None = None

    def look(self, est: LogRatioSummary | None, now: float) -> str:
        if est is None or est.n < self.min_n:
            return self._enter(COLLECTING, now)
        if self.fixed_n:
            iv = fixed_n_interval(est, alpha=self.alpha)
            self.lo, self.hi = iv.lo, iv.hi
        else:
            iv = confidence_sequence(est, alpha=self.alpha, planned_n=self.planned_n)
            self.lo, self.hi = max(self.lo, iv.lo), min(self.hi, iv.hi)
        self.last = iv
        band = log_band(self.floor)
        if self.lo > self.hi:
            return self._enter(MOVED, now)
        if -band < self.lo and self.hi < band:
            return self._enter(NO_DIFFERENCE, now)
        if self.lo > 0 and self.hi >= band:
            return self._enter(BETTER, now)
        if self.hi < 0 and self.lo <= -band:
            return self._enter(WORSE, now)
        return self._enter(COLLECTING, now)

    def block(self, state: str, now: float) -> str:
        """A state decided outside the interval (SRM): no verdict at this look."""
        return self._enter(state, now)

    def _enter(self, state: str, now: float) -> str:
        if state != self.state or self.since is None:
            self.state, self.since = state, now
        return state

    def to_json(self) -> dict[str, object]:
        finite = math.isfinite(self.lo) and math.isfinite(self.hi)
        return {
            "state": self.state,
            "since": self.since,
            "ratio": None if self.last is None else self.last.ratio,
            "ci": [math.exp(self.lo), math.exp(self.hi)] if finite else None,
            "floor": self.floor,
            "alpha": self.alpha,
            "method": "fixed-n z interval" if self.fixed_n else "mSPRT normal-mixture CS",
        }
