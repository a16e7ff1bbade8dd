"""AOT build on a machine with no GPU: sm_90a and sm_100a compile and export objects whose embedded
cubin targets that arch, a wrapper with one flat entry point per variant, and a manifest naming the
kernel, arch, DSL version and source hash. Also the pure parts: configs, the analytical default,
the wrapper generator, the arch map."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kimictl.kernels.gemm.tcstream_gemm import TC_CONFIGS, TC_MS, TcStreamConfig
from kimictl.kernels.gemm.wstream_gemm import CONFIGS, MAX_M, TILES, WStreamConfig, default_config
from kimictl.kernels.toolchain import build as kbuild
from kimictl.kernels.toolchain.build import embedded_sm
from kimictl.kernels.toolchain.harness import arch_of

# Three variants span the regimes that change the generated code: SIMT M=1 one row per CTA, SIMT
# M=8 with four rows and a fused residual, and the tensor-core kernel with two token tiles and a
# 2-CTA cluster splitting K (distributed-smem reduction); every other variant differs only in
# constants.
SMALL = [
    WStreamConfig(1, 128, 7, 1),
    WStreamConfig(8, 32, 3, 4, residual=True),
    TcStreamConfig(16, 4, 2, 1, 2),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, kbuild.BuildResult]:
    if kbuild.dsl_version() is None:
        pytest.skip("nvidia-cutlass-dsl is not installed (pip install -e '.[test]')")
    out = tmp_path_factory.mktemp("kbuild")
    return {arch: kbuild.build(arch, out, configs=SMALL) for arch in ("sm_90a", "sm_100a")}


@pytest.mark.parametrize(("arch", "sm"), [("sm_90a", 90), ("sm_100a", 100)])
def test_build_exports_objects_for_the_arch(built, arch: str, sm: int):
    result = built[arch]
    manifest = kbuild.read_manifest(result.out_dir)
    assert manifest is not None
    assert manifest["arch"] == arch
    assert manifest["dsl_version"] == kbuild.dsl_version()
    assert manifest["source_hash"] == kbuild.source_hash()
    assert [k["name"] for k in manifest["kernels"]] == [c.name for c in SMALL]
    for entry in manifest["kernels"]:
        obj = result.out_dir / entry["object"]
        assert obj.stat().st_size > 1000
        assert embedded_sm(obj) == sm
        assert entry["kernel"] in ("wstream_gemm", "tcstream_gemm")
        assert entry["symbol"] == f"kimictl_{entry['name']}"
    assert manifest["runtime_lib"] == kbuild.RUNTIME_LIB
    assert (result.out_dir / kbuild.RUNTIME_LIB).is_file()


def test_wrapper_has_one_entry_point_per_variant_with_runtime_sizes(built):
    src = (built["sm_90a"].out_dir / kbuild.WRAPPER).read_text()
    for cfg in SMALL:
        assert f'extern "C" int kimictl_{cfg.name}(void* x, void* w, void* y, void* r,' in src
        # N and K are runtime: W's struct takes both, X's takes K
        assert f"k_{cfg.name}_Tensor_mW_t t_mW = {{(void*)w, {{n, k}}, {{k}}}};" in src
    assert f"return {len(SMALL)};" in src


def test_rebuild_reuses_objects_until_the_stamp_changes(built, tmp_path: Path):
    arch_dir = built["sm_90a"].out_dir
    again = kbuild.build("sm_90a", arch_dir.parent, configs=SMALL)
    assert again.reused == len(SMALL)
    (arch_dir / f"{SMALL[0].name}.stamp").write_text("stale")
    third = kbuild.build("sm_90a", arch_dir.parent, configs=SMALL)
    assert third.reused == len(SMALL) - 1
    # each object is keyed by its own kernel's sources
    assert kbuild.source_hash("wstream_gemm") != kbuild.source_hash("tcstream_gemm")
    stamps = {(arch_dir / f"{c.name}.stamp").read_text() for c in SMALL}
    assert len(stamps) == 2


def test_unknown_arch_is_refused_before_compiling(tmp_path: Path):
    with pytest.raises(ValueError, match="sm_90a, sm_100a, sm_103a"):
        kbuild.build("sm_80", tmp_path)
    assert not any(tmp_path.iterdir())


def test_wrapper_generator_rejects_a_header_without_tensor_structs():
    with pytest.raises(RuntimeError, match="lacks tensor structs"):
        kbuild._wrapper_source(
            [("wstream_m1_x", "typedef struct { void *data; } k_x_Tensor_mX_t;")]
        )


def test_configs_cover_every_m_with_every_tile_and_validate():
    for m in range(1, MAX_M + 1):
        tiles = {(c.threads, c.unroll, c.rows) for c in CONFIGS if c.m == m and not c.residual}
        assert set(TILES) <= tiles
    assert len({c.name for c in kbuild.ALL_CONFIGS}) == len(kbuild.ALL_CONFIGS)
    assert {c.m for c in TC_CONFIGS} == set(TC_MS)  # every prepared token batch, 1..64
    with pytest.raises(ValueError):
        WStreamConfig(9, 128, 7, 1)
    with pytest.raises(ValueError):
        WStreamConfig(8, 32, 3, 8)  # 64 outputs, 32 threads
    with pytest.raises(ValueError):
        TcStreamConfig(8, 8, 2, 1, 3)  # a cluster of 3 CTAs is not built
    assert all(c.smem_bytes <= 48 * 1024 for c in TC_CONFIGS)  # static shared memory limit


@pytest.mark.parametrize("k", [7168, 3584, 1536, 768])
def test_default_config_fits_k3_k_without_idle_lanes(k: int):
    cfg = default_config(2112, k, 4)
    assert (k // 8) % (cfg.threads * cfg.unroll) == 0, f"K={k}: {cfg.name} leaves idle lanes"


def test_default_residual_config_is_a_built_residual_variant():
    cfg = default_config(7168, 1536, 3, residual=True)
    assert cfg.residual and cfg in CONFIGS


def test_arch_map():
    assert arch_of((9, 0)) == "sm_90a"
    assert arch_of((10, 0)) == "sm_100a"
    assert arch_of((10, 3)) == "sm_103a"
    assert arch_of((8, 0)) is None


def test_manifest_reader_tolerates_garbage(tmp_path: Path):
    (tmp_path / kbuild.MANIFEST).write_text("{not json")
    assert kbuild.read_manifest(tmp_path) is None
    (tmp_path / kbuild.MANIFEST).write_text(json.dumps({"arch": "sm_90a"}))
    assert kbuild.read_manifest(tmp_path) == {"arch": "sm_90a"}


def test_link_names_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from kimictl.kernels.toolchain.harness import LinkError, link

    (tmp_path / kbuild.MANIFEST).write_text(
        json.dumps({"wrapper": kbuild.WRAPPER, "kernels": [{"object": "a.o"}]})
    )
    with pytest.raises(LinkError, match="libcuda_dialect_runtime_static.a is missing"):
        link(tmp_path)
    (tmp_path / kbuild.RUNTIME_LIB).write_bytes(b"!<arch>\n")
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvcc, no g++
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nope"))
    monkeypatch.setattr("kimictl.kernels.toolchain.harness._cuda_roots", lambda: [])
    with pytest.raises(LinkError, match="no CUDA toolkit headers"):
        link(tmp_path)


def test_find_build_prefers_the_installed_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from kimictl.kernels.toolchain.harness import find_build

    cache, tree = tmp_path / "cache", tmp_path / "tree"
    for base in (cache, tree):
        (base / "sm_90a").mkdir(parents=True)
        (base / "sm_90a" / kbuild.MANIFEST).write_text("{}")
    assert find_build("sm_90a", [cache, tree]) == cache / "sm_90a"
    assert find_build("sm_100a", [cache, tree]) is None


def test_the_manifest_hash_covers_every_shipped_family_and_no_prose(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    shipped = kbuild.source_hash()
    assert shipped == kbuild.source_hash()  # deterministic
    assert {c.kernel for c in kbuild.ALL_CONFIGS} == set(kbuild.FAMILIES)
    # a family's own hash covers the shared compile helper too
    assert "kimictl.kernels.gemm.aot" in kbuild.FAMILIES["wstream_gemm"].sources
    # docstrings and comments are not the code: a copy that differs only there hashes the same
    src = kbuild._source_file("kimictl.kernels.gemm.aot")
    prose = tmp_path / "aot.py"
    text = src.read_text()
    assert text.startswith('"""')  # a module docstring to reword
    prose.write_text('"""Reworded. ' + text[3:] + "\n# another comment\n")
    real = kbuild._source_file
    monkeypatch.setattr(kbuild, "_source_file", lambda m: prose if m.endswith(".aot") else real(m))
    assert kbuild.source_hash() == shipped
    prose.write_text(src.read_text() + "\nX = 1\n")  # a code change does change it
    assert kbuild.source_hash() != shipped


def test_embedded_sm_reads_the_cubin_and_is_none_without_one(tmp_path: Path):
    # a minimal host object: some bytes, then an ELF header whose e_machine is 190 (CUDA) and
    # whose e_flags carry sm_90 in bits 8..15, as the DSL's exported objects do
    cubin = bytearray(0x40)
    cubin[0:4] = b"\x7fELF"
    struct.pack_into("<H", cubin, 18, 190)
    struct.pack_into("<I", cubin, 0x30, 90 << 8)
    obj = tmp_path / "k.o"
    obj.write_bytes(b"\x7fELF" + b"\0" * 60 + bytes(cubin))
    assert kbuild.embedded_sm(obj) == 90
    plain = tmp_path / "plain.o"
    plain.write_bytes(b"\x7fELF" + b"\0" * 200)
    assert kbuild.embedded_sm(plain) is None


def test_build_layer_writes_its_own_manifest_on_hopper_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`kimictl kernels build` builds the layer family beside the GEMMs (sm_90a only), with the
    layer sources' hash in its manifest, where doctor's `find_layer_build` looks."""
    assert kbuild.build_layer("sm_100a", tmp_path) is None  # no Hopper, no layer family
    if kbuild.dsl_version() is None:
        pytest.skip("nvidia-cutlass-dsl is not installed (pip install -e '.[test]')")
    one = next(c for c in kbuild.LAYER_CONFIGS if (c.layer, c.seg, c.m) == ("mla", "c", 1))
    monkeypatch.setattr(kbuild, "LAYER_CONFIGS", (one,))
    result = kbuild.build_layer("sm_90a", tmp_path)
    assert result is not None and result.out_dir == tmp_path / kbuild.LAYER_DIR / "sm_90a"
    manifest = kbuild.read_manifest(result.out_dir)
    assert manifest is not None and [k["name"] for k in manifest["kernels"]] == [one.name]
    assert manifest["source_hash"] == kbuild.source_hash(families=kbuild.LAYER_FAMILIES)
    assert manifest["source_hash"] != kbuild.source_hash()
    assert embedded_sm(result.out_dir / f"{one.name}.o") == 90
    monkeypatch.setenv("KIMICTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kbuild, "default_build_dir", lambda: tmp_path)
    assert kbuild.find_layer_build("sm_90a") == result.out_dir


def test_default_build_goes_to_the_cache_not_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Without `--out`, a build lands in the user's cache folder (KIMICTL_CACHE_DIR here), where
    `find_build` looks after the installed builds; nothing is written inside the package."""
    import kimictl
    from kimictl.kernels.toolchain.harness import find_build

    monkeypatch.setenv("KIMICTL_CACHE_DIR", str(tmp_path))
    default = kbuild.default_build_dir()
    assert default == tmp_path / "kernels-build"
    assert not default.is_relative_to(Path(kimictl.__file__).resolve().parent)
    assert find_build("sm_90a") is None
    (default / "sm_90a").mkdir(parents=True)
    (default / "sm_90a" / kbuild.MANIFEST).write_text("{}")
    assert find_build("sm_90a") == default / "sm_90a"
    installed = tmp_path / "kernels" / "sm_90a"  # an installed build wins
    installed.mkdir(parents=True)
    (installed / kbuild.MANIFEST).write_text("{}")
    assert find_build("sm_90a") == installed
