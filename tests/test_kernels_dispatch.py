"""Dispatcher: the fastest measured kimictl kernel only when strictly faster than cuBLAS; cuBLAS for
every point nobody measured; the table round-trips through JSON; the committed H200 table obeys
the same rule at every grid point."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kimictl.kernels.dispatch import (
    K3_GEMM_SHAPES,
    DispatchTable,
    Measurement,
    geomean,
)

FIXTURES = Path(__file__).parent / "fixtures" / "kernels"


def _table(*ms: Measurement) -> DispatchTable:
    t = DispatchTable("NVIDIA H200", "sm_90a")
    for m in ms:
        t.add(m)
    return t


def test_faster_kernel_is_chosen_with_its_time():
    t = _table(Measurement(2112, 7168, 1, 12.9, {"a": 9.4, "b": 10.0}))
    c = t.choose(2112, 7168, 1)
    assert (c.provider, c.name, c.us) == ("kimictl", "a", 9.4)
    assert c.speedup == pytest.approx(12.9 / 9.4)


def test_kernel_slower_than_cublas_is_never_chosen():
    t = _table(Measurement(448, 7168, 8, 6.0, {"a": 6.5, "b": 7.0}))
    c = t.choose(448, 7168, 8)
    assert (c.provider, c.name, c.us) == ("cublas", "cublas", 6.0)
    assert "not faster" in c.reason


def test_a_tie_goes_to_cublas():
    c = _table(Measurement(896, 7168, 2, 6.0, {"a": 6.0})).choose(896, 7168, 2)
    assert c.provider == "cublas"


def test_unmeasured_point_falls_back_to_cublas_without_extrapolating():
    t = _table(Measurement(2112, 7168, 1, 12.9, {"a": 9.4}))
    for n, k, m in ((2112, 7168, 2), (2113, 7168, 1), (2112, 7168, 16)):
        c = t.choose(n, k, m)
        assert (c.provider, c.us) == ("cublas", None)
        assert "not measured" in c.reason


def test_residual_points_are_separate_from_plain_ones():
    t = _table(
        Measurement(7168, 1536, 1, 6.4, {"a": 5.0}),
        Measurement(7168, 1536, 1, 7.0, {"r": 6.9}, residual=True),
    )
    assert t.choose(7168, 1536, 1).name == "a"
    assert t.choose(7168, 1536, 1, residual=True).name == "r"


def test_non_finite_or_zero_kernel_times_are_ignored():
    t = _table(Measurement(896, 7168, 4, 6.0, {"nan": math.nan, "zero": 0.0, "inf": math.inf}))
    assert t.choose(896, 7168, 4).provider == "cublas"


def test_invalid_cublas_time_means_cublas_without_a_claimed_speedup():
    c = _table(Measurement(896, 7168, 4, math.nan, {"a": 1.0})).choose(896, 7168, 4)
    assert c.provider == "cublas" and c.speedup is None


times = st.floats(min_value=0.5, max_value=500.0, allow_nan=False)


@settings(deadline=None)  # the CI box is shared: wall-clock deadlines only add flakiness
@given(
    cublas=times,
    kernels=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), times, max_size=4),
    m=st.integers(min_value=1, max_value=64),
)
def test_choice_is_never_slower_than_cublas_and_is_the_minimum(cublas, kernels, m):
    t = _table(Measurement(2112, 7168, m, cublas, kernels))
    c = t.choose(2112, 7168, m)
    assert c.us is not None and c.us <= cublas
    assert c.us == min([cublas, *kernels.values()])
    assert (c.provider == "kimictl") == any(v < cublas for v in kernels.values())
    again = DispatchTable.from_json(json.loads(json.dumps(t.to_json())))
    assert again.choose(2112, 7168, m) == c


def test_save_and_load_round_trip(tmp_path: Path):
    t = _table(
        Measurement(2112, 7168, 1, 12.9, {"a": 9.4}),
        Measurement(7168, 1536, 8, 7.0, {"r": 6.9}, residual=True),
    )
    path = tmp_path / "sub" / "dispatch.json"
    t.save(path)
    loaded = DispatchTable.load(path)
    assert loaded.to_json()["entries"] == t.to_json()["entries"]
    assert not list(path.parent.glob("*.tmp"))


def test_geomean_ignores_non_positive_values():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([2.0, 8.0, 0.0, math.nan]) == pytest.approx(4.0)
    assert math.isnan(geomean([]))


def test_recorded_h200_table_never_dispatches_slower_than_cublas():
    path = FIXTURES / "bench_h200_table.json"
    if not path.is_file():
        pytest.skip("no recorded H200 dispatch table committed yet")
    table = DispatchTable.load(path)
    assert table.arch == "sm_90a"
    covered = 0
    for _, n, k in K3_GEMM_SHAPES:
        for m in (1, 2, 4, 8, 16, 32, 64):
            c = table.choose(n, k, m)
            assert c.cublas_us is not None, f"grid point {n}x{k} M={m} was not measured"
            assert c.us is not None and c.us <= c.cublas_us
            covered += 1
    assert covered == len(K3_GEMM_SHAPES) * 7


def test_chain_guard_sends_every_point_of_that_m_to_cublas_and_survives_json():
    t = _table(
        Measurement(2112, 7168, 8, 13.2, {"a": 12.5}),
        Measurement(2112, 7168, 1, 13.0, {"b": 9.1}),
    )
    t.guard(8, "layer chain 182.5 us vs cuBLAS 172.0 us")
    c = t.choose(2112, 7168, 8)
    assert (c.provider, c.us) == ("cublas", 13.2) and "chain guard" in c.reason
    assert t.choose(2112, 7168, 1).name == "b"  # other M untouched
    again = DispatchTable.from_json(json.loads(json.dumps(t.to_json())))
    assert again.choose(2112, 7168, 8).provider == "cublas"
