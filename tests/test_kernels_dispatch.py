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

from kimictl.kernels.toolchain.build import ALL_CONFIGS
from kimictl.kernels.toolchain.dispatch import (
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


def test_recorded_h200_table_is_three_way_and_never_slower_than_vllms_plan():
    from kimictl.kernels.toolchain.dispatch import VLLM_MARGIN

    # one H200 run of lab/bench/kernels_h200.py --vllm-harness: cuBLAS, every kimictl variant
    # and vLLM 0.33's own SM90 plan (CuTe skinny GEMM, dsv3_fused_a or its cuBLAS fallback)
    table = DispatchTable.load(FIXTURES / "bench_h200_table_3way.json")
    names = {c.name for c in ALL_CONFIGS}
    routes = {"vllm": 0, "kimictl": 0, "cublas": 0}
    for _, n, k in K3_GEMM_SHAPES:
        for m in (1, 2, 4, 8, 16, 32, 64):
            vllm_us = table.measurements[(n, k, m, False)].vllm_us
            assert vllm_us is not None, f"vLLM's plan not timed at {n}x{k} M={m}"
            c = table.choose3(n, k, m)
            plan = table.chain_ms.get(m, "mix")
            if plan == "kimictl":  # that M's whole layer measured faster on the two-way picks
                two = table.choose(n, k, m)
                assert (c.provider, c.name, c.us) == (two.provider, two.name, two.us)
            elif plan == "vllm":
                assert c.provider == "vllm"
            else:  # the per-cell rule
                assert c.us is not None and c.us <= vllm_us
                if c.provider != "vllm":
                    assert c.us < vllm_us * (1 - VLLM_MARGIN)
            if c.provider == "kimictl":
                assert c.name in names  # a variant this source builds
            routes[c.provider] += 1
    assert sum(routes.values()) == 84 and routes["kimictl"] > 0 and routes["vllm"] > 0


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


def test_family_restriction_picks_the_best_allowed_kernel_and_survives_json():
    from kimictl.kernels.toolchain.dispatch import family_of

    assert family_of("wgmma_m8_g1_k128_st4_s8") == "wgmma"
    assert family_of("wstream_m1_t128_u7_r2_et") == "wstream"
    t = _table(
        Measurement(7168, 768, 1, 5.4, {"wgmma_m1_a": 3.72, "tcstream_m1_b": 3.86}),
        Measurement(7168, 768, 4, 5.4, {"wgmma_m4_a": 3.6, "tcstream_m4_b": 3.9}),
        Measurement(448, 7168, 1, 7.5, {"wgmma_m1_c": 8.0}),
    )
    assert t.choose(7168, 768, 1).name == "wgmma_m1_a"  # per point: the fastest
    t.restrict(1, ("tcstream", "wstream"))
    c = t.choose(7168, 768, 1)
    assert (c.name, c.us) == ("tcstream_m1_b", 3.86) and "chosen by the layer chain" in c.reason
    assert t.choose(7168, 768, 4).name == "wgmma_m4_a"  # other M untouched
    # no allowed family at a point: cuBLAS, never a disallowed kernel
    assert t.choose(448, 7168, 1).provider == "cublas"
    again = DispatchTable.from_json(json.loads(json.dumps(t.to_json())))
    assert again.choose(7168, 768, 1).name == "tcstream_m1_b"
    again.restrict(1, None)
    assert again.choose(7168, 768, 1).name == "wgmma_m1_a"


def test_layer_chain_restriction_needs_to_beat_all_families_by_the_margin():
    from kimictl.kernels.toolchain.dispatch import ALL_FAMILIES, CHAIN_MARGIN, pick_family_set

    base = 137.6
    # within the margin: keep the per-point winners
    near = {ALL_FAMILIES: base, "tcstream+wstream": base * (1 - CHAIN_MARGIN / 2)}
    assert pick_family_set(near) == (ALL_FAMILIES, None)
    # clearly faster: the restriction is kept, with its families
    far = {ALL_FAMILIES: base, "tcstream+wstream": 124.2, "wgmma": 150.0}
    assert pick_family_set(far) == ("tcstream+wstream", ("tcstream", "wstream"))
    # "all" fastest: nothing restricted
    assert pick_family_set({ALL_FAMILIES: 120.0, "wgmma": 125.0}) == (ALL_FAMILIES, None)


def test_settle_chains_restricts_an_m_whose_family_subset_chain_won():
    from kimictl.kernels.toolchain.bench import settle_chains

    t = _table(
        Measurement(7168, 768, 1, 5.4, {"wgmma_m1_a": 3.72, "tcstream_m1_b": 3.86}),
        Measurement(2112, 7168, 1, 13.0, {"wstream_m1_c": 8.5}),
        Measurement(7168, 768, 8, 5.4, {"wgmma_m8_a": 3.7}),
        Measurement(2112, 7168, 8, 13.0, {"wgmma_m8_d": 9.5}),
    )
    layer = [("shared_down", 7168, 768), ("fused_qkv_a", 2112, 7168)]
    chains = [
        {"m": 1, "layer": list(layer), "bytes": 4.1e7, "cublas_us": 18.4, "kimictl_only_us": 14.0,
         "candidates": {"all": 14.0, "tcstream+wstream": 12.3, "wgmma": 15.0}},
        {"m": 8, "layer": list(layer), "bytes": 4.1e7, "cublas_us": 12.0, "kimictl_only_us": 13.0,
         "candidates": {"all": 13.0}},
    ]  # fmt: skip
    settle_chains(t, chains)
    one, eight = chains
    assert one["chosen_families"] == "tcstream+wstream" and one["dispatched_us"] == 12.3
    assert one["choices"] == {"shared_down": "tcstream_m1_b", "fused_qkv_a": "wstream_m1_c"}
    assert one["dispatched_predicted_us"] == pytest.approx(3.86 + 8.5)
    assert "layer" not in one and not one.get("guarded")
    # M = 8: the only chain lost to cuBLAS, so every point of M = 8 goes to cuBLAS
    assert eight["guarded"] and t.choose(2112, 7168, 8).provider == "cublas"
    assert t.choose(7168, 768, 1).name == "tcstream_m1_b"
