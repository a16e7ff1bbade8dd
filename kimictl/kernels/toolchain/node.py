"""What `kimictl kernels install|verify|bench` do on a GPU node.

Everything here that needs a GPU goes through `require_gpu()`, which raises `Unsupported` with
what is missing (no torch, no CUDA device, no build for this arch), so a laptop or CI box gets one
sentence and exit 1. The pinned kernel stack (`kernels install --stack`) is
kimictl.runtime.checks.kernel_stack.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kimictl.core.errors import CheckFailed, InputError, Unsupported
from kimictl.core.outputs import read_json_input
from kimictl.kernels.toolchain.dispatch import DispatchTable

__all__ = [
    "InstallReport",
    "dispatch_table_path",
    "install_dir",
    "install_kernels",
    "open_node_library",
    "read_dispatch_table",
    "require_gpu",
]

DSL_HINT = 'pip install "kimictl[build]" (the pinned CuTe DSL)'


def install_dir() -> Path:
    from kimictl.core.paths import cache_dir

    return cache_dir() / "kernels"


def dispatch_table_path(arch: str) -> Path:
    return install_dir() / arch / "dispatch.json"


def read_dispatch_table(path: Path | None, arch: str | None) -> DispatchTable:
    """The table in `path` (a dispatch table, or a `kernels bench --json` report holding one), else
    the one `kimictl kernels install` recorded on this node: for `arch`, or the only one there."""
    if path is None:
        candidates = [dispatch_table_path(arch)] if arch else install_dir().glob("*/dispatch.json")
        found = sorted(f for f in candidates if f.is_file())
        if not found:
            where = f"for {arch} " if arch else ""
            raise Unsupported(
                f"no dispatch table {where}on this node (looked in {install_dir()}).",
                hint="`kimictl kernels install` on the GPU node records one; or pass --from FILE.",
            )
        if len(found) > 1:
            archs = ", ".join(f.parent.name for f in found)
            raise InputError(f"this node has dispatch tables for {archs}: pick one with --arch.")
        path = found[0]
    return read_json_input(
        path, "a kimictl dispatch table or `kernels bench --json` report", _table_from_json
    )


def _table_from_json(raw: Any) -> DispatchTable:
    if isinstance(raw, dict) and "dispatch_table" in raw:
        raw = raw["dispatch_table"]
    return DispatchTable.from_json(raw)


def require_gpu(action: str) -> tuple[Any, str]:
    """(torch, arch) on a node with a supported NVIDIA GPU; Unsupported otherwise."""
    try:
        import torch
    except ImportError as exc:
        raise Unsupported(
            f"`kimictl kernels {action}` needs PyTorch with CUDA on an NVIDIA GPU node; "
            "torch is not installed here",
            hint="run it on the GPU node (pip install kimictl[gpu]); `kimictl kernels build` "
            "works anywhere",
        ) from exc
    if not torch.cuda.is_available():
        raise Unsupported(
            f"`kimictl kernels {action}` needs an NVIDIA GPU; torch sees no CUDA device here",
            hint="run it on the GPU node; `kimictl kernels build --arch ...` works without a GPU",
        )
    from kimictl.kernels.toolchain.harness import arch_of

    cap = torch.cuda.get_device_capability()
    arch = arch_of(cap)
    if arch is None:
        raise Unsupported(
            f"compute capability {cap[0]}.{cap[1]} has no kimictl kernel build "
            "(supported: 9.0 sm_90a, 10.0 sm_100a, 10.3 sm_103a)"
        )
    return torch, arch


def open_node_library(arch: str, *, build_dir: Path | None = None) -> Any:
    from kimictl.kernels.toolchain.harness import LinkError, find_build, open_library

    arch_dir = (build_dir / arch) if build_dir else find_build(arch)
    if arch_dir is None or not (arch_dir / "manifest.json").is_file():
        raise Unsupported(
            f"no kernel build for {arch} found (looked in {install_dir()} and the source tree)",
            hint=f"run `kimictl kernels install`, or `kimictl kernels build --arch {arch}`",
        )
    try:
        return open_library(arch_dir)
    except LinkError as exc:
        raise Unsupported(f"linking the kernel library failed: {exc}") from exc


@dataclass
class InstallReport:
    arch: str
    installed_to: Path
    built: bool
    verify: dict[str, Any]
    bench_summary: dict[str, Any] | None
    table_path: Path | None
    notes: list[str] = field(default_factory=list)
    layer: str = ""  # what happened to the fused layer's build (install_layer)

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "installed_to": str(self.installed_to),
            "built": self.built,
            "verify": {k: self.verify[k] for k in ("ok", "checks", "worst_rel_err", "failed")},
            "bench": self.bench_summary,
            "dispatch_table": str(self.table_path) if self.table_path else None,
            "layer": self.layer,
            "notes": self.notes,
        }


def install_kernels(*, source: Path | None = None, run_bench: bool = True) -> InstallReport:
    """Take (or build) this arch's artifacts into the cache, link, verify, bench, save the table."""
    _torch, arch = require_gpu("install")
    from kimictl.kernels.toolchain.build import build, dsl_version, read_manifest
    from kimictl.kernels.toolchain.harness import find_build, open_library
    from kimictl.kernels.toolchain.verify import verify

    dest = install_dir() / arch
    built = False
    src = (source / arch) if source else find_build(arch)
    if src is None or read_manifest(src) is None:
        if dsl_version() is None:
            raise Unsupported(
                f"no prebuilt kernels for {arch} and the CuTe DSL is not installed to build them",
                hint=f"{DSL_HINT}, or pass --from DIR holding a `kimictl kernels build` output",
            )
        build(arch, install_dir())
        src, built = dest, True
    _replace_tree(src, dest, "*.so", "dispatch.json")
    lib = open_library(dest, relink=True)
    report = verify(lib)
    vj = report.to_json()
    (dest / "verify.json").write_text(_dumps(vj))
    if not report.ok:
        raise CheckFailed(
            f"kernel verification failed on this node: {len(vj['failed'])} of {vj['checks']} "
            f"checks (worst relative error {report.worst_rel_err:.2e}); no dispatch table written",
            hint=f"details in {dest / 'verify.json'}",
        )
    summary = None
    table_path = None
    if run_bench:
        from kimictl.kernels.toolchain.bench import bench
        from kimictl.kernels.toolchain.layer_record import LayerRecord, save_layer_record

        br = bench(lib)
        table_path = dispatch_table_path(arch)
        br.table.save(table_path)
        bench_json = br.to_json()
        (dest / "bench.json").write_text(_dumps(bench_json))
        if br.chains:  # the node's layer record: what `kernels layer` shows and `tune` reads
            save_layer_record(LayerRecord.from_json(bench_json), arch)
        s = br.summary()
        summary = {
            "geomean_speedup_dispatched": s["geomean_speedup_dispatched"],
            "points": len(s["points"]),
            "seconds": round(br.seconds, 1),
        }
    notes = [f"DSL {dsl_version() or 'not installed'} on this node"]
    layer = install_layer(arch, source)
    return InstallReport(arch, dest, built, vj, summary, table_path, notes, layer)


def install_layer(arch: str, source: Path | None = None) -> str:
    """The fused layer's build (kimictl.kernels.layer) into the node's cache, where the vLLM
    plugin's layer switch finds it: taken from `source`/layer/ARCH (a `kimictl kernels build`
    output) or the source tree's build, else built when the DSL is here; then every segment
    verified on this GPU (`verify_layer`). A build that fails a check is removed, so the switch
    keeps vLLM's forward. Returns one sentence for the report."""
    from kimictl.kernels.toolchain.build import (
        LAYER_DIR,
        LAYER_FAMILIES,
        build_layer,
        default_build_dir,
        dsl_version,
        read_manifest,
    )
    from kimictl.kernels.toolchain.harness import open_library
    from kimictl.kernels.toolchain.verify import verify_layer

    if not any(arch in fam.arches for fam in LAYER_FAMILIES.values()):
        return f"the fused layer is not built for {arch}"
    dest = install_dir() / LAYER_DIR / arch
    src = (source or default_build_dir()) / LAYER_DIR / arch
    if read_manifest(src) is None:
        if dsl_version() is None:
            return f"no layer build in {src.parent} and no CuTe DSL to build one: not installed"
        build_layer(arch, install_dir())
        src = dest
    _replace_tree(src, dest, "*.so")
    checks = verify_layer(open_library(dest, relink=True))
    failed = [c.name for c in checks if not c.ok]
    (dest / "verify.json").write_text(_dumps([asdict(c) for c in checks]))
    if failed:
        shutil.rmtree(dest)
        return (
            f"{len(failed)} of {len(checks)} layer segment checks failed "
            f"({', '.join(failed[:4])}): not installed, the layer switch keeps vLLM's forward"
        )
    return f"{len(checks)} layer segments verified and installed in {dest}"


def _replace_tree(src: Path, dest: Path, *ignore: str) -> None:
    """A build folder into the cache (`dest` replaced), leaving out `ignore` (linked libraries
    are relinked on the node; node records are its own)."""
    if src.resolve() != dest.resolve():
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns(*ignore))


def _dumps(obj: Any) -> str:

    return json.dumps(obj, indent=1, default=str)
