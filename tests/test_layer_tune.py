"""The search over a chain's kernel picks (`dispatch.descend`: the bench's tuned layer-chain plan,
issue 16, and benchmarks/layer_h200.py's kimictl_tuned layer, issue 17) on a cost model, and the
layer's candidate lists from the committed H200 dispatch table. The GPU part (each candidate timed
in the whole chain or layer) runs only on the lent H200."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kimictl.kernels.build import ALL_CONFIGS, EXPERIMENTAL_CONFIGS
from kimictl.kernels.dispatch import TUNE_GAIN, descend

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "layer_h200.py"


@pytest.fixture(scope="module")
def lh():
    spec = importlib.util.spec_from_file_location("layer_h200", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["layer_h200"] = mod
    spec.loader.exec_module(mod)
    return mod


def _layer(costs, plan, calls, broken=()):
    """A layer time from per-(key, variant) costs; a broken variant fails its check (None)."""

    def evaluate():
        calls.append(dict(plan))
        if any(plan[k] in broken for k in plan):
            return None
        return 100.0 + sum(costs[k][plan[k]] for k in plan)

    return evaluate


def test_descent_finds_each_gemms_fastest_pick_and_skips_a_failing_one():
    a, b = ("q_b@t", 1, False), ("o_proj@t", 1, False)
    cands = {a: ["a0", "a1", "a2"], b: ["b0", "bad", "b1"]}
    costs = {a: {"a0": 5.0, "a1": 2.0, "a2": 3.0}, b: {"b0": 4.0, "bad": 0.0, "b1": 1.0}}
    plan = {a: "a0", b: "b0"}
    calls: list[dict] = []
    log = descend(cands, plan, _layer(costs, plan, calls, broken={"bad"}))
    assert plan == {a: "a1", b: "b1"}
    assert any(e.get("pick") == "bad" and e["us"] is None for e in log)
    # a second pass that moved nothing ends the search: start + 4 candidates + 4 again
    assert len(calls) == 9


def test_a_gain_inside_the_noise_margin_keeps_the_start():
    k = ("front@t", 8, False)
    gain = 100.0 * TUNE_GAIN / 2  # half the margin on a 100 us layer
    plan = {k: "start"}
    calls: list[dict] = []
    descend({k: ["start", "other"]}, plan,
                 _layer({k: {"start": 0.0, "other": -gain}}, plan, calls))  # fmt: skip
    assert plan == {k: "start"}


def test_a_start_that_fails_its_check_stops_the_search():
    k = ("latent_up@t", 2, False)
    plan = {k: "bad"}
    calls: list[dict] = []
    evaluate = _layer({k: {"bad": 0.0, "ok": 1.0}}, plan, calls, broken={"bad"})
    log = descend({k: ["bad", "ok"]}, plan, evaluate)
    assert log == [{"pass": 0, "start": True, "us": None}] and plan == {k: "bad"}


def test_candidates_start_at_elem_all_and_are_all_buildable(lh):
    kinds = ("mla", "kda")
    cands = lh.tune_candidates(kinds)
    start = lh.kernel_plan(kinds)
    buildable = {c.name for c in (*ALL_CONFIGS, *EXPERIMENTAL_CONFIGS, *lh.layer_res_configs())}
    for kind in kinds:
        tag = lh.tuned_tag(kind)
        mine = {key: vs for key, vs in cands.items() if key[0].endswith(tag)}
        ops = {key[0].removesuffix(tag) for key in mine}
        assert not ops & set(lh.FRONT) and "front" in ops  # the tuned layer's one front GEMM
        for (op, m, res), vs in mine.items():
            assert vs[0] == start[(op, m, res)] and "cublas" in vs
            assert len(vs) == len(set(vs))
            assert set(vs) - {"cublas"} <= buildable
            assert res == op.startswith("shared_down")
            if op.startswith("f_b"):  # no table point: wgmma's plain tile is tried
                assert vs == ["cublas", lh.fb_tile(m)] and lh.fb_tile(m).startswith(f"wgmma_m{m}_")
            if res:  # the layer's residual tiles at that M are tried
                assert {c.name for c in lh.layer_res_configs() if c.m == m} <= set(vs)


def test_the_gated_variant_searches_the_same_picks_and_only_tcgate_on_o_proj(lh):
    from kimictl.kernels.layer_ops import dense_layer_ops
    from kimictl.kernels.tcgate_gemm import gate_configs

    cands = lh.tune_candidates(("mla", "kda"))
    gated = {k: v for k, v in cands.items() if "@tunedg-" in k[0]}
    plain = {(k[0].replace("@tunedg-", "@tuned-"), *k[1:]): v for k, v in gated.items()}
    gate_keys = {k for k in plain if k[0].startswith("o_proj_gate")}
    assert {k for k in plain if k not in gate_keys} <= set(cands)
    assert all(plain[k] == cands[k] for k in plain if k not in gate_keys)
    # o_proj_gate: MLA only, at GATE_MS, tcgate builds only (no cuBLAS: no other kernel computes it)
    assert {(k[0].split("@")[1], k[1]) for k in gate_keys} == {("tuned-mla", m) for m in lh.GATE_MS}
    for key in gate_keys:
        assert plain[key] and all(v.startswith(f"tcgate_m{key[1]}_") for v in plain[key])
    ops = {o.name: o for o in dense_layer_ops("mla")}
    for c in gate_configs():  # the gate segment is where the layer splits the fused output
        assert (c.gate_w, c.gate_off + ops["out_gate"].n) == (ops["qkv_a_g"].n, ops["qkv_a_g"].n)
    # every kernel the new-kernel preflight checks is in the build's candidate set
    names = {v for vs in cands.values() for v in vs}
    assert {c.name for c in lh.new_kernel_checks()} <= names | {lh.fb_tile(m) for m in lh.MS}
