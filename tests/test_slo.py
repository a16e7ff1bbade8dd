"""SLO parsing (units, stats, errors that name the term) and evaluation."""

from __future__ import annotations

import pytest

from kimictl.core.errors import InputError
from kimictl.runtime.load.slo import parse_slo


def test_parse_the_documented_example() -> None:
    slo = parse_slo("interactivity_p10>=100,ttft_p99<=2000ms")
    a, b = slo.terms
    assert (a.metric, a.stat, a.op, a.value, a.key) == (
        "interactivity",
        "p10",
        ">=",
        100.0,
        "interactivity_p10",
    )
    assert (b.metric, b.stat, b.op, b.value, b.key) == ("ttft", "p99", "<=", 2000.0, "ttft_p99")
    assert a.percentile == 10.0 and b.unit == "ms"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("ttft_p99<=2s", 2000.0),
        ("tpot_mean<50", 50.0),
        ("itl_p99.9<=500us", 0.5),
        ("e2el_median <= 1.5 s", 1500.0),
    ],
)
def test_time_units_normalise_to_ms(text: str, value: float) -> None:
    (t,) = parse_slo(text).terms
    assert t.value == pytest.approx(value)


def test_run_level_terms() -> None:
    (t,) = parse_slo("output_throughput>=500tok/s").terms
    assert t.stat is None and t.key == "output_throughput" and t.value == 500


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("ttft<=2s", "needs a statistic"),
        ("output_throughput_p50>=1", "run-level"),
        ("latency_p50<=3", "unknown metric"),
        ("ttft_p99<=2min", "time unit"),
        ("ttft_p99=2", "is not METRIC_STAT"),
        ("", "has no term"),
        ("ttft_p120<=1", "between 0 and 100"),
    ],
)
def test_bad_terms_say_which_and_what_is_allowed(text: str, needle: str) -> None:
    with pytest.raises(InputError) as err:
        parse_slo(text)
    assert needle in err.value.message


def test_evaluate_and_request_ok() -> None:
    slo = parse_slo("interactivity_p10>=100,ttft_p99<=2000ms,output_throughput>=10")
    res = slo.evaluate({"interactivity_p10": 120.0, "ttft_p99": 2500.0, "output_throughput": 11})
    assert [r.met for r in res] == [True, False, True]
    assert not slo.met({"interactivity_p10": 120.0, "ttft_p99": 2500.0, "output_throughput": 11})
    assert slo.met({"interactivity_p10": 100.0, "ttft_p99": 2000.0, "output_throughput": 10})
    assert not slo.evaluate({})[0].met  # unmeasured is not met
    # per request: thresholds only on per-request metrics; a missing value does not fail
    assert slo.request_ok({"interactivity": 150.0, "ttft": 100.0})
    assert not slo.request_ok({"interactivity": 90.0, "ttft": 100.0})
    assert not slo.request_ok({"interactivity": 150.0, "ttft": 2001.0})
    assert slo.request_ok({"interactivity": None, "ttft": 10.0})
