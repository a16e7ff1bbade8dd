"""tcws_gemm (warp-specialised rival of vLLM's dsv3_fused_a, issue 16): config validation and
naming, its place as a shipped Hopper-only family (its winners only), the AOT build for sm_90a (no
GPU), and the recorded H200 runs that put it in the dispatch table."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimictl.kernels.gemm.tcws_gemm import BAR_BYTES, SMEM_LIMIT, WS_CONFIGS, WS_SHIPPED, TcWsConfig
from kimictl.kernels.toolchain import build as kbuild
from kimictl.kernels.toolchain.build import embedded_sm
from kimictl.kernels.toolchain.dispatch import K3_GEMM_SHAPES, VLLM_MARGIN, DispatchTable


def test_name_spells_every_knob():
    cfg = TcWsConfig(16, stages=10, x_warps=2, late=True)
    assert cfg.name == "tcws_m16_r16_k8_b256_p10_w2x2_late"
    assert TcWsConfig(8, k_warps=4, bk=128, stages=4, pdl=False).name == (
        "tcws_m8_r16_k4_b128_p4_w2x1_nopdl"
    )
    assert cfg.kernel == "tcws_gemm" and cfg.warps == 12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"m": 12}, "m must be one of"),
        ({"rows": 24}, "multiple of 16"),
        ({"k_warps": 3}, "must divide bk / 32"),
        ({"bk": 64}, "bk must be"),
        ({"stages": 17}, "stages must be"),
        ({"w_warps": 0}, "warps in all"),
        ({"k_warps": 8, "w_warps": 6, "x_warps": 3}, "warps in all"),
        ({"residual": True}, "no residual"),
        ({"m": 16, "stages": 14}, "shared memory"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict[str, object], message: str):
    with pytest.raises(ValueError, match=message):
        TcWsConfig(**{"m": 8, **kwargs})  # type: ignore[arg-type]


def test_smem_is_ring_barriers_and_a_separate_reduction():
    cfg = TcWsConfig(8, stages=16)
    assert cfg.stage_bytes == (16 + 8) * 256 * 2
    assert cfg.red_bytes == 8 * 16 * 8 * 4
    assert cfg.smem_bytes == 16 * cfg.stage_bytes + BAR_BYTES + cfg.red_bytes <= SMEM_LIMIT
    assert BAR_BYTES >= 16 * 16  # two 8-byte mbarriers per slot, 16 slots at most


def test_sweep_targets_the_dsv3_cells_and_only_the_winners_ship():
    names = [c.name for c in WS_CONFIGS]
    assert len(set(names)) == len(names)
    assert {c.m for c in WS_CONFIGS} == {4, 8, 16}
    # x producers: one warp per 8 tokens, so each producer thread issues the same chunk count
    assert all(c.x_warps == c.mt // 8 for c in WS_CONFIGS)
    fam = kbuild.FAMILIES["tcws_gemm"]
    assert fam.arches == ("sm_90a",)
    shipped = [c for c in kbuild.ALL_CONFIGS if c.kernel == "tcws_gemm"]
    assert shipped == list(WS_SHIPPED) and set(WS_SHIPPED) < set(WS_CONFIGS)
    # it reuses tcpipe's fragment helpers: a change there must rebuild tcws
    assert "kimictl.kernels.gemm.tcpipe_gemm_dsl" in fam.sources


def test_build_exports_tcws_for_hopper_only(tmp_path: Path):
    if kbuild.dsl_version() is None:
        pytest.skip("nvidia-cutlass-dsl is not installed (pip install -e '.[test]')")
    small = [TcWsConfig(8, stages=4), TcWsConfig(16, k_warps=4, bk=128, stages=3, x_warps=2)]
    result = kbuild.build("sm_90a", tmp_path, configs=small)
    manifest = kbuild.read_manifest(result.out_dir)
    assert manifest is not None
    assert [k["name"] for k in manifest["kernels"]] == [c.name for c in small]
    for entry in manifest["kernels"]:
        assert entry["kernel"] == "tcws_gemm"
        assert embedded_sm(result.out_dir / entry["object"]) == 90
    assert kbuild.build("sm_100a", tmp_path, configs=small).kernels == []


def test_m4_runs_the_8_token_tile():
    cfg = TcWsConfig(4, stages=6)
    assert cfg.mt == 8 and cfg.stage_bytes == TcWsConfig(8, stages=6).stage_bytes
    assert cfg.name == "tcws_m4_r16_k8_b256_p6_w2x1"


RESULTS = Path(__file__).resolve().parents[1] / "tests/fixtures/runs/dsv3_cells/dsv3_cells.json"


def test_shipped_variants_won_and_were_verified_in_the_recorded_run():
    import json

    run = json.loads(RESULTS.read_text())
    assert run["failures"] == [] and run["env"]["gpu"] == "NVIDIA H200"
    tails = {t["variant"] for t in run["tails"] if t["ok"]}
    won: dict[str, float] = {}
    for cell in run["cells"]:
        v = cell["variants"]
        dsv3 = v["dsv3"]["us"]
        best = min((r["us"], name) for name, r in v.items() if name.startswith("tcws_"))
        if best[0] < dsv3:
            rec = v[best[1]]
            assert rec["fresh"]["ok"] and rec["timed_path"]["ok"] and rec["graph_eq_eager"]
            won[best[1]] = max(won.get(best[1], 0.0), dsv3 / best[0])
    names = {c.name for c in WS_SHIPPED}
    assert names == set(won) and names <= tails


ROOT = Path(__file__).resolve().parents[1]
TCWS_TABLE = ROOT / "tests/fixtures/kernels/bench_h200_table_3way_tcws.json"
TCWS_RUN = ROOT / "tests/fixtures/runs/kernels_vs_vllm_tcws"
DSV3_CELLS = {(2112, 7168), (1536, 7168), (2304, 1536)}  # vLLM runs dsv3_fused_a at M = 4..16


def test_recorded_table_routes_dsv3_cells_to_tcws_only_where_it_measured_faster():
    # H200 2026-12-01 05:50 UTC: kernels_h200.py --vllm-harness on the shipped build with tcws
    table = DispatchTable.load(TCWS_TABLE)
    names = {c.name for c in WS_SHIPPED}
    routed = {}
    for shape, n, k in K3_GEMM_SHAPES:
        for m in (8, 16):
            meas = table.measurements[(n, k, m, False)]
            assert names & set(meas.kernels) == {c.name for c in WS_SHIPPED if c.m == m}
            c = table.choose3(n, k, m)
            if c.name in names:
                routed[(shape, m)] = c.name
                assert (n, k) in DSV3_CELLS and c.us is not None and meas.vllm_us is not None
                if table.chain_ms.get(m, "mix") == "mix":  # the per-cell rule's margin
                    assert c.us < meas.vllm_us * (1 - VLLM_MARGIN)
    # fused_qkv_a and shared_gate_up at M = 8 and 16; mla_q_b (K = 1536) keeps another kernel
    assert {s for s, _ in routed} == {"fused_qkv_a", "shared_gate_up"} and len(routed) == 4


def test_recorded_harness_timed_tcws_as_shipped_ahead_of_dsv3_fused_a():
    # the same run's shared harness (independent timing, weights rotated past L2) shipped
    # choose3 on that table: where it picked tcws, vLLM's plan there is its dsv3_fused_a kernel
    import json

    table = DispatchTable.load(TCWS_TABLE)
    run = json.loads((TCWS_RUN / "harness_s1.json").read_text())
    assert not run["failures"]
    assert run["kimi_manifest"]["source_hash"] == kbuild.source_hash()
    seen = 0
    for cell in run["cells"]:
        c = table.choose3(cell["n"], cell["k"], cell["m"])
        if not c.name.startswith("tcws_"):
            continue
        v = cell["variants"]
        assert cell["ship_variant"] == "kimi" and cell["kimi_choice"] == c.name
        assert cell["vllm_disp_variant"] == "vllm_dsv3"
        assert v["kimi"]["timed_path"]["ok"] and v["kimi"]["us"] < v["vllm_dsv3"]["us"]
        seen += 1
    assert seen == 4
