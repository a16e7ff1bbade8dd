"""The A/B verdict: one primary metric tested alone, the secondary metrics as one Holm family.

An A/A comparison (both sides drawn from one distribution) is the independent truth: any "better"
there is a false alarm, and the rule must keep their rate at its stated level (the full study with
real requests: lab/bench/ab_false_alarms.py)."""

from __future__ import annotations

import random

import pytest

from kimictl.runtime.load.ab import ALPHA, HEADLINE, NOT_DISTINGUISHABLE, compare, holm
from kimictl.runtime.load.records import RequestRecord
from kimictl.runtime.load.summary import summarize


def _record(target: str, i: int, *, ttft: float, gap: float, n: int, repeat: int = 0):
    chunks = [ttft + k * gap for k in range(n)]
    r = RequestRecord(
        target=target,
        point="c=1",
        repeat=repeat,
        index=i,
        warmup=False,
        session=0,
        turn=0,
        input_len=20,
        output_len=n,
        start=float(i),
    )
    r.ttft, r.latency, r.chunk_times, r.chunk_tokens = chunks[0], chunks[-1], chunks, [1] * n
    r.output_tokens, r.prompt_tokens, r.status, r.ok = n, 21, 200, True
    return r


def _aa(seed: int, n: int = 40, scale_b: float = 1.0) -> list[RequestRecord]:
    """n requests a side from ONE distribution (B's gaps times `scale_b`)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        for t, k in (("a", 1.0), ("b", scale_b)):
            ttft, gap = rng.lognormvariate(-2, 0.6), 0.01 * rng.lognormvariate(0, 0.3)
            out.append(_record(t, i, ttft=ttft, gap=gap * k, n=rng.randint(4, 40)))
    return out


def _summaries(records: list[RequestRecord]) -> list[dict]:
    return [
        summarize(
            [r for r in records if r.target == t and r.repeat == rep],
            window=(0, 60),
            extras={"target": t, "point": "c=1", "repeat": rep},
        )
        for rep in sorted({r.repeat for r in records})
        for t in ("a", "b")
    ]


def test_one_distribution_yields_no_better_where_the_per_metric_rule_flagged_two() -> None:
    # seed 13: each metric's own 95% interval excluded 1 for TTFT p99 (the max of 40 requests)
    # and E2E latency mean; with 13 metrics a side some such interval is expected by chance
    records = _aa(13)
    rows = compare(_summaries(records), records, a="a", b="b", seed=0)
    assert [r["metric"] for r in rows if r["better"]] == []
    head = next(r for r in rows if r["role"] == "primary")
    assert head["metric"] == HEADLINE and head["verdict"] == NOT_DISTINGUISHABLE
    e2e = next(r for r in rows if r["metric"] == "E2E latency mean ms")
    assert e2e["p"] < ALPHA <= e2e["p_adjusted"]  # significant alone, not in the family
    ttft99 = next(r for r in rows if r["metric"] == "TTFT p99 ms")
    assert ttft99["ci95"] is None and ttft99["better"] is None  # 40 requests: no p99 interval


def test_a_real_difference_is_still_found_in_the_family() -> None:
    records = _aa(13, scale_b=1.5)  # B decodes 1.5x slower per token
    rows = compare(_summaries(records), records, a="a", b="b", seed=0)
    by = {r["metric"]: r for r in rows}
    assert by[HEADLINE]["verdict"] == "faster" and by[HEADLINE]["better"] == "a"
    assert by["TPOT mean ms"]["better"] == "a" and by["TPOT mean ms"]["p_adjusted"] < ALPHA
    assert by["TTFT mean ms"]["better"] is None  # TTFT did not change


def test_primary_is_tested_alone_and_carries_the_verdict() -> None:
    records = _aa(5, scale_b=1.3)
    p10 = "interactivity p10 (slow tail) tok/s/user"
    rows = compare(_summaries(records), records, a="a", b="b", primary=p10, seed=0)
    roles = {r["metric"]: r["role"] for r in rows}
    assert roles[p10] == "primary" and roles[HEADLINE] == "secondary"
    head = next(r for r in rows if r["role"] == "primary")
    assert head["p_adjusted"] == head["p"] and "verdict" in head


def test_run_level_metrics_with_two_repeats_are_never_flagged() -> None:
    # 2 vs 2 repeats: 6 ways to split four values, so no permutation p is below 1/3
    records = [
        _record(t, i, ttft=0.1, gap=0.01 * (1.0 + 0.2 * rep), n=10, repeat=rep)
        for rep in (0, 1)
        for i in range(12)
        for t in ("a", "b")
    ]
    summaries = _summaries(records)
    for s in summaries:  # A's throughput higher in both repeats
        s["output_throughput"] *= 2.0 if s["kimictl"]["target"] == "a" else 1.0
    rows = compare(summaries, records, a="a", b="b", seed=0)
    tput = next(r for r in rows if r["metric"] == "output tokens/s")
    assert tput["ci95"] == [2.0, 2.0]  # the bootstrap of two values: no spread
    assert tput["p"] == pytest.approx(1 / 3, abs=1e-4) and tput["better"] is None


@pytest.mark.parametrize(
    ("ps", "adjusted"),
    [
        ({"x": 0.01, "y": 0.04, "z": 0.03}, {"x": 0.03, "y": 0.06, "z": 0.06}),
        ({"x": 0.5}, {"x": 0.5}),
        ({"x": 0.3, "y": 0.3}, {"x": 0.6, "y": 0.6}),
    ],
)
def test_holm_matches_the_step_down_by_hand(ps: dict, adjusted: dict) -> None:
    assert holm(ps) == pytest.approx(adjusted)


def test_plots_start_at_zero_and_show_the_ab_intervals(tmp_path, monkeypatch) -> None:
    """A 5% difference must look like 5%: every magnitude axis starts at 0, and ab.png draws each
    ratio with its interval (read from the figures as they are saved)."""
    from matplotlib.figure import Figure

    from kimictl.runtime.load.exports import write_plots

    saved: list[list] = []  # in the order the figures are saved (the order of the files)
    real = Figure.savefig

    def spy(fig, target, *args, **kwargs):  # type: ignore[no-untyped-def]
        saved.append([(ax.get_xlim(), ax.get_ylim(), ax) for ax in fig.axes])
        return real(fig, target, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    records = _aa(13, n=30, scale_b=1.05)
    summaries = _summaries(records)
    rows = compare(summaries, records, a="a", b="b", seed=0)
    files = write_plots(summaries, records, tmp_path / "p", ab=rows)
    assert {f.name for f in files} >= {"pareto.png", "ab.png"}
    seen = {f.name: axes for f, axes in zip(files, saved, strict=True)}
    ((xlim, ylim, _),) = seen["pareto.png"]
    assert xlim[0] == 0 and ylim[0] == 0
    assert all(x[0] == 0 for x, _, _ in seen["latency_cdf.png"])
    assert seen["throughput_time.png"][0][1][0] == 0
    ((xlim, _, ax),) = seen["ab.png"]
    assert xlim[0] == 0 and xlim[1] > 1
    with_interval = [r for r in rows if r["point"] == "c=1" and r["ratio"] and r["ci95"]]
    bars = [c for c in ax.collections if len(c.get_segments()) == 1]  # one error bar per ratio
    assert len(bars) == len(with_interval) >= 5


def _in_turns(records: list[RequestRecord], per_turn: int, slow: dict[tuple[str, int], float]):
    """The records as an A/B schedule ran them: `per_turn` requests a turn (part 1, 2, ...), and
    a turn in `slow` had the machine loaded (every gap of it times the factor)."""
    for r in records:
        r.part = r.index // per_turn + 1
        k = slow.get((r.target, r.part), 1.0)
        if k != 1.0:
            base = r.chunk_times[0]
            r.chunk_times = [base + (t - base) * k for t in r.chunk_times]
            r.latency = r.chunk_times[-1]
    return records


def test_a_load_burst_over_one_turn_is_not_a_difference_between_the_servers() -> None:
    """A/A where the machine was busy during one of A's two turns: one by one, A's requests of
    that turn look slower (the request-level test flags it), but it is one turn: shuffling whole
    turns, 2 a side can never reject (6 splits)."""
    records = _in_turns(_aa(5, n=40), per_turn=20, slow={("a", 1): 2.5})
    rows = compare(_summaries(records), records, a="a", b="b", seed=1)
    head = next(r for r in rows if r["metric"] == HEADLINE)
    assert head["ratio"] < 0.8  # A reads slower...
    assert head["p"] > 0.3 and head["verdict"] == NOT_DISTINGUISHABLE  # ...in one turn only
    assert not [r["metric"] for r in rows if r["better"]]
    for r in records:  # the same requests not taken in turns: each its own unit, A is flagged
        r.part = 0
    rows = compare(_summaries(records), records, a="a", b="b", seed=1)
    assert next(r for r in rows if r["metric"] == HEADLINE)["verdict"] == "slower"


def test_a_real_difference_is_found_over_many_turns() -> None:
    records = _in_turns(_aa(6, n=40, scale_b=2.0), per_turn=5, slow={("b", 3): 1.5})
    rows = compare(_summaries(records), records, a="a", b="b", seed=1)
    head = next(r for r in rows if r["metric"] == HEADLINE)
    assert head["verdict"] == "faster" and head["p"] < 0.01  # 8 turns a side


def test_a_single_run_verdict_says_it_is_one_run_and_what_repeat_gives(capsys) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from kimictl.commands._render import render_ab
    from kimictl.runtime.load.ab import AA_FALSE_CALLS, single_run_caveat
    from kimictl.runtime.load.bench import BenchOutcome
    from kimictl.runtime.load.records import RecordList

    records = _aa(13, scale_b=1.5)
    summaries = _summaries(records)
    rows = compare(summaries, records, a="a", b="b", seed=0)
    kept = RecordList()
    kept.extend(records)
    render_ab(BenchOutcome(kept, summaries, rows, None))
    out = " ".join(capsys.readouterr().out.split())
    assert "verdict at c=1" in out and "a is faster" in out
    assert "note: one run: two identical servers got such a call in 1 of 20 A/A runs" in out
    assert "`--repeat 3` runs the point 3 times" in out
    # the figure is the docs/results.md row's, not a number of its own
    calls, runs, low, high = AA_FALSE_CALLS
    results = (Path(__file__).parent.parent / "docs" / "results.md").read_text()
    assert f"| {calls}/{runs} (Wilson 95 % {low:g}-{high:g} %)" in results
    assert single_run_caveat("faster", 3) is None
    assert single_run_caveat(NOT_DISTINGUISHABLE, 1) is None
