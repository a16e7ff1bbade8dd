"""The fused dense layer family (kimictl/kernels/layer). CPU: what ships covers every (kind,
segment, M) it serves, and its build registry stays apart from the GEMMs' verified source hash.
GPU: the run recorded on the lent H200 by `lab/bench/layer_h200.py --chain-shipped` (committed as
a fixture) must be of the current layer source and pass its fp64 checks at every served point."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from kimictl.kernels.layer.chain import CHAIN_SHIPPED, SEGMENTS, SERVED_MS
from kimictl.kernels.toolchain.build import (
    ALL_CONFIGS,
    FAMILIES,
    LAYER_CONFIGS,
    LAYER_FAMILIES,
    source_hash,
)

FIXTURE = Path(__file__).parent / "fixtures" / "kernels" / "layer_verify_h200.json"
KINDS = ("mla", "kda")


def test_shipped_segments_cover_every_served_point_once():
    points = [(c.layer, c.seg, c.m) for c in CHAIN_SHIPPED]
    assert sorted(points) == sorted(itertools.product(KINDS, SEGMENTS, SERVED_MS))
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
        "layer kernel source changed since the H200 run: rerun lab/bench/layer_h200.py "
        "--chain-shipped"
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
