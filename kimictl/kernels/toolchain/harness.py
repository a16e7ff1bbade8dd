"""Device harness: link the exported objects into one shared library and call it through ctypes.

The exported `.o` files hold host launch code plus the cubin. On the GPU node they are linked with
the generated wrapper (kimictl_kernels.cpp), the DSL's small static runtime and the node's own
static CUDA runtime into `libkimictl_kernels.so`. No DSL, no JIT and no network is needed there.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = [
    "ARCH_OF_CAPABILITY",
    "LIBRARY",
    "KernelLibrary",
    "LinkError",
    "arch_of",
    "default_library",
    "find_build",
    "link",
    "open_library",
]

LIBRARY = "libkimictl_kernels.so"
# compute capability -> the arch built for it (build.ARCHES)
ARCH_OF_CAPABILITY = {(9, 0): "sm_90a", (10, 0): "sm_100a", (10, 3): "sm_103a"}


class LinkError(RuntimeError):
    """The wrapper could not be compiled or linked on this machine (message says which tool)."""


def arch_of(capability: tuple[int, int]) -> str | None:
    """The build target for a compute capability; None when kimictl ships no build for it."""
    return ARCH_OF_CAPABILITY.get((capability[0], capability[1]))


def _cuda_roots() -> list[Path]:
    roots: list[Path] = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            roots.append(Path(os.environ[env]))
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent)
    roots += [Path("/usr/local/cuda"), Path("/usr/local/cuda-13.0")]
    try:  # pip layout: nvidia/cu13/{include,lib}
        import nvidia  # type: ignore[import-not-found]

        for base in getattr(nvidia, "__path__", []):
            roots.append(Path(base) / "cu13")
    except ImportError:
        pass
    return [r for r in roots if (r / "include" / "cuda_runtime.h").is_file()]


def _static_cudart(root: Path) -> Path | None:
    for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
        p = root / sub / "libcudart_static.a"
        if p.is_file():
            return p
    return None


def link(arch_dir: Path, *, out: Path | None = None) -> Path:
    """Compile the wrapper and link every object of `arch_dir` into one .so; returns its path."""
    manifest = json.loads((arch_dir / "manifest.json").read_text())
    target = out or arch_dir / LIBRARY
    objects = [str(arch_dir / k["object"]) for k in manifest["kernels"]]
    runtime = arch_dir / "libcuda_dialect_runtime_static.a"
    if not runtime.is_file():
        raise LinkError(f"{runtime} is missing: rebuild with `kimictl kernels build`")
    roots = _cuda_roots()
    root = next((r for r in roots if _static_cudart(r)), None)
    if root is None:
        raise LinkError(
            "no CUDA toolkit headers + libcudart_static.a found (looked at CUDA_HOME, nvcc, "
            "/usr/local/cuda, pip nvidia/cu13)"
        )
    cudart = _static_cudart(root)
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise LinkError("no C++ compiler (g++) on PATH to link the kernel library")
    wrapper_obj = arch_dir / "kimictl_kernels_wrapper.o"
    include = ["-I", str(root / "include"), "-I", str(arch_dir)]
    steps = [
        [cxx, "-O2", "-fPIC", "-c", str(arch_dir / manifest["wrapper"]), *include,
         "-o", str(wrapper_obj)],
        [cxx, "-shared", "-o", str(target), str(wrapper_obj), *objects, str(runtime), str(cudart),
         "-ldl", "-lpthread", "-lrt"],
    ]  # fmt: skip
    for argv in steps:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise LinkError(
                f"{Path(argv[0]).name} failed ({proc.returncode}): {proc.stderr[-2000:]}"
            )
    return target


@dataclass
class KernelLibrary:
    """The linked kernels of one arch: `launch(name, x, w, y, r)` on torch tensors."""

    path: Path
    manifest: dict[str, Any]

    def __post_init__(self) -> None:
        self._lib = ctypes.CDLL(str(self.path))
        rc = self._lib.kimictl_load_all()
        if rc != 0:
            raise RuntimeError(f"loading the kernel modules failed with CUDA error {rc}")
        self._fns: dict[str, Any] = {}
        for entry in self.manifest["kernels"]:
            fn = getattr(self._lib, entry["symbol"])
            fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p]
            fn.restype = ctypes.c_int
            self._fns[entry["name"]] = fn

    @property
    def names(self) -> list[str]:
        return list(self._fns)

    def entry(self, name: str) -> dict[str, Any]:
        return next(k for k in self.manifest["kernels"] if k["name"] == name)

    def launch(self, name: str, x: Any, w: Any, y: Any, r: Any, stream: Any = None) -> None:
        import torch

        if stream is None:
            stream = torch.cuda.current_stream()
        n, k = w.shape
        rc = self._fns[name](
            x.data_ptr(), w.data_ptr(), y.data_ptr(), r.data_ptr(), n, k, stream.cuda_stream
        )
        if rc != 0:
            raise RuntimeError(f"{name} launch failed with CUDA error {rc}")


def find_build(arch: str, search: list[Path] | None = None) -> Path | None:
    """The first folder holding a manifest for `arch`: installed first, then the last
    `kimictl kernels build` without `--out` (both in the user's cache folder)."""
    from kimictl.core.paths import cache_dir
    from kimictl.kernels.toolchain.build import default_build_dir

    for base in search or [cache_dir() / "kernels", default_build_dir()]:
        if (base / arch / "manifest.json").is_file():
            return base / arch
    return None


@lru_cache(maxsize=4)
def _load(path: str) -> KernelLibrary:
    p = Path(path)
    return KernelLibrary(p, json.loads((p.parent / "manifest.json").read_text()))


def open_library(arch_dir: Path, *, relink: bool = False) -> KernelLibrary:
    so = arch_dir / LIBRARY
    if relink or not so.is_file():
        link(arch_dir)
    return _load(str(so))


def default_library() -> KernelLibrary:
    import torch

    arch = arch_of(torch.cuda.get_device_capability())
    if arch is None:
        raise RuntimeError("no kimictl kernel build for this GPU's compute capability")
    arch_dir = find_build(arch)
    if arch_dir is None:
        raise RuntimeError(f"no kernel build for {arch}: run `kimictl kernels install`")
    return open_library(arch_dir)
