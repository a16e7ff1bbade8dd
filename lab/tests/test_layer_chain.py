"""The dense layer as three persistent kernels (kimictl/kernels/layer/chain.py): the
segments cover the layer's op list, the grid barrier's word reopens without a reset, bad configs
are refused, and the segments compile for sm_90a (skipped without the DSL). That the segments'
offsets compute the layer is checked against fp64 by tests/test_layer_variants.py ("chain"); that
each variant's kernel computes its segment is checked on the H200 (lab/bench/layer_h200.py's chain
preflight, each variant vs segment_ref in fp64)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kimictl.kernels.layer.chain import (
    COUNTER,
    SEGMENTS,
    SIMT_MS,
    SMEM,
    LayerChainConfig,
    arrive_add,
    segment,
)
from kimictl.kernels.layer.ops import dense_layer_ops
from kimictl.kernels.toolchain import build as kbuild
from lab.kernels.families import ALL_FAMILIES, LAB_FAMILIES
from lab.kernels.layer_chain import (
    CHAIN_MS,
    KGROUP,
    WARPS,
    LayerChainMmaConfig,
    chain_config,
    chain_configs,
)


def test_segments_stream_every_gemm_weight_of_the_layer_once():
    for kind in ("mla", "kda"):
        ops = dense_layer_ops(kind)
        gemm_bytes = sum(op.n * op.k for op in ops if op.kind == "gemm")
        norm_elems = sum(op.k for op in ops if op.kind in ("rmsnorm", "add_rmsnorm"))
        for m in CHAIN_MS:
            stages = [st for seg in SEGMENTS for st in segment(kind, seg, m)[0]]
            assert sum(st.n * st.k for st in stages) == gemm_bytes
            weights = sum(segment(kind, seg, m)[1]["w"] - COUNTER for seg in SEGMENTS)
            assert weights == gemm_bytes + norm_elems  # each W: its norms and GEMMs, nothing else
            for seg in SEGMENTS:
                stages, sizes = segment(kind, seg, m)
                for st in stages:
                    assert st.w_off + st.n * st.k <= sizes["w"] - COUNTER
                    assert st.out[0] + (m - 1) * st.out[1] + st.n <= sizes["y"]


def test_barrier_word_flips_once_per_barrier_in_any_arrival_order():
    ctas, word = 132, 0
    rng = random.Random(4)
    for _ in range(5):
        order = list(range(ctas))
        rng.shuffle(order)
        olds = []
        for i, cta in enumerate(order):
            olds.append(word)
            word = (word + arrive_add(cta == 0, ctas)) % 2**32
            top_flipped = (word ^ olds[0]) >> 31
            assert top_flipped == (i == ctas - 1)  # nobody passes before the last arrival
        assert all((word ^ old) >> 31 for old in olds)  # then every waiter sees the flip
        assert word % 2**31 == 0


def test_configs_fit_one_sm_and_bad_ones_are_refused():
    cfgs = chain_configs()
    assert len({c.name for c in cfgs}) == len(cfgs)
    assert {(c.layer, c.seg, c.m) for c in cfgs} == {
        (k, s, m) for k in ("mla", "kda") for s in SEGMENTS for m in CHAIN_MS
    }
    assert {c.m for c in cfgs if c.math == "simt"} == set(SIMT_MS)
    assert {c.m for c in cfgs if c.math == "mma"} == set(CHAIN_MS) - set(SIMT_MS)
    for c in cfgs:
        assert c.smem_bytes <= SMEM
        if c.math == "simt":
            assert all(c.rows_of(st) >= 1 for st in c.stages)
    assert "layer_chain" in LAB_FAMILIES and "layer_chain" not in kbuild.FAMILIES
    with pytest.raises(ValueError, match="m must be"):
        LayerChainConfig("mla", "a", 4)  # SIMT's FMAs cost more than the bytes at M = 4
    with pytest.raises(ValueError, match="m must be"):
        LayerChainMmaConfig("mla", "a", 8, ring=2, slot=4)
    with pytest.raises(ValueError, match="math must be"):
        LayerChainConfig("mla", "a", 1, math="fp8")
    with pytest.raises(ValueError, match="math must be"):
        LayerChainConfig("mla", "a", 4, math="mma", ring=2, slot=8)  # the shipped form is SIMT
    with pytest.raises(ValueError, match="even slot"):
        LayerChainMmaConfig("mla", "c", 4, ring=3, slot=5)
    with pytest.raises(ValueError, match="cannot hold one row"):
        LayerChainConfig("mla", "b", 1, slot=5)  # K = 7168 needs 7 vectors a thread
    with pytest.raises(ValueError, match="shared memory"):
        LayerChainConfig("mla", "a", 2, ring=4)  # 4 x 7 x 16 B x 512 threads + x: 257 KB
    with pytest.raises(ValueError, match="shared memory"):
        LayerChainMmaConfig("mla", "a", 4, ring=5, slot=4)  # 160 KB ring + 57 KB x
    with pytest.raises(ValueError, match="no chain segment"):
        LayerChainConfig("mla", "d", 1)


def test_mma_pieces_stream_each_warps_k_groups_once_with_no_empty_piece():
    for c in (c for c in chain_configs() if isinstance(c, LayerChainMmaConfig)):
        per_piece = c.slot // 2  # k-groups of 32 a thread's slot holds (rows g and g + 8)
        for st in c.stages:
            per_warp = -(-st.k // (KGROUP * WARPS))  # k-groups of the tile each warp owns
            assert (c.pieces(st) - 1) * per_piece < per_warp <= c.pieces(st) * per_piece
            assert st.k % KGROUP == 0  # every k-group whole: the MMAs skip per warp, never lane


def test_every_segment_compiles_for_sm90a(tmp_path: Path):
    if kbuild.dsl_version() is None:
        pytest.skip("nvidia-cutlass-dsl is not installed (pip install -e '.[test]')")
    one_m = [c for c in chain_configs(ms=(2, 4)) if (c.ring, c.slot) in ((2, 7), (3, 4))]
    res = kbuild.build("sm_90a", tmp_path, configs=one_m, families=ALL_FAMILIES)
    assert {k["name"] for k in res.kernels} == {c.name for c in one_m}
    assert {c.math for c in one_m} == {"simt", "mma"}  # the shipped form and the lab's
    # a manifest entry gives back its config, in its form (the benchmarks read builds so)
    assert sorted(map(repr, (chain_config(**k) for k in res.kernels))) == sorted(map(repr, one_m))
    wrapper = (res.out_dir / kbuild.WRAPPER).read_text()
    for cfg in one_m:
        assert kbuild.embedded_sm(res.out_dir / f"{cfg.name}.o") == 90
        assert f"k_{cfg.name}_Tensor_mW_t t_mW = {{(void*)w}};" in wrapper  # static shapes
