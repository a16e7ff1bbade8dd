"""The fused dense layer family (kimictl/kernels/layer). CPU: what ships covers every (kind,
segment, M) it serves, and its build registry stays apart from the GEMMs' verified source hash.
GPU: issue 35's decode-step table recorded on the lent H200 (`lab/bench/layer_front_h200.sh` step 3,
`layer_h200.py --chain-shipped`: stock, vLLM 0.33's own SM90 plan, kimictl's GEMM routes and the
fused layer in one run, committed as a fixture) must be of the current layer source and pass its
fp64 checks at every shipped segment and served point, its layer beating vLLM's plan in at most
half of stock's launches; the same script's step 2 (segment f routed inside vLLM's own attention
code) decides where the plugin serves it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from kimictl.kernels.layer.chain import CHAIN_SHIPPED, ROUTED, SEGMENTS, SERVED_MS
from kimictl.kernels.toolchain.build import (
    ALL_CONFIGS,
    FAMILIES,
    LAYER_CONFIGS,
    LAYER_FAMILIES,
    source_hash,
)

# one H200 run of lab/bench/layer_front_h200.sh step 3 (issue 35's decode-step table)
FIXTURE = Path(__file__).parent / "fixtures" / "kernels" / "layer_plan_h200.json"
FRONT_FIXTURE = FIXTURE.with_name("layer_front_h200.json")
PLAN_MS = (1, 2, 4, 8)
KINDS = ("mla", "kda")


def test_shipped_segments_cover_every_served_point_once():
    points = [(c.layer, c.seg, c.m) for c in CHAIN_SHIPPED]
    assert sorted(points) == sorted(itertools.product(KINDS, SEGMENTS + ROUTED, SERVED_MS))
    assert {c.math for c in CHAIN_SHIPPED} == {"simt"} and all(c.pdl for c in CHAIN_SHIPPED)
    assert [c.name for c in LAYER_CONFIGS] == [c.name for c in CHAIN_SHIPPED]


def test_layer_family_is_built_apart_from_the_gemms():
    # a layer edit must not make the GEMMs' recorded H200 verify stale, nor the reverse
    assert not set(LAYER_FAMILIES) & set(FAMILIES)
    assert not {c.name for c in LAYER_CONFIGS} & {c.name for c in ALL_CONFIGS}
    gemm_sources = {m for fam in FAMILIES.values() for m in fam.sources}
    assert not any(m.startswith("kimictl.kernels.layer.") for m in gemm_sources)
    assert source_hash(families=LAYER_FAMILIES) != source_hash()


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(FIXTURE.read_text())


def test_recorded_layer_run_is_of_the_current_layer_source(recorded: dict):
    assert recorded["chain_shipped"] is True and "H200" in recorded["device"]
    assert recorded["layer_source_hash"] == source_hash(families=LAYER_FAMILIES), (
        "layer kernel source changed since the H200 run: rerun lab/bench/layer_front_h200.sh"
    )


def test_recorded_layer_run_checked_every_shipped_segment_and_point(recorded: dict):
    chain, tol = recorded["chain"], recorded["tol"]
    assert set(chain["picks"].values()) == {c.name for c in CHAIN_SHIPPED}
    swept = {r["sweep"]: r for r in chain["sweep"]}
    for c in CHAIN_SHIPPED:  # each segment alone vs its fp64 model
        assert 0 <= swept[c.name]["rel_err"] <= tol, swept[c.name]
    checks = {(r["kind"], r["m"]): r for r in chain["checks"]}
    assert set(checks) == set(itertools.product(KINDS, SERVED_MS))
    for r in checks.values():  # the whole layer on the shipped segments vs fp64, 3 launches
        assert r["ok"] and r["repeat_equal"] and r["rel_err"] <= tol, r
    for kind in KINDS:  # timed beside stock in the same run, graph replay == eager
        rows = {row["m"]: row for row in recorded["layers"][kind]["rows"]}
        for m in SERVED_MS:
            run = rows[m]["kimictl_chain_pdlsi"]
            assert run["ok"] and run["graph_equals_eager"] and run["rel_err_out"] <= tol, run
            assert run["nodes"]["kernel"] < rows[m]["stock"]["nodes"]["kernel"]


def test_recorded_decode_step_table_times_vllms_own_plan_beside_the_layer():
    table = json.loads(FIXTURE.read_text())
    assert table["chain_shipped"] is True and "H200" in table["device"]
    assert table["layer_source_hash"] == source_hash(families=LAYER_FAMILIES), (
        "layer kernel source changed since the H200 run: rerun lab/bench/layer_front_h200.sh"
    )
    plan = table["vllm_plan"]
    assert plan["error"] is None  # vLLM's units linked and ran, not a cuBLAS stand-in for them
    used = set(plan["used"].values())
    assert "dsv3_fused_a" in used and any(how.startswith("sk_") for how in used)
    tol = table["tol"]
    for kind in KINDS:
        rows = {row["m"]: row for row in table["layers"][kind]["rows"]}
        assert set(rows) == set(PLAN_MS)
        for row in rows.values():  # every column vs fp64, graph replay == eager
            for variant in ("stock", "vllm_plan", "kimictl"):
                run = row[variant]
                assert run["ok"] and run["graph_equals_eager"] and run["rel_err_out"] <= tol, run
        for m in SERVED_MS:
            layer = rows[m]["kimictl_chain_pdlsi"]
            assert layer["ok"] and layer["graph_equals_eager"], layer
            assert layer["vs_best"]["vllm_plan"] < 1, (kind, m, layer["vs_best"])
            assert 2 * layer["nodes"]["kernel"] <= rows[m]["stock"]["nodes"]["kernel"]


def test_recorded_front_run_decides_where_segment_f_serves():
    """lab/bench/layer_front_h200.sh's run: segment f routed by the plugin inside vLLM 0.33.0's
    own attention code, beside vLLM's SM90 plan and the GEMM routes. At an M the route does not
    serve it leaves vLLM's kernels as they were, so there the two columns differ only by the
    harness (two sets of weight copies): that A/A difference is the margin. layer_route.SERVED
    must be exactly the (kind, M) where the route beat vLLM's plan by more than it."""
    from kimictl.kernels.vllm.layer_route import SERVED

    run = json.loads(FRONT_FIXTURE.read_text())
    assert "H200" in run["device"]
    assert run["layer_source_hash"] == source_hash(families=LAYER_FAMILIES), (
        "layer kernel source changed since the H200 run: rerun lab/bench/layer_front_h200.sh"
    )
    assert set(run["front_variants"]) == {c.name for c in CHAIN_SHIPPED if c.seg == "f"}
    rows = [(kind, row) for kind in KINDS for row in run["kinds"][kind]["rows"]]
    for kind, row in rows:
        assert run["kinds"][kind]["served"]
        for variant in ("vllm_plan", "kimictl_gemm", "kimictl_layer"):
            r = row[variant]  # vs an fp64 model of the same math; graph replay == eager
            assert r["ok"] and r["graph_equals_eager"] and r["rel_err"] <= 2e-2, r
    aa = [row for _, row in rows if row["m"] not in SERVED_MS]
    assert aa and all(r["kimictl_layer"]["nodes"] == r["vllm_plan"]["nodes"] for r in aa)
    margin = max(abs(1 - r["kimictl_layer"]["vs_vllm_plan"]) for r in aa)
    assert margin < 0.03  # the harness's own difference stays small
    faster = set()
    for kind, row in rows:
        if row["m"] in SERVED_MS:  # the front's launches become one
            layer, plan = row["kimictl_layer"], row["vllm_plan"]
            assert layer["nodes"]["kernel"] < plan["nodes"]["kernel"]
            if layer["vs_vllm_plan"] < 1 - margin:
                faster.add((kind, row["m"]))
    assert faster == set(SERVED)
