"""The Hopper wgmma family on a machine with no GPU: config validation and naming, the sweep's
shape (M values, shared-memory fit, residual twins), and the AOT build for sm_90a: three variants
(a local-reduction one with a fused residual, a 4-CTA cluster one with the producer warp, and an
M = 1 one on the N = 8 tile with the early PDL trigger) compile, export an object whose embedded
cubin targets sm_90, and keep N and K runtime sizes in the C entry point; the M = 1 x copy stays
a 2-d TMA; the producer-warp variant keeps one wgmma group in flight. The family exists for
sm_90a only: other arches skip it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kimictl.kernels.gemm.wgmma_gemm import (
    SMEM_LIMIT,
    WGMMA_CONFIGS,
    WGMMA_MS,
    WgmmaConfig,
    _compile_wgmma,
)
from kimictl.kernels.toolchain import build as kbuild
from kimictl.kernels.toolchain.build import embedded_sm

SMALL = [
    WgmmaConfig(16, 1, 128, 4, residual=True),
    WgmmaConfig(64, 1, 128, 6, 4, evict_first=True, ws=True),
    WgmmaConfig(1, 1, 128, 4, 2, evict_first=True, early_trigger=True),
]


def test_config_geometry():
    cfg = WgmmaConfig(32, 2, 64, 5, 2)
    assert cfg.rows == 128
    assert cfg.threads == 256
    assert cfg.stage_bytes == (128 + 32) * 64 * 2
    assert cfg.smem_bytes >= 5 * cfg.stage_bytes
    assert cfg.name == "wgmma_m32_g2_k64_st5_s2"
    assert WgmmaConfig(16, 1, 128, 4, evict_first=True, residual=True).name == (
        "wgmma_m16_g1_k128_st4_ef_res"
    )
    assert WgmmaConfig(8, 1, 128, 4, pdl=False).name.endswith("_nopdl")
    assert WgmmaConfig(1, 1, 128, 4, 2, evict_first=True, early_trigger=True).name == (
        "wgmma_m1_g1_k128_st4_s2_ef_et"
    )
    assert WgmmaConfig(64, 1, 64, 4, 2, wn=256).name == "wgmma_m64_n256_k64_st4_s2"


def test_producer_warp_geometry():
    """`ws` adds one producer warp to the MMA warpgroups and names the variant `_ws`."""
    cfg = WgmmaConfig(64, 1, 128, 6, 2, evict_first=True, ws=True)
    assert cfg.mma_threads == 128
    assert cfg.threads == 160
    assert cfg.name == "wgmma_m64_g1_k128_st6_s2_ef_ws"
    assert WgmmaConfig(16, 2, 128, 4, ws=True, residual=True).threads == 288
    assert WgmmaConfig(16, 1, 128, 10, ws=True, residual=True).name == (
        "wgmma_m16_g1_k128_st10_ws_res"
    )
    # the ring and its shared memory do not change with ws
    assert cfg.smem_bytes == WgmmaConfig(64, 1, 128, 6, 2, evict_first=True).smem_bytes


def test_small_m_runs_the_n8_tile():
    """M = 1..7 pad the x tile (and the ring's bytes per stage) to wgmma's N = 8; M = 8 up use M."""
    for m in range(1, 9):
        cfg = WgmmaConfig(m, 1, 128, 4)
        assert cfg.mma_tokens == 8
        assert cfg.stage_bytes == (64 + 8) * 128 * 2
    assert WgmmaConfig(32, 1, 128, 4).mma_tokens == 32


def test_x_as_a_operand_geometry():
    cfg = WgmmaConfig(64, 1, 64, 5, wn=256)
    assert cfg.rows == 256  # weight rows per CTA = wgmma N
    assert cfg.threads == 128
    assert cfg.stage_bytes == (256 + 64) * 64 * 2
    assert cfg.ctas_per_sm == 1


def test_ctas_per_sm_follows_shared_memory():
    assert WgmmaConfig(16, 1, 128, 4).ctas_per_sm == 2  # ~83 KB
    assert WgmmaConfig(16, 1, 128, 10).ctas_per_sm == 1  # ~206 KB
    assert WgmmaConfig(8, 1, 128, 4).ctas_per_sm == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"m": 12}, "m must be one of"),
        ({"m": 9}, "m must be one of"),
        ({"m": 0}, "m must be one of"),
        ({"wgs": 3}, "wgs must be 1 or 2"),
        ({"bk": 96}, "bk must be 64, 128 or 256"),
        ({"stages": 1}, "stages must be 2..12"),
        ({"splits": 3}, "portable cluster"),
        ({"splits": 16}, "portable cluster"),
        ({"m": 64, "wgs": 2, "bk": 256, "stages": 4}, "shared memory"),
        ({"early_trigger": True, "pdl": False}, "early_trigger needs pdl"),
        ({"stages": 2, "ws": True}, "stages >= 3"),
        ({"wn": 128}, "x as the A operand"),  # m = 16: wgmma's M is 64 tokens
        ({"m": 64, "wn": 96}, "x as the A operand"),
        ({"m": 64, "wn": 128, "wgs": 2}, "x as the A operand"),
    ],
)
def test_config_rejects_what_the_kernel_cannot_do(kwargs: dict[str, int | bool], match: str):
    base = {"m": 16, "wgs": 1, "bk": 128, "stages": 4}
    with pytest.raises(ValueError, match=match):
        WgmmaConfig(**{**base, **kwargs})


def test_sweep_is_small_unique_and_fits():
    names = [c.name for c in WGMMA_CONFIGS]
    assert len(names) == len(set(names))
    assert len(WGMMA_CONFIGS) <= 80  # the whole shipped build compiles in a few minutes
    assert {c.m for c in WGMMA_CONFIGS} == set(WGMMA_MS)
    assert all(c.smem_bytes <= SMEM_LIMIT for c in WGMMA_CONFIGS)
    assert all(c.kernel == "wgmma_gemm" for c in WGMMA_CONFIGS)
    # every M from 16 on has an unsplit variant and a split for the small-N shapes
    for m in (16, 32, 64):
        splits = {c.splits for c in WGMMA_CONFIGS if c.m == m and not c.residual}
        assert {1, 8} <= splits, m
    assert {c.m for c in WGMMA_CONFIGS if c.residual} == {16, 64}
    # every M = 2..8 has an unsplit, a split-2 and a split-8 variant on the N = 8 tile; M = 1
    # keeps the unsplit one (kimictl's 1-row GEMV wins the other M = 1 points)
    for m in range(1, 9):
        tiles = [c for c in WGMMA_CONFIGS if c.m == m]
        assert all(c.mma_tokens == 8 for c in tiles)
        assert {1, 2, 8} <= {c.splits for c in tiles} if m > 1 else {c.splits for c in tiles} == {1}
    # round 3: M = 8..64 each have the producer-warp deep ring, unsplit and split 2 / 4 / 8, all
    # with one CTA per SM
    for m in (8, 16, 32, 64):
        deep = [c for c in WGMMA_CONFIGS if c.m == m and c.ws and c.bk == 128 and not c.residual]
        assert {1, 2, 4, 8} <= {c.splits for c in deep}, m
        assert min(c.ctas_per_sm for c in deep if c.stages >= 6) == 1
    # M = 2..7 also get the M = 8 deep ring (the same 8-row x tile); M = 1 stays on the GEMV
    assert {c.m for c in WGMMA_CONFIGS if c.ws} == set(range(2, 9)) | {16, 32, 64}
    # x-as-A measured slower everywhere: none ships
    assert not any(c.wn for c in WGMMA_CONFIGS)


def test_registered_for_hopper_only():
    fam = kbuild.FAMILIES["wgmma_gemm"]
    assert fam.arches == ("sm_90a",)
    assert fam.configs == "WGMMA_CONFIGS"
    with pytest.raises(ValueError, match="sm_90a only"):
        _compile_wgmma(SMALL[0], "sm_100a")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> kbuild.BuildResult:
    if kbuild.dsl_version() is None:
        pytest.skip("nvidia-cutlass-dsl is not installed (pip install -e '.[test]')")
    return kbuild.build("sm_90a", tmp_path_factory.mktemp("wgmma"), configs=SMALL)


def test_build_exports_sm90_objects(built: kbuild.BuildResult):
    manifest = kbuild.read_manifest(built.out_dir)
    assert manifest is not None
    assert [k["name"] for k in manifest["kernels"]] == [c.name for c in SMALL]
    for entry in manifest["kernels"]:
        assert entry["kernel"] == "wgmma_gemm"
        assert embedded_sm(built.out_dir / entry["object"]) == 90


def test_entry_points_keep_n_and_k_runtime(built: kbuild.BuildResult):
    wrapper = (built.out_dir / kbuild.WRAPPER).read_text()
    for cfg in SMALL:
        body = wrapper.split(f'extern "C" int kimictl_{cfg.name}(', 1)[1].split("}\n", 1)[0]
        # W is (n, k) with row stride k; x's and y's leading sizes are the runtime k and n
        assert re.search(r"t_mW = \{\(void\*\)w, \{n, k\}, \{k\}\}", body), body
        assert "t_mX = {(void*)x, {k}, {k}}" in body
        assert "t_mY = {(void*)y, {n}, {n}}" in body


def test_other_arches_skip_the_family(tmp_path: Path):
    if kbuild.dsl_version() is None:
        pytest.skip("nvidia-cutlass-dsl is not installed (pip install -e '.[test]')")
    result = kbuild.build("sm_100a", tmp_path, configs=SMALL)
    assert result.kernels == []
    assert "kimictl_wgmma" not in (result.out_dir / kbuild.WRAPPER).read_text()


def _ptx_of(cfg_args: str, tmp_path: Path) -> str:
    """PTX of `WgmmaConfig(<cfg_args>)` built for sm_90a in a fresh process (the DSL dumps it)."""
    if kbuild.dsl_version() is None:
        pytest.skip("nvidia-cutlass-dsl is not installed (pip install -e '.[test]')")
    code = (
        "from kimictl.kernels.gemm.wgmma_gemm import WgmmaConfig, _compile_wgmma; "
        f"_compile_wgmma(WgmmaConfig({cfg_args}))"
    )
    env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a", "CUTE_DSL_KEEP": "ptx",
           "CUTE_DSL_DUMP_DIR": str(tmp_path)}  # fmt: skip
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    (ptx_file,) = tmp_path.glob("*.ptx")
    return ptx_file.read_text()


def test_m1_x_copy_stays_two_dimensional(tmp_path: Path):
    """A static size-1 row mode made the DSL emit a 1-d TMA for x's 8-row box (an illegal
    instruction on the H200): the M = 1 variant's PTX must load x with a 2-d copy like the
    weights, and issue the early PDL trigger before the grid dependency wait."""
    ptx = _ptx_of("1, 1, 128, 4, 2, evict_first=True, early_trigger=True", tmp_path)
    copies = re.findall(r"cp\.async\.bulk\.tensor\.(\d)d", ptx)
    assert copies and set(copies) == {"2"}, copies
    assert "m64n8k16" in ptx
    assert ptx.index("griddepcontrol.launch_dependents") < ptx.index("griddepcontrol.wait")
    # the round-2 mainloop: every stage's MMAs are waited for (wait_group 0) before release
    assert re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx) == ["0"]


def test_producer_warp_keeps_one_wgmma_group_in_flight(tmp_path: Path):
    """The `ws` variant launches 160 threads (one MMA warpgroup + the producer warp) and its MMA
    warps wait with `wgmma.wait_group 1` in the loop (then 0 once after it)."""
    ptx = _ptx_of("32, 1, 128, 8, 2, evict_first=True, ws=True", tmp_path)
    assert re.search(r"\.reqntid 160, 1, 1", ptx)
    assert re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx) == ["1", "0"]
    assert "m64n32k16" in ptx
