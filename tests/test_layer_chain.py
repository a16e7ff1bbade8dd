"""The dense layer as three persistent kernels (issue 17, kimictl/kernels/layer_chain.py): the
segments cover the layer's op list, the grid barrier's word reopens without a reset, bad configs
are refused, and the segments compile for sm_90a (skipped without the DSL). That the segments'
offsets compute the layer is checked against fp64 by tests/test_layer_variants.py ("chain")."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kimictl.kernels import build as kbuild
from kimictl.kernels.layer_chain import (
    CHAIN_MS,
    COUNTER,
    SEGMENTS,
    SMEM,
    LayerChainConfig,
    arrive_add,
    chain_configs,
    segment,
)
from kimictl.kernels.layer_ops import dense_layer_ops


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
    assert {(c.layer, c.seg, c.m) for c in cfgs if (c.ring, c.slot) == (3, 7) or c.m == 2} == {
        (k, s, m) for k in ("mla", "kda") for s in SEGMENTS for m in CHAIN_MS
    }
    for c in cfgs:
        assert c.smem_bytes <= SMEM
        assert all(c.rows_of(st) >= 1 for st in c.stages)
    assert not kbuild.FAMILIES["layer_chain"].shipped
    with pytest.raises(ValueError, match="m must be"):
        LayerChainConfig("mla", "a", 4)
    with pytest.raises(ValueError, match="cannot hold one row"):
        LayerChainConfig("mla", "b", 1, slot=5)  # K = 7168 needs 7 vectors a thread
    with pytest.raises(ValueError, match="shared memory"):
        LayerChainConfig("mla", "a", 2, ring=4)  # 4 x 7 x 16 B x 512 threads + x: 257 KB
    with pytest.raises(ValueError, match="no chain segment"):
        LayerChainConfig("mla", "d", 1)


def test_every_segment_compiles_for_sm90a(tmp_path: Path):
    if kbuild.dsl_version() is None:
        pytest.skip("nvidia-cutlass-dsl is not installed (pip install -e '.[test]')")
    one_m = [c for c in chain_configs(ms=(2,)) if (c.ring, c.slot) == (2, 7)]
    res = kbuild.build("sm_90a", tmp_path, configs=one_m)
    assert {k["name"] for k in res.kernels} == {c.name for c in one_m}
    wrapper = (res.out_dir / kbuild.WRAPPER).read_text()
    for cfg in one_m:
        assert kbuild.embedded_sm(res.out_dir / f"{cfg.name}.o") == 90
        assert f"k_{cfg.name}_Tensor_mW_t t_mW = {{(void*)w}};" in wrapper  # static shapes
