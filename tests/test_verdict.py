"""The paired verdict (runtime.verdict.paired) on synthetic per-request data with known shifts:
the decision, the interval covering the true ratio, the floor, rows needed, sessions, mix."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from kimictl.runtime.verdict.paired import (
    BETTER,
    INCONCLUSIVE,
    MIN_AA_PASSES,
    SAME,
    WORSE,
    aa_calibration,
    decide,
    noise_floor,
    paired_verdict,
    quantile_ratio,
    rows_needed,
    wilson,
)


def pairs(n: int, shift: float, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-request interactivity of A (a mix of short and long requests) and of B on the same
    requests: A x shift x per-request noise."""
    rng = np.random.default_rng(seed)
    mix = np.where(rng.random(n) < 0.8, 40.0, 12.0)  # 80% fast short rows, 20% slow long rows
    a = mix * rng.lognormal(0, 0.2, n)
    b = a * shift * rng.lognormal(0, noise, n)
    return a, b


@pytest.mark.parametrize(
    ("shift", "expected"),
    [(1.10, BETTER), (0.90, WORSE), (1.0, SAME)],
)
def test_known_shifts_are_called_and_covered(shift: float, expected: str) -> None:
    a, b = pairs(600, shift, 0.05, seed=1)
    v = paired_verdict(np.log(b / a), floor=0.05)
    assert v.decision == expected
    assert v.lo <= shift <= v.hi
    assert v.rows == v.units == 600 and v.unit == "rows"
    assert v.rows_needed is None


def test_a_shift_below_the_floor_is_no_practical_difference_however_significant() -> None:
    a, b = pairs(4000, 1.02, 0.02, seed=2)
    v = paired_verdict(np.log(b / a), floor=0.05)
    assert v.lo > 1.0  # a test would call it significant
    assert v.decision == SAME


def test_few_noisy_rows_are_inconclusive_with_the_rows_that_would_settle_it() -> None:
    a, b = pairs(20, 1.08, 0.4, seed=3)
    v = paired_verdict(np.log(b / a), floor=0.05)
    assert v.decision == INCONCLUSIVE
    assert v.rows_needed is not None and v.rows_needed > 20
    # with that many rows of the same kind, the call is made
    a2, b2 = pairs(v.rows_needed * 2, 1.08, 0.4, seed=4)
    assert paired_verdict(np.log(b2 / a2), floor=0.05).decision == BETTER


def test_lower_is_better_metrics_decide_for_b_the_other_way() -> None:
    a, b = pairs(500, 0.85, 0.05, seed=5)  # B's TTFT 15% lower
    v = paired_verdict(np.log(b / a), higher_is_better=False, metric="ttft")
    assert v.decision == BETTER


def test_sessions_widen_the_interval_when_rows_of_a_session_move_together() -> None:
    rng = np.random.default_rng(6)
    sessions = np.repeat(np.arange(30), 20)
    per_session = rng.lognormal(0, 0.1, 30)[sessions]  # B's advantage varies by session
    a = rng.lognormal(3, 0.2, 600)
    b = a * 1.05 * per_session * rng.lognormal(0, 0.01, 600)
    by_row = paired_verdict(np.log(b / a))
    by_session = paired_verdict(np.log(b / a), clusters=list(sessions))
    assert by_session.unit == "sessions" and by_session.units == 30
    assert (by_session.hi - by_session.lo) > 2 * (by_row.hi - by_row.lo)
    # the sentence names the resampled unit only when it is not the row itself
    assert "over 600 rows (30 sessions)," in by_session.sentence()
    assert "over 600 rows, floor" in by_row.sentence()


def test_quantile_ratios_recover_a_scale_shift_whatever_the_mix() -> None:
    a, b = pairs(1000, 1.2, 0.0, seed=7)
    for p in (10, 50, 90):
        e = quantile_ratio(a, b, p)
        assert e.ratio == pytest.approx(1.2, rel=1e-9)
        assert e.lo <= 1.2 <= e.hi
    # unpaired, a B that served more of the slow long rows reads slower although it is faster
    rng = np.random.default_rng(8)
    heavy = np.where(rng.random(1000) < 0.5, 40.0, 12.0) * rng.lognormal(0, 0.2, 1000) * 1.2
    assert np.percentile(heavy, 50) / np.percentile(a, 50) < 1.0


def test_missing_figures_are_left_out_and_said() -> None:
    v = paired_verdict([0.1, math.nan, 0.12, math.inf, 0.11, 0.09])
    assert v.rows == 4
    assert any("2 rows" in n for n in v.notes)
    assert paired_verdict([0.1]).decision == INCONCLUSIVE


def test_aa_noise_floor_is_the_reach_of_its_interval() -> None:
    a, b = pairs(200, 1.0, 0.1, seed=9)
    aa = paired_verdict(np.log(b / a), aa=True)
    noise = noise_floor(aa)
    assert 0 < noise < 0.1
    assert aa.to_json()["noise_floor"] == noise
    assert noise == pytest.approx(math.expm1(max(-math.log(aa.lo), math.log(aa.hi))))


def test_decide_and_rows_needed() -> None:
    band = math.log1p(0.05)
    assert decide(0.01, 0.2, 0.3, 0.05) == BETTER
    assert decide(-0.3, -0.2, -0.01, 0.05) == WORSE
    assert decide(-band / 2, 0, band / 2, 0.05) == SAME
    assert decide(-0.1, 0.02, 0.2, 0.05) == INCONCLUSIVE
    assert rows_needed(-0.1, 0.1, 0.3, 0.05, 100) == 400  # half-width 0.2 -> 0.1: 4x rows


def test_wilson() -> None:
    lo, hi = wilson(0, 20)
    assert lo == 0 and 0.15 < hi < 0.17
    lo, hi = wilson(19, 20)
    assert 0.75 < lo < 0.77 and hi > 0.99


def replay_logs(
    n: int, shift: float, offset: float, rng: np.random.Generator, short: float = 0.8
) -> np.ndarray:
    """One replay's per-row log ratios: a mix of short and long rows (`short` of them fast; their
    own speeds cancel in the paired ratio), row noise, this replay's server-level `offset` on
    every row (what a row bootstrap cannot see), and B's true `shift`."""
    mix = np.where(rng.random(n) < short, 40.0, 12.0)
    a = mix * rng.lognormal(0, 0.2, n)
    b = a * shift * math.exp(offset) * rng.lognormal(0, 0.1, n)
    return np.log(b / a)


def calibrate(passes: int, rows: int, bias: float, tau: float, rng: np.random.Generator) -> Any:
    verdicts = [
        paired_verdict(replay_logs(rows, 1.0, bias + rng.normal(0, tau), rng), aa=True, n_boot=400)
        for _ in range(passes)
    ]
    return aa_calibration([v.raw_log for v in verdicts], [v.boot_var for v in verdicts])


def test_a_calibration_measures_the_offset_and_the_between_pass_spread() -> None:
    rng = np.random.default_rng(10)
    cal = calibrate(40, 60, bias=0.12, tau=0.2, rng=rng)
    assert cal.offset == pytest.approx(0.12, abs=0.08)
    assert math.sqrt(cal.between) == pytest.approx(0.2, rel=0.3)
    assert cal.within < cal.spread and cal.added_var > cal.between
    # no server-level spread: the passes' means vary only as their rows do
    assert calibrate(40, 60, bias=0.0, tau=0.0, rng=rng).between < 0.002
    with pytest.raises(ValueError, match="needs 3"):
        aa_calibration([0.1, 0.2], [0.01, 0.01])
    assert MIN_AA_PASSES == 3


def test_calibrated_false_alarms_stay_near_5_percent_where_a_row_bootstrap_fails() -> None:
    """A/A replays whose instances differ by a per-replay offset (sd 15%) and a fixed slot bias
    (B's slot 12% faster): a row bootstrap calls most of them; judged with a calibration of 8
    other A/A passes (a fresh one each time), about the nominal 5%, although the judged replays
    hold mostly long rows and the passes mostly short ones."""
    rng = np.random.default_rng(11)
    raw = calibrated = 0
    runs = 200
    for _ in range(runs):
        cal = calibrate(8, 16, bias=0.12, tau=0.15, rng=rng)
        logs = replay_logs(16, 1.0, 0.12 + rng.normal(0, 0.15), rng, short=0.2)
        raw += paired_verdict(logs, n_boot=400).decision in (BETTER, WORSE)
        judged = paired_verdict(logs, n_boot=400, calibration=cal)
        calibrated += judged.decision in (BETTER, WORSE)
    assert raw / runs > 0.5
    assert calibrated / runs <= 0.08


def test_a_calibrated_verdict_detects_a_slower_b_and_covers_its_true_ratio() -> None:
    """B 2x slower on the same noisy path, rows in another mix than the A/A passes had: called
    worse in nearly every replay, the interval (net of the slot bias) holding 0.5 mostly."""
    rng = np.random.default_rng(12)
    worse = covered = 0
    for _ in range(100):
        cal = calibrate(8, 16, bias=0.12, tau=0.15, rng=rng)
        logs = replay_logs(16, 0.5, 0.12 + rng.normal(0, 0.15), rng, short=0.2)
        v = paired_verdict(logs, n_boot=400, calibration=cal)
        worse += v.decision == WORSE
        covered += v.lo <= 0.5 <= v.hi
        assert v.raw_log - v.calibration.offset == pytest.approx(math.log(v.ratio))
    assert worse >= 90 and covered >= 90


def test_a_calibration_that_cannot_be_beaten_by_rows_needs_no_rows() -> None:
    rng = np.random.default_rng(13)
    cal = calibrate(5, 16, bias=0.0, tau=0.3, rng=rng)
    v = paired_verdict(replay_logs(400, 1.06, 0.0, rng), calibration=cal)
    assert v.decision == INCONCLUSIVE and v.rows_needed is None  # the spread is between passes
    assert "net of 5 A/A passes" in v.sentence()
    assert v.to_json()["calibration"]["passes"] == 5
