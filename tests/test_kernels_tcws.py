"""tcws_gemm (warp-specialised rival of vLLM's dsv3_fused_a, issue 16): config validation and
naming, its place as an experimental Hopper-only family, the AOT build for sm_90a (no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimictl.kernels import build as kbuild
from kimictl.kernels.build import embedded_sm
from kimictl.kernels.tcws_gemm import BAR_BYTES, SMEM_LIMIT, WS_CONFIGS, TcWsConfig


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


def test_sweep_targets_the_dsv3_cells_and_is_experimental():
    names = [c.name for c in WS_CONFIGS]
    assert len(set(names)) == len(names)
    assert {c.m for c in WS_CONFIGS} == {4, 8, 16}
    # x producers: one warp per 8 tokens, so each producer thread issues the same chunk count
    assert all(c.x_warps == c.mt // 8 for c in WS_CONFIGS)
    fam = kbuild.FAMILIES["tcws_gemm"]
    assert not fam.shipped and fam.arches == ("sm_90a",)
    assert "tcws_gemm" not in {c.kernel for c in kbuild.ALL_CONFIGS}
    # it reuses tcpipe's fragment helpers: a change there must rebuild tcws
    assert "tcpipe_gemm_dsl.py" in fam.sources


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


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks/results/dsv3_cells/dsv3_cells.json"


def test_candidates_won_and_were_verified_in_the_recorded_run():
    import json

    from kimictl.kernels.tcws_gemm import DSV3_CANDIDATES

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
    names = {c.name for c in DSV3_CANDIDATES}
    assert names == set(won) and names <= tails
    assert set(DSV3_CANDIDATES) <= set(WS_CONFIGS)
    # candidates only extend the shipped set: the shipped hash and verify fixture stay valid
    assert kbuild.CANDIDATE_CONFIGS[: len(kbuild.ALL_CONFIGS)] == kbuild.ALL_CONFIGS
    assert {c.name for c in kbuild.CANDIDATE_CONFIGS[len(kbuild.ALL_CONFIGS) :]} == names
