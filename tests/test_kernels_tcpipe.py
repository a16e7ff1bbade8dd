"""tcpipe_gemm (pipelined cp.async tensor-core GEMM): config validation and naming, the sweep's
constraints, and the AOT build for sm_90a and sm_100a on a machine with no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimictl.kernels.gemm.tcpipe_gemm import MAX_ACC, PIPE_CONFIGS, SMEM_LIMIT, TcPipeConfig
from kimictl.kernels.toolchain import build as kbuild
from kimictl.kernels.toolchain.build import embedded_sm

# The two code paths that differ beyond constants: one CTA per row block (shared-memory
# reduction over 2 k-warps, fused residual) and a 4-CTA cluster splitting K (distributed shared
# memory reduction) with several row warps.
SMALL = [
    TcPipeConfig(16, 48, 1, 2, bk=64, stages=3, residual=True),
    TcPipeConfig(64, 64, 2, 4, bk=128, stages=3, splits=4),
    TcPipeConfig(8, 16, 1, 1, bk=256, stages=2),  # one warp: rows alternate per chunk (rstep 1)
]


def test_name_spells_every_knob():
    cfg = TcPipeConfig(32, 96, 2, 4, bk=128, stages=6, splits=2)
    assert cfg.name == "tcpipe_m32_r96_w2x4_k128_p6_s2"
    assert TcPipeConfig(8, 16, 1, 1, residual=True, pdl=False).name == (
        "tcpipe_m8_r16_w1x1_k128_p4_res_nopdl"
    )
    assert cfg.kernel == "tcpipe_gemm"
    assert cfg.warps == 8 and cfg.warp_rows == 48


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"m": 12}, "m must be one of"),
        ({"rows": 40}, "multiple of 16"),
        ({"rows": 48, "row_warps": 2}, "multiple of 16 x row_warps"),
        ({"k_warps": 3}, "must divide bk / 32"),
        ({"bk": 96}, "bk must be"),
        ({"stages": 1}, "stages must be"),
        ({"splits": 3}, "portable cluster"),
        ({"m": 64, "rows": 128, "row_warps": 1}, "accumulators"),
        ({"rows": 160, "row_warps": 2, "stages": 12}, "shared memory"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict[str, int], message: str):
    base = {"m": 16, "rows": 64, "row_warps": 1, "k_warps": 4}
    with pytest.raises(ValueError, match=message):
        TcPipeConfig(**{**base, **kwargs})


def test_smem_holds_the_ring_and_the_reduction():
    ring = TcPipeConfig(16, 64, 1, 4, bk=128, stages=4)
    assert ring.stage_bytes == (64 + 16) * 128 * 2
    assert ring.smem_bytes == 4 * ring.stage_bytes
    assert ring.red_bytes == 4 * 64 * 16 * 4 <= ring.smem_bytes
    big = TcPipeConfig(64, 64, 2, 4, bk=128, stages=2)  # k-warp partials fill the whole ring
    assert big.smem_bytes == big.red_bytes == 2 * big.stage_bytes


def test_sweep_is_small_unique_and_fits_the_sm():
    names = [c.name for c in PIPE_CONFIGS]
    assert len(names) == len(set(names))
    assert len(PIPE_CONFIGS) <= 50
    assert {c.m for c in PIPE_CONFIGS} == {8, 16, 32, 64}  # sm_100 has no other M >= 16 family
    for c in PIPE_CONFIGS:
        assert c.smem_bytes <= SMEM_LIMIT and c.acc_regs <= MAX_ACC
        assert c.warps <= 16
        # the DSL's fast loads need a fixed chunk column per thread
        assert (32 * c.warps) % (c.bk // 8) == 0


# One CTA per row block on the large shapes at M = 64 (round 2's H200 run): N / rows CTAs fill
# the 132 SMs once (at one or two CTAs per SM) instead of leaving a partial last wave.
@pytest.mark.parametrize(
    ("n", "name", "ctas"),
    [
        (12448, "tcpipe_m64_r48_w1x4_k128_p4", 260),
        (6288, "tcpipe_m64_r48_w1x4_k128_p3_s2", 262),
        (20480, "tcpipe_m64_r160_w5x2_k128_p3", 128),
    ],
)
def test_m64_grids_fill_whole_waves(n: int, name: str, ctas: int):
    cfg = next(c for c in PIPE_CONFIGS if c.name == name)
    grid = -(-n // cfg.rows) * cfg.splits
    per_sm = 2 if cfg.smem_bytes + 1024 <= 228 * 1024 // 2 else 1
    assert grid == ctas
    assert 0.95 <= grid / (132 * per_sm) <= 1.0


@pytest.mark.parametrize(("arch", "sm"), [("sm_90a", 90), ("sm_100a", 100)])
def test_build_exports_tcpipe_variants(tmp_path: Path, arch: str, sm: int):
    if kbuild.dsl_version() is None:
        pytest.skip("nvidia-cutlass-dsl is not installed (pip install -e '.[test]')")
    result = kbuild.build(arch, tmp_path, configs=SMALL)
    manifest = kbuild.read_manifest(result.out_dir)
    assert manifest is not None and manifest["arch"] == arch
    assert [k["name"] for k in manifest["kernels"]] == [c.name for c in SMALL]
    wrapper = (result.out_dir / kbuild.WRAPPER).read_text()
    for entry in manifest["kernels"]:
        assert entry["kernel"] == "tcpipe_gemm"
        assert embedded_sm(result.out_dir / entry["object"]) == sm
        assert f'extern "C" int kimictl_{entry["name"]}(void* x, void* w' in wrapper
