"""The observer-effect A/B's bookkeeping (lab/bench/observer_effect.py) on recorded runs: what it
pools, and how it splits a block's requests and the server's own view. No server needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab" / "bench"))
from observer_effect import _ttft_near, ab_from_dumps, server_means

RUNS = Path(__file__).resolve().parent / "fixtures" / "observer_ab"


def test_server_means_are_per_request_over_the_block() -> None:
    before = {"server_ttft": (1.0, 10.0), "server_prefill": (0.5, 10.0)}
    after = {"server_ttft": (1.1, 14.0), "server_prefill": (0.56, 14.0)}
    got = server_means(before, after)
    assert got["server_ttft_mean_ms"] == pytest.approx(25.0)
    assert got["server_prefill_mean_ms"] == pytest.approx(15.0)
    # no request finished in between: no division by zero, a zero mean
    assert server_means(after, after)["server_ttft_mean_ms"] == 0.0


def test_ttft_split_by_overlap_with_a_scrape() -> None:
    blocks = {
        # request 1 (10.000-10.020) meets the scrape at 10.010; request 2 is clear of it
        "on": [{"ttft_windows": [(10.000, 10.020), (10.500, 10.530)]}],
        "off": [{"ttft_windows": [(20.0, 20.025)]}],
    }
    got = _ttft_near(blocks, [(10.010, 10.015)], interval=1.0)
    assert got["on_overlapping_scrape"]["count"] == 1
    assert got["on_overlapping_scrape"]["mean_ms"] == pytest.approx(20.0)
    assert got["on_clear_of_scrapes"]["count"] == 1
    assert got["on_clear_of_scrapes"]["mean_ms"] == pytest.approx(30.0)
    # the control moves the span half an interval later, onto request 2
    assert got["control_half_interval_later"]["mean_ms"] == pytest.approx(30.0)
    assert got["off"]["mean_ms"] == pytest.approx(25.0)


def test_pooling_keeps_only_the_figures_every_dump_has() -> None:
    """run7 predates the server's own view and the first/later split; run14 has both."""
    new = ab_from_dumps([RUNS / "run14.blocks.jsonl"])["on_over_off"]
    assert {"server_ttft_mean_ms", "ttft_first_ms", "tpot_p50_ms"} <= set(new)
    mixed = ab_from_dumps([RUNS / "run7.blocks.jsonl", RUNS / "run14.blocks.jsonl"])
    assert "server_ttft_mean_ms" not in mixed["on_over_off"]
    assert mixed["on_over_off"]["tpot_p50_ms"]["n"] == mixed["pairs"] == 37 + 45
    # and an A/A control without those figures nets only the shared ones
    net = ab_from_dumps([RUNS / "run14.blocks.jsonl"], [RUNS / "null2.blocks.jsonl"])
    assert "server_ttft_mean_ms" not in net["net_of_null"]
    assert net["net_of_null"]["tpot_p50_ms"]["n_ab"] == 45
