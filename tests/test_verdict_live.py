"""The live judge's statistics (runtime.verdict.sequential, .strata) and the judge itself
(runtime.observe.judge) on spans with known shifts."""

from __future__ import annotations

import math
import random

import pytest

from kimictl.core.errors import InputError
from kimictl.runtime.observe.judge import CANARY, SHADOW, Arm, LiveJudge, state_line
from kimictl.runtime.observe.otlp import TracedRequest, TraceStore
from kimictl.runtime.verdict import sequential as seq
from kimictl.runtime.verdict.strata import Shaped, srm_check, stratified_estimate, stratum_of


def _logs(rng: random.Random, n: int, shift: float = 0.0) -> list[float]:
    return [math.log(20.0) + shift + rng.gauss(0, 0.3) for _ in range(n)]


def test_cs_is_wider_than_fixed_n_and_both_cover_the_truth() -> None:
    rng = random.Random(1)
    est = seq.two_sample_estimate(_logs(rng, 400, 0.1), _logs(rng, 400))
    assert est is not None
    cs, fixed = seq.confidence_sequence(est), seq.fixed_n_interval(est)
    assert cs.lo < fixed.lo < 0.1 < fixed.hi < cs.hi
    # at the planned n the sequence costs about 1.7-2.2x the fixed-n half-width, not orders more
    assert 1.5 < (cs.hi - cs.lo) / (fixed.hi - fixed.lo) < 2.5


def test_msprt_p_matches_the_sequence() -> None:
    """1/L < alpha exactly when the confidence sequence excludes 0 (the same boundary)."""
    rng = random.Random(2)
    for shift in (0.0, 0.02, 0.05, 0.08, 0.2):
        est = seq.two_sample_estimate(_logs(rng, 300, shift), _logs(rng, 300))
        assert est is not None
        tau2 = seq.mixture_variance(est)
        cs = seq.confidence_sequence(est)
        assert (seq.msprt_p(est, tau2=tau2) < seq.ALPHA) == (cs.lo > 0 or cs.hi < 0)


@pytest.mark.parametrize(("shift", "state"), [(0.15, seq.BETTER), (-0.15, seq.WORSE)])
def test_watch_detects_a_known_shift(shift: float, state: str) -> None:
    rng = random.Random(3)
    watch = seq.Watch()
    a: list[float] = []
    b: list[float] = []
    for step in range(400):
        a.append(math.log(20.0) + shift + rng.gauss(0, 0.3))
        b.append(math.log(20.0) + rng.gauss(0, 0.3))
        watch.look(seq.two_sample_estimate(a, b), float(step))
    assert watch.state == state
    assert watch.since is not None and watch.since < 300  # decided well before the end
    lo, hi = watch.to_json()["ci"]  # type: ignore[misc]
    assert lo < math.exp(shift) < hi


def test_watch_says_no_practical_difference_when_equal() -> None:
    rng = random.Random(4)
    watch = seq.Watch(floor=0.05)
    a = _logs(rng, 3000)
    b = _logs(rng, 3000)
    for n in range(50, 3001, 50):
        watch.look(seq.two_sample_estimate(a[:n], b[:n]), float(n))
    assert watch.state == seq.NO_DIFFERENCE


def test_peeking_breaks_fixed_n_but_not_the_sequence() -> None:
    """200 A/A runs peeked every 10 requests: fixed-n alarms far above alpha, mSPRT under it."""
    rng = random.Random(5)
    alarms = {False: 0, True: 0}
    for _ in range(200):
        a = _logs(rng, 600)
        b = _logs(rng, 600)
        for fixed in (False, True):
            w = seq.Watch(fixed_n=fixed, floor=0.0)
            for n in range(20, 601, 10):
                if w.look(seq.two_sample_estimate(a[:n], b[:n]), n) in (seq.BETTER, seq.WORSE):
                    alarms[fixed] += 1
                    break
    assert alarms[True] / 200 > 0.15
    assert alarms[False] / 200 < 0.05


def test_srm_flags_a_wrong_weight_and_passes_the_right_one() -> None:
    assert not srm_check({"tuned": 52, "stock": 48}, {"tuned": 50, "stock": 50}).mismatch
    assert srm_check({"tuned": 90, "stock": 10}, {"tuned": 50, "stock": 50}).mismatch
    assert not srm_check({"tuned": 12, "stock": 88}, {"tuned": 10, "stock": 90}).mismatch
    # chi2 = 20**2/50*2 = 16 -> p = erfc(sqrt(8)) = 6.3e-5
    check = srm_check({"tuned": 70, "stock": 30}, {"tuned": 1, "stock": 1})
    assert check.chi2 == pytest.approx(16.0)
    assert check.p == pytest.approx(6.334e-5, rel=1e-3)
    assert srm_check({"a": 3, "b": 0}, {"a": 100, "b": 0}).p == 1.0  # 100% mirrored, none missing
    assert srm_check({"a": 3, "b": 1}, {"a": 100, "b": 0}).mismatch


def test_strata_remove_a_mix_difference() -> None:
    """Same speed per shape, but tuned got the long answers (faster per token here): the plain
    difference sees a speed-up, the stratified one does not."""
    rng = random.Random(6)

    def rows(n: int, long_share: float) -> list[Shaped]:
        out = []
        for _ in range(n):
            long = rng.random() < long_share
            base = math.log(30.0 if long else 15.0)
            out.append(Shaped(base + rng.gauss(0, 0.1), 256, 512 if long else 32))
        return out

    tuned, stock = rows(400, 0.8), rows(400, 0.2)
    plain = seq.two_sample_estimate(
        [r.log_interactivity for r in tuned], [r.log_interactivity for r in stock]
    )
    strat, coverage = stratified_estimate(tuned, stock)
    assert plain is not None and strat is not None
    assert plain.value > 0.3
    assert abs(strat.value) < 0.03
    assert coverage == 1.0
    assert stratum_of(256, 512) == (8, 9) and stratum_of(0, 1) == (0, 0)


def _span(server: str, rid: str, t: float, tpot: float, out: int = 64) -> TracedRequest:
    return TracedRequest(
        server=server,
        finished_at=t,
        ttft_s=0.05,
        e2e_s=0.05 + tpot * (out - 1),
        queue_s=0.0,
        decode_s=tpot * (out - 1),
        prompt_tokens=128,
        output_tokens=out,
        request_id=rid,
    )


TUNED = Arm("tuned", "http://127.0.0.1:8101")
STOCK = Arm("stock", "http://127.0.0.1:8102")


def test_canary_judge_decides_and_blocks_on_srm() -> None:
    rng, split = random.Random(7), random.Random(70)
    store = TraceStore(keep_s=1e9)
    judge = LiveJudge(mode=CANARY, pct=50, tuned=TUNED, stock=STOCK, started_at=-1.0)
    for i in range(600):
        tuned = split.random() < 0.5
        tpot = 0.05 * math.exp(rng.gauss(0, 0.2)) / (1.3 if tuned else 1.0)
        server = "127.0.0.1:8101" if tuned else "127.0.0.1:8102"
        store.add([_span(server, f"cmpl-{i}-0", float(i), tpot)], now=float(i))
        store.add([_span(server, "probe", float(i), tpot, out=1)], now=float(i))  # no TPOT
        doc = judge.look(store, now=float(i) + 0.5)
    assert doc["state"] == seq.BETTER and doc["srm"]["mismatch"] is False
    assert doc["arms"]["tuned"]["n"] + doc["arms"]["stock"]["n"] == 600
    assert 1.2 < doc["ratio"] < 1.4 and doc["ci"][0] > 1.0
    assert "tuned better" in state_line(doc)
    # the same traffic judged against a 10% weight: SRM, no verdict
    wrong = LiveJudge(mode=CANARY, pct=10, tuned=TUNED, stock=STOCK, started_at=0.0)
    doc = wrong.look(store, now=600.0)
    assert doc["state"] == "SRM" and doc["srm"]["mismatch"]
    assert state_line(doc).startswith("SRM:")


def test_shadow_judge_pairs_by_id_and_names_unknown_servers() -> None:
    rng = random.Random(8)
    store = TraceStore(keep_s=1e9)
    judge = LiveJudge(mode=SHADOW, pct=100, tuned=TUNED, stock=STOCK, started_at=-1.0)
    for i in range(300):
        tpot = 0.05 * math.exp(rng.gauss(0, 0.3))  # request-to-request spread, shared by the pair
        rid = f"cmpl-kp{i}-0"
        store.add([_span("127.0.0.1:8102", rid, float(i), tpot)], now=float(i))
        store.add([_span("127.0.0.1:8101", rid, i + 0.2, tpot * 0.97)], now=float(i))
    store.add([_span("10.0.0.9:9000", "x", 299.0, 0.05)], now=299.0)
    doc = judge.look(store, now=300.0)
    assert doc["pairs"] == 300 and doc["unpaired_mirrors"] == 0
    assert doc["srm"]["mismatch"] is False
    assert doc["ratio"] == pytest.approx(1 / 0.97, rel=1e-6)
    assert doc["unknown_servers"] == ["10.0.0.9:9000"]
    assert "unknown servers" in state_line(doc)


@pytest.mark.parametrize(("mode", "pct"), [(CANARY, 0), (CANARY, 100), (SHADOW, 0), (SHADOW, 101)])
def test_judge_refuses_percentages_out_of_range(mode: str, pct: float) -> None:
    with pytest.raises(InputError, match="out of range"):
        LiveJudge(mode=mode, pct=pct, tuned=TUNED, stock=STOCK)


def test_the_screen_and_the_snapshot_carry_the_judge() -> None:
    from kimictl.runtime.observe.poller import monitor_snapshot
    from kimictl.tui.rows import judge_lines

    store = TraceStore(keep_s=1e9)
    for i in range(40):
        server = "127.0.0.1:8101" if i % 4 == 0 else "127.0.0.1:8102"
        store.add([_span(server, f"cmpl-{i}-0", float(i), 0.05)], now=float(i))
    doc = LiveJudge(mode=CANARY, pct=25, tuned=TUNED, stock=STOCK, started_at=-1.0).look(
        store, now=40.0
    )
    tuned, stock, state = judge_lines(doc)
    assert tuned.startswith("tuned  share 25%  n 10  interactivity p10/p50/p90 20.0/20.0/20.0")
    assert stock.startswith("stock  share 75%  n 30")
    assert state.startswith("canary 25%: collecting")  # 10 < 20 requests on tuned
    snap = monitor_snapshot([], window_s=10.0, judge=doc)
    assert snap["judge"]["arms"]["tuned"]["n"] == 10
    assert judge_lines(None) == []


def test_monitor_refuses_a_judge_it_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    """Bad input of the live judge through the CLI: one `error:` line, exit 2, before it polls."""
    from kimictl.cli import main

    pair = ["tuned=http://127.0.0.1:9", "stock=http://127.0.0.1:10", "--once", "--json"]
    cases = [
        (["--canary", "10", "--shadow", "5"], "--canary and --shadow judge different set-ups"),
        (["--canary", "10", "--no-traces"], "--canary judges from per-request spans"),
        (["--canary", "150"], "--canary 150% is out of range"),
        (["--shadow", "0"], "--shadow 0% is out of range"),
    ]
    for args, message in cases:
        assert main(["monitor", *pair, *args]) == 2, args
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("error: ") and message in err, (args, err)
        assert "Traceback" not in err
