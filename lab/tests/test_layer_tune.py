"""The search over a chain's kernel picks (`dispatch.descend`: the bench's tuned layer-chain plan
and lab/bench/layer_h200.py's kimictl_tuned layer) on a cost model, and the
layer's candidate lists from the committed H200 dispatch table. The GPU part (each candidate timed
in the whole chain or layer) runs only on the lent H200."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kimictl.kernels.toolchain.build import ALL_CONFIGS
from kimictl.kernels.toolchain.dispatch import TUNE_GAIN, descend
from lab.kernels.families import EXPERIMENTAL_CONFIGS
from lab.kernels.wgstride_gemm import stride_configs

SCRIPT = Path(__file__).parents[2] / "lab" / "bench" / "layer_h200.py"


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
    buildable = {
        c.name
        for c in (*ALL_CONFIGS, *EXPERIMENTAL_CONFIGS, *lh.layer_res_configs(), *stride_configs())
    }
    for kind in kinds:
        tag = lh.tuned_tag(kind)
        mine = {key: vs for key, vs in cands.items() if key[0].endswith(tag)}
        ops = {key[0].removesuffix(tag) for key in mine}
        assert not ops & set(lh.FRONT) and "front" in ops  # the tuned layer's one front GEMM
        launched = {"kda_in", "f_b"} if kind == "kda" else {"qkv_a_g", "q_b"}
        assert ops == launched | {"o_proj", "front", "latent_up", "shared_down"}
        for (op, m, res), vs in mine.items():
            assert vs[0] == start[(op, m, res)] and "cublas" in vs
            assert len(vs) == len(set(vs))
            assert set(vs) - {"cublas"} <= buildable
            assert res == op.startswith("shared_down")
            if op.startswith("f_b"):  # no table point: wgmma's plain tile is tried, and at
                # M >= 2 (x is then a strided slice) the same tile reading x at its row stride
                stride = [c.name for c in stride_configs() if c.m == m]
                assert vs == ["cublas", lh.fb_tile(m), *stride]
                assert lh.fb_tile(m).startswith(f"wgmma_m{m}_") and not (m == 1 and stride)
            if res:  # the layer's residual tiles at that M are tried
                assert {c.name for c in lh.layer_res_configs() if c.m == m} <= set(vs)


def test_the_fold_variant_searches_the_same_picks_and_only_tcpro_where_folded(lh):
    from kimictl.kernels.layer.ops import dense_layer_ops
    from lab.kernels.tcpro_gemm import pro_configs

    cands = lh.tune_candidates(("mla", "kda"))
    fold = {(k[0].replace("@tunedf-", "@tuned-"), *k[1:]): v for k, v in cands.items()
            if "@tunedf-" in k[0]}  # fmt: skip
    folded = {k for k in fold if k[0].split("@")[0] in lh.FOLDED}
    # the GEMMs it still launches as such: the tuned variant's candidates, unchanged
    assert all(fold[k] == cands[k] for k in fold if k not in folded)
    # the GEMMs folded away are not searched (MLA's o_proj and shared_down, KDA's shared_down)
    assert not {k for k in fold if k[0] in ("o_proj@tuned-mla", "shared_down@tuned-mla",
                                            "shared_down@tuned-kda")}  # fmt: skip
    assert {("o_proj@tuned-kda", m, False) for m in lh.MS} <= set(fold)
    expect = {(f"{op}@tuned-{kind}", m) for op, (_, kinds) in lh.FOLDED.items() for kind in kinds
              for m in lh.FOLD_MS}  # fmt: skip
    assert {k[:2] for k in folded} == expect
    for key in folded:  # tcpro builds of that op at that M only: no other kernel computes it
        op = lh.FOLDED[key[0].split("@")[0]][0]
        assert fold[key] and all(v.startswith(f"tcpro_{op}_m{key[1]}_") for v in fold[key])
    mla = {o.name: o for o in dense_layer_ops("mla")}
    for c in pro_configs():  # the op's inputs sit where the layer splits the fused outputs
        if c.op == "gate":
            assert (c.x_w, c.off + mla["out_gate"].n) == (mla["qkv_a_g"].n, mla["qkv_a_g"].n)
        else:
            front = sum(mla[n].n for n in lh.FRONT)
            assert (c.x_w, c.off + mla["shared_gate_up"].n, c.residual) == (front, front, True)
    # every kernel the new-kernel preflight checks is a candidate somewhere
    names = {v for vs in cands.values() for v in vs}
    assert {c.name for c in lh.new_kernel_checks()} <= names


def test_the_cat_variant_searches_one_gemm_for_latent_up_and_shared_down(lh):
    cands = lh.tune_candidates(("mla", "kda"))
    start = lh.kernel_plan(("mla", "kda"))
    from kimictl.kernels.toolchain.dispatch import DispatchTable

    table = DispatchTable.load(lh.TABLE)
    for kind in ("mla", "kda"):
        tuned, cat = lh.tuned_tag(kind), lh.tuned_tag(kind, lh.CAT_VARIANT)
        mine = {(k[0].removesuffix(cat), *k[1:]): v for k, v in cands.items()
                if k[0].endswith(cat)}  # fmt: skip
        plain = {(k[0].removesuffix(tuned), *k[1:]): v for k, v in cands.items()
                 if k[0].endswith(tuned)}  # fmt: skip
        # the GEMMs it launches as the tuned variant does: the same candidates
        assert {k: v for k, v in plain.items() if k[0] not in lh.CAT} == {
            k: v for k, v in mine.items() if k[0] != lh.CAT_OP
        }
        for m in lh.MS:
            vs = mine[(lh.CAT_OP, m, False)]
            # starts at latent_up's pick; latent_up's candidates and the K = 7168 point's
            assert vs[0] == start[(lh.CAT_OP + cat, m, False)] == plain[("latent_up", m, False)][0]
            assert set(plain[("latent_up", m, False)]) <= set(vs)
            assert set(lh.fastest(table, lh.HFUSED_PROXY, m, False)) <= set(vs)
            assert "cublas" in vs and len(vs) == len(set(vs))


def test_the_cat_and_fold_variant_folds_mlas_gate_only(lh):
    cands = lh.tune_candidates(("mla", "kda"))
    cat, cf = lh.tuned_tag("mla", lh.CAT_VARIANT), lh.tuned_tag("mla", lh.CATFOLD_VARIANT)
    mine = {(k[0].removesuffix(cf), *k[1:]): v for k, v in cands.items() if k[0].endswith(cf)}
    plain = {(k[0].removesuffix(cat), *k[1:]): v for k, v in cands.items() if k[0].endswith(cat)}
    # cat's GEMMs but o_proj, which becomes the tcpro gate fold at the Ms it is built for
    assert {k: v for k, v in plain.items() if k[0] != "o_proj"} == {
        k: v for k, v in mine.items() if k[0] != "o_proj_gate"
    }
    assert {k[1] for k in mine if k[0] == "o_proj_gate"} == set(lh.FOLD_MS)
    assert lh.fold_ok(cands, "mla", 1, lh.CATFOLD_VARIANT)
    assert not lh.fold_ok(cands, "kda", 1, lh.CATFOLD_VARIANT)  # KDA has no gate: it is cat


def test_each_pdl_standin_twin_searches_its_layers_picks_itself(lh):
    """The _pdlsi twins run their layer with layer_elem's PDL copy as the stand-ins: the tuned
    ones search the same candidates as their layer under their own plan keys; the cat-and-fold
    twin, like its layer, runs on MLA only."""
    cands = lh.tune_candidates(("mla", "kda"))
    for twin, base in lh.PDLSI.items():
        if base not in lh.TUNED:
            continue
        for kind in ("mla", "kda"):
            mine, theirs = lh.tuned_tag(kind, twin), lh.tuned_tag(kind, base)
            assert mine != theirs
            got = {(k[0].removesuffix(mine), *k[1:]): v for k, v in cands.items()
                   if k[0].endswith(mine)}  # fmt: skip
            want = {(k[0].removesuffix(theirs), *k[1:]): v for k, v in cands.items()
                    if k[0].endswith(theirs)}  # fmt: skip
            assert got and got == want
        if twin in lh.FOLDS:  # the gate fold: MLA's
            assert lh.fold_ok(cands, "mla", 1, twin) and not lh.fold_ok(cands, "kda", 1, twin)
    assert set(lh.FOLDS) & set(lh.PDLSI) == {lh.CATFOLD_VARIANT + "_pdlsi"}


def test_report_holds_each_pdl_twin_against_the_faster_stock_form(lh):
    """--report on a recorded H200 run with the _pdlsi twins: a twin's "x stock" is its time over
    the faster of stock and stock_pdlsi (marked *), every other variant's over stock's."""
    import json

    run = Path(__file__).parent / "fixtures" / "layer_h200_pdlsi_run6.json"
    doc = json.loads(run.read_text())
    text = lh.render_markdown(doc)
    mla = text.split("**KDA**")[0]
    rows = {(int(c[1]), c[2]): c[4] for line in mla.splitlines()
            if (c := [x.strip() for x in line.split("|")])[0] == "" and len(c) > 5
            and c[1].isdigit()}  # fmt: skip
    row = next(r for r in doc["layers"]["mla"]["rows"] if r["m"] == 4)
    fast = min(row["stock"]["us"], row["stock_pdlsi"]["us"])
    twin = row["kimictl_tuned_cat_pdlsi"]["us"]
    assert rows[(4, "kimictl_tuned_cat_pdlsi")] == f"{twin / fast:.3f}*"
    assert (
        rows[(4, "kimictl_tuned_cat")]
        == f"{row['kimictl_tuned_cat']['us'] / row['stock']['us']:.3f}"
    )
    assert "against the faster of stock and stock_pdlsi" in text


def test_report_holds_the_chain_layer_against_the_faster_stock_form(lh):
    """The persistent-kernel layer runs with PDL stand-ins too: --report marks it like a twin."""
    import json

    run = Path(__file__).parent / "fixtures" / "layer_h200_chain_run6.json"
    doc = json.loads(run.read_text())
    kda = lh.render_markdown(doc).split("**KDA**")[1]
    rows = {(int(c[1]), c[2]): (c[4], c[5]) for line in kda.splitlines()
            if (c := [x.strip() for x in line.split("|")])[0] == "" and len(c) > 5
            and c[1].isdigit()}  # fmt: skip
    row = next(r for r in doc["layers"]["kda"]["rows"] if r["m"] == 1)
    fast = min(row["stock"]["us"], row["stock_pdlsi"]["us"])
    chain = row[lh.CHAIN_VARIANT]
    assert rows[(1, lh.CHAIN_VARIANT)] == (f"{chain['us'] / fast:.3f}*", "5")
