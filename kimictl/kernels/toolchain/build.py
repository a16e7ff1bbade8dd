"""Ahead-of-time build: compile every kernel variant for one arch on any machine (no GPU needed),
export each as a C header + x86-64 object with the cubin inside, write one C wrapper exposing a
flat entry point per variant, and a manifest (kernel, arch, DSL version, source hash).

The device side (`harness`) links wrapper + objects + the DSL's small static runtime into one
shared library and calls it through ctypes (docs/kernels.md).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import struct
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kimictl.core.errors import InputError
from kimictl.core.outputs import atomic_write

__all__ = [
    "ARCHES",
    "FAMILIES",
    "LAYER_CONFIGS",
    "LAYER_DIR",
    "LAYER_FAMILIES",
    "BuildResult",
    "Family",
    "build",
    "build_layer",
    "default_build_dir",
    "dsl_version",
    "embedded_sm",
    "find_layer_build",
    "gpu_layer_build",
    "read_manifest",
    "source_hash",
]

ARCHES = ("sm_90a", "sm_100a", "sm_103a")
DSL_DIST = "nvidia-cutlass-dsl"
MANIFEST = "manifest.json"
WRAPPER = "kimictl_kernels.cpp"
RUNTIME_LIB = "libcuda_dialect_runtime_static.a"


@dataclass(frozen=True)
class Family:
    """One kernel family: module `module` holds its configs and its compile function; an object is
    stale when one of `sources` (dotted module names: the family's own files and the shipped ones
    its kernel body extends) changes."""

    module: str
    configs: str  # attribute: tuple of frozen configs (each has .name, .kernel, .m, .rows)
    compile: str  # attribute: (cfg, arch) -> compiled DSL function
    sources: tuple[str, ...]
    arches: tuple[str, ...] = ARCHES  # a Hopper-only family (wgmma) lists sm_90a alone

    def load(self) -> Any:
        """The family's module (configs and compile function; the DSL itself loads lazily)."""
        return importlib.import_module(self.module)


def _gemm(*names: str) -> tuple[str, ...]:
    return tuple(f"kimictl.kernels.gemm.{n}" for n in names)


# What `kimictl kernels build` compiles and what the manifest's source hash covers. A family of
# lab/ (an experiment) is built by passing its configs and `families=` to build().
FAMILIES: dict[str, Family] = {
    "wstream_gemm": Family(
        "kimictl.kernels.gemm.wstream_gemm", "CONFIGS", "_compile_wstream",
        _gemm("wstream_gemm", "wstream_gemm_dsl", "aot", "rowblock_dsl"),
    ),
    "tcstream_gemm": Family(
        "kimictl.kernels.gemm.tcstream_gemm", "TC_CONFIGS", "_compile_tcstream",
        _gemm("tcstream_gemm", "tcstream_gemm_dsl", "aot", "rowblock_dsl"),
    ),
    "tcpipe_gemm": Family(
        "kimictl.kernels.gemm.tcpipe_gemm", "PIPE_CONFIGS", "_compile_tcpipe",
        _gemm("tcpipe_gemm", "tcpipe_gemm_dsl", "aot", "rowblock_dsl"),
    ),
    "wgmma_gemm": Family(
        "kimictl.kernels.gemm.wgmma_gemm", "WGMMA_CONFIGS", "_compile_wgmma",
        _gemm("wgmma_gemm", "wgmma_gemm_dsl", "aot", "rowblock_dsl"), arches=("sm_90a",),
    ),
    # warp-specialised rival of vLLM's dsv3_fused_a: ships the variants that beat it on the H200
    # (WS_SHIPPED); lab/bench/dsv3_cells_h200.py builds the whole sweep (WS_CONFIGS)
    "tcws_gemm": Family(
        "kimictl.kernels.gemm.tcws_gemm", "WS_SHIPPED", "_compile_tcws",
        _gemm("tcws_gemm", "tcws_gemm_dsl", "tcpipe_gemm_dsl", "aot", "rowblock_dsl"),
        arches=("sm_90a",),
    ),
}  # fmt: skip

ALL_CONFIGS: tuple[Any, ...] = tuple(
    cfg for fam in FAMILIES.values() for cfg in getattr(fam.load(), fam.configs)
)

# The fused dense decode layer: three persistent kernels per (kind, M), built by the same tool
# (`build(arch, out, configs=LAYER_CONFIGS, families=LAYER_FAMILIES)`) and verified on their own
# (lab/bench/layer_h200.py --chain-shipped), so their source hash is apart from the GEMMs'.
LAYER_FAMILIES: dict[str, Family] = {
    "layer_chain": Family(
        "kimictl.kernels.layer.chain", "CHAIN_SHIPPED", "_compile_chain",
        tuple(f"kimictl.kernels.layer.{n}" for n in ("chain", "chain_dsl", "elem", "elem_dsl",
                                                       "ops")),
        arches=("sm_90a",),
    ),
}  # fmt: skip
LAYER_CONFIGS: tuple[Any, ...] = tuple(
    cfg for fam in LAYER_FAMILIES.values() for cfg in getattr(fam.load(), fam.configs)
)


LAYER_DIR = "layer"  # the layer family builds into <build folder>/layer/<arch>, its own manifest


def default_build_dir() -> Path:
    """Where `kimictl kernels build` writes without `--out`: the user's cache folder
    (kimictl.core.paths), beside the installed builds, never the installed package."""
    from kimictl.core.paths import cache_dir

    return cache_dir() / "kernels-build"


def find_layer_build(arch: str) -> Path | None:
    """The layer family's build for `arch`: installed first, then the last `kimictl kernels build`
    without `--out` (None: none)."""
    from kimictl.core.paths import cache_dir
    from kimictl.kernels.toolchain.harness import find_build

    return find_build(arch, [cache_dir() / "kernels" / LAYER_DIR, default_build_dir() / LAYER_DIR])


def gpu_layer_build() -> Path | None:
    """find_layer_build for the GPU torch sees (None: no arch kimictl builds for, or no build)."""
    import torch

    from kimictl.kernels.toolchain.harness import arch_of

    arch = arch_of(torch.cuda.get_device_capability())
    return find_layer_build(arch) if arch else None


def _source_file(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(module)
    return Path(spec.origin)


def _code_only(tree: ast.Module) -> ast.Module:
    """The syntax tree without docstrings: what the kernel compiles from (comments and
    formatting never reach the tree)."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


def source_hash(kernel: str | None = None, families: Mapping[str, Family] = FAMILIES) -> str:
    """sha256 over the kernel sources' syntax trees, docstrings left out (one kernel's, or every
    shipped kernel's): a build is stale when the code changes, not when its prose does."""
    h = hashlib.sha256()
    fams = [families[kernel]] if kernel else list(families.values())
    for module in (m for fam in fams for m in fam.sources):
        h.update(f"{module.rsplit('.', 1)[-1]}.py".encode())
        tree = _code_only(ast.parse(_source_file(module).read_text()))
        h.update(ast.dump(tree).encode())
    return h.hexdigest()[:16]


def dsl_version() -> str | None:
    try:
        return importlib.metadata.version(DSL_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class BuildResult:
    arch: str
    out_dir: Path
    kernels: list[dict[str, Any]]
    seconds: float
    reused: int

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "out_dir": str(self.out_dir),
            "kernels": len(self.kernels),
            "reused": self.reused,
            "seconds": round(self.seconds, 2),
        }


def embedded_sm(obj: Path) -> int | None:
    """SM number of the CUDA ELF (e_machine 190) inside an exported host object, None if none."""
    data = obj.read_bytes()
    i = data.find(b"\x7fELF", 1)
    while i >= 0:
        if struct.unpack_from("<H", data, i + 18)[0] == 190:
            return (struct.unpack_from("<I", data, i + 0x30)[0] >> 8) & 0xFF
        i = data.find(b"\x7fELF", i + 4)
    return None


def read_manifest(arch_dir: Path) -> dict[str, Any] | None:
    path = arch_dir / MANIFEST
    if not path.is_file():
        return None
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data


# Struct fields the exported header declares per tensor; values are filled in this order.
_DYNAMIC = {
    "mX": (["k"], ["k"]),
    "mW": (["n", "k"], ["k"]),
    "mY": (["n"], ["n"]),
    "mR": (["n"], ["n"]),
}
_STRUCT = re.compile(
    r"typedef struct \{\s*void \*data;(?P<body>.*?)\}\s*(?P<prefix>\w+)_Tensor_(?P<t>m[XWYR])_t;",
    re.S,
)
_ARRAY = re.compile(r"(int32_t|int64_t) dynamic_(shapes|strides)\[(\d+)\]")


def _tensor_init(tensor: str, body: str) -> str:
    shapes, strides = _DYNAMIC[tensor]
    parts = ["(void*)" + {"mX": "x", "mW": "w", "mY": "y", "mR": "r"}[tensor]]
    for _ctype, kind, count in _ARRAY.findall(body):
        values = shapes if kind == "shapes" else strides
        n = int(count)
        if n > len(values):
            raise RuntimeError(
                f"exported header has {n} dynamic {kind} for {tensor}; expected <= {len(values)}"
            )
        parts.append("{" + ", ".join(values[:n]) + "}")
    return "{" + ", ".join(parts) + "}"


def _wrapper_source(entries: list[tuple[str, str]]) -> str:
    """entries: (variant name, header text). One flat C entry point per variant."""
    lines = [
        "// Generated by kimictl.kernels.toolchain.build: do not edit.",
        "#include <cuda_runtime.h>",
        "#include <stdint.h>",
    ]
    for name, _ in entries:
        lines.append(f'#include "{name}.h"')
    for name, _ in entries:
        lines.append(f"static k_{name}_Kernel_Module_t g_{name};")
    lines.append('extern "C" int kimictl_load_all(void) {')
    for name, _ in entries:
        lines.append(f"  k_{name}_Kernel_Module_Load(&g_{name});")
    lines.append("  return (int)cudaGetLastError();")
    lines.append("}")
    lines.append(f'extern "C" int kimictl_count(void) {{ return {len(entries)}; }}')
    for name, header in entries:
        found = {m["t"]: m["body"] for m in _STRUCT.finditer(header)}
        missing = {"mX", "mW", "mY", "mR"} - set(found)
        if missing:
            raise RuntimeError(f"{name}.h lacks tensor structs {sorted(missing)}")
        lines.append(
            f'extern "C" int kimictl_{name}(void* x, void* w, void* y, void* r, '
            "int32_t n, int32_t k, void* stream) {"
        )
        for t in ("mX", "mW", "mY", "mR"):
            lines.append(f"  k_{name}_Tensor_{t}_t t_{t} = {_tensor_init(t, found[t])};")
        lines.append(
            f"  return (int)cute_dsl_k_{name}_wrapper(&g_{name}, &t_mX, &t_mW, &t_mY, &t_mR, "
            "(cudaStream_t)stream);"
        )
        lines.append("}")
    return "\n".join(lines) + "\n"


def _runtime_lib_dir() -> Path | None:
    try:
        from cutlass.cute.export import aot_config  # type: ignore[import-not-found]

        get = getattr(aot_config, "get_libdir", None) or getattr(aot_config, "_get_libdir", None)
        if get is not None:
            return Path(get())
    except Exception:  # fall through to the wheel layout
        pass
    try:
        import cutlass

        root = Path(cutlass.__file__).resolve().parents[2]  # .../nvidia_cutlass_dsl
        for sub in ("cu13/lib", "lib"):
            if (root / sub / RUNTIME_LIB).is_file():
                return root / sub
    except Exception:  # no DSL: the caller reports it
        return None
    return None


def build(
    arch: str,
    out: Path | None = None,
    *,
    configs: Iterable[Any] | None = None,
    families: Mapping[str, Family] = FAMILIES,
    progress: Callable[[int, int, str], None] | None = None,
) -> BuildResult:
    """Compile and export every variant for `arch` into `out/arch/`. Reuses objects whose manifest
    entry has the same source hash and DSL version; `families` names the family of every config
    (FAMILIES plus a lab experiment's). Raises RuntimeError with the variant's name."""
    if arch not in ARCHES:
        raise ValueError(f"arch must be one of {', '.join(ARCHES)}, got {arch!r}")
    version = dsl_version()
    if version is None:
        raise ModuleNotFoundError(DSL_DIST)
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass.cute as cute  # noqa: F401  (fails early if the compiler wheel is missing)

    chosen = [
        cfg
        for cfg in (configs if configs is not None else ALL_CONFIGS)
        if arch in families[cfg.kernel].arches  # e.g. wgmma exists on Hopper only
    ]
    kernels_used = {cfg.kernel for cfg in chosen}
    compilers: dict[str, Callable[[Any, str], Any]] = {
        k: getattr(families[k].load(), families[k].compile) for k in kernels_used
    }
    stamps = {k: f"{source_hash(k, families)} {version}" for k in kernels_used}

    arch_dir = (out or default_build_dir()) / arch
    try:
        arch_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, no permission: the user's input, not a bug
        raise InputError(f"cannot use {arch_dir} as the build folder ({exc.strerror})") from exc
    src_hash = source_hash(families=families)
    t0 = time.perf_counter()
    kernels: list[dict[str, Any]] = []
    entries: list[tuple[str, str]] = []
    reused = 0
    for i, cfg in enumerate(chosen):
        name = cfg.name
        obj, hdr = arch_dir / f"{name}.o", arch_dir / f"{name}.h"
        if progress:
            progress(i, len(chosen), name)
        side = arch_dir / f"{name}.stamp"  # source hash + DSL version the object was built from
        stamp = stamps[cfg.kernel]
        if obj.is_file() and hdr.is_file() and side.is_file() and side.read_text() == stamp:
            reused += 1
        else:
            try:
                compiled = compilers[cfg.kernel](cfg, arch)
                compiled.export_to_c(str(arch_dir), name, function_prefix=f"k_{name}")
            except Exception as exc:
                raise RuntimeError(f"building {name} for {arch} failed: {exc}") from exc
            side.write_text(stamp)
        # the cubin inside must be for the arch asked (a stray CUTE_DSL_ARCH must not slip through)
        sm = embedded_sm(obj)
        if sm != int(arch[3:-1]):
            raise RuntimeError(f"{name}.o holds a cubin for sm_{sm}, not {arch}: rebuild it")
        header = hdr.read_text()
        entries.append((name, header))
        kernels.append(
            {
                "name": name,
                "kernel": cfg.kernel,
                "rows": cfg.rows,
                "symbol": f"kimictl_{name}",
                "object": obj.name,
                "sha256": hashlib.sha256(obj.read_bytes()).hexdigest()[:16],
                **asdict(cfg),
            }
        )
    (arch_dir / WRAPPER).write_text(_wrapper_source(entries))
    lib_dir = _runtime_lib_dir()
    if lib_dir is not None and (lib_dir / RUNTIME_LIB).is_file():
        shutil.copy2(lib_dir / RUNTIME_LIB, arch_dir / RUNTIME_LIB)
    manifest = {
        "arch": arch,
        "dsl": DSL_DIST,
        "dsl_version": version,
        "source_hash": src_hash,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wrapper": WRAPPER,
        "runtime_lib": RUNTIME_LIB if (arch_dir / RUNTIME_LIB).is_file() else None,
        "kernels": kernels,
    }
    atomic_write(arch_dir / MANIFEST, json.dumps(manifest, indent=1))
    return BuildResult(arch, arch_dir, kernels, time.perf_counter() - t0, reused)


def build_layer(
    arch: str, out: Path | None = None, *, progress: Callable[[int, int, str], None] | None = None
) -> BuildResult | None:
    """The fused dense layer family into `out/layer/arch` (None: the family has no `arch`)."""
    if not any(arch in fam.arches for fam in LAYER_FAMILIES.values()):
        return None
    base = (out or default_build_dir()) / LAYER_DIR
    return build(arch, base, configs=LAYER_CONFIGS, families=LAYER_FAMILIES, progress=progress)
