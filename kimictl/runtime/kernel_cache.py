"""Where a prebuilt CuTe DSL unit cache for a deployment lives, and whether it fits the stack.

Layout: `<kimictl cache>/cute-dsl/dsl<cutlass-dsl version>-vllm<vLLM version>-<arch>/<deployment>/`
with a `manifest.json` naming the same four facts and the unit count. `<deployment>` hashes the
distinct effective keys of the deployment's plan (kernel_plan.py), so a profile change that moves
the unit set (TP, DCP, q, capture sizes) needs another build.

Why not the DSL's own file cache: nvidia-cutlass-dsl 4.8's `cute.compile` (how vLLM 0.33.0
compiles every K3 unit) forces `no_cache=True` and `compile_only=True`
(base_dsl/compiler.py CompileCallable._compile), so `CUTE_DSL_CACHE_DIR` is never read or
written for those units; measured in benchmarks/RESULTS.md ("CuTe DSL file cache").
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from kimictl.runtime.kernel_plan import KernelPlan
from kimictl.runtime.outputs import read_json_object
from kimictl.runtime.paths import cache_dir

__all__ = [
    "MANIFEST",
    "CacheLookup",
    "deployment_hash",
    "find_cache",
    "prebuilt_root",
    "stack_folder",
]

MANIFEST = "manifest.json"


def prebuilt_root() -> Path:
    return cache_dir() / "cute-dsl"


def stack_folder(dsl: str, vllm: str, arch: str) -> Path:
    """The versioned folder of one (DSL, vLLM, arch) stack."""
    return prebuilt_root() / f"dsl{dsl}-vllm{vllm}-{arch}"


def deployment_hash(plan: KernelPlan) -> str:
    """12 hex digits over the plan's distinct effective keys (order-free)."""
    keys = sorted({json.dumps([u.family, list(u.effective)]) for u in plan.units})
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class CacheLookup:
    folder: Path  # where this deployment's cache would be
    found: bool  # a manifest there that names this stack and deployment
    others: tuple[
        str, ...
    ]  # caches built for other stacks or deployments ("dsl...-vllm...-arch/hash")
    problem: str = ""  # why a manifest at `folder` was not accepted


def find_cache(plan: KernelPlan, *, dsl: str, vllm: str, arch: str) -> CacheLookup:
    """The prebuilt cache for `plan` on the installed (dsl, vllm, arch), or what exists instead."""
    digest = deployment_hash(plan)
    folder = stack_folder(dsl, vllm, arch) / digest
    manifest = read_json_object(folder / MANIFEST)
    want = {"cutlass_dsl": dsl, "vllm": vllm, "arch": arch, "deployment": digest}
    problem = ""
    if manifest is not None:
        wrong = [k for k, v in want.items() if manifest.get(k) != v]
        if not wrong:
            return CacheLookup(folder, True, ())
        problem = ", ".join(f"{k} {manifest.get(k)!r} (want {want[k]!r})" for k in wrong)
    elif (folder / MANIFEST).exists():
        problem = f"{folder / MANIFEST} is not readable JSON"
    others = []
    root = prebuilt_root()
    for found in sorted(root.glob(f"*/*/{MANIFEST}")) if root.is_dir() else []:
        name = f"{found.parent.parent.name}/{found.parent.name}"
        if found.parent != folder:
            others.append(name)
    return CacheLookup(folder, False, tuple(others), problem)
