"""Where a prebuilt CuTe DSL unit cache for a deployment lives, and whether it fits the stack.

Layout: `<kimictl cache>/cute-dsl/dsl<cutlass-dsl version>-vllm<vLLM version>-<arch>/<deployment>/`
with a `manifest.json` naming the same four facts and the unit count. `<deployment>` hashes the
distinct effective keys of the deployment's plan (plan.py), so a profile change that moves
the unit set (TP, DCP, q, capture sizes) needs another build.

Why not the DSL's own file cache: nvidia-cutlass-dsl 4.8's `cute.compile` (how vLLM 0.33.0
compiles every K3 unit) forces `no_cache=True` and `compile_only=True`
(base_dsl/compiler.py CompileCallable._compile), so `CUTE_DSL_CACHE_DIR` is never read or
written for those units; measured in docs/results.md ("CuTe DSL file cache").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kimictl.core.outputs import read_json_object
from kimictl.core.paths import cache_dir
from kimictl.kernels.toolchain.harness import ARCH_OF_CAPABILITY
from kimictl.kernels.vllm.plan import KernelPlan

if TYPE_CHECKING:
    from kimictl.deployment.spec import DeploymentSpec

__all__ = [
    "ARCHES",
    "MANIFEST",
    "PREBUILT_FAMILIES",
    "CacheLookup",
    "DeploymentCache",
    "deployment_cache",
    "deployment_hash",
    "find_cache",
    "prebuilt_root",
    "stack_folder",
]

MANIFEST = "manifest.json"
# the plan families `kimictl kernels install --vllm` builds (prebuilt.py, specialized.py)
PREBUILT_FAMILIES = frozenset(
    {"skinny_gemm", "oproj.producer", "oproj.consumer", "oproj.fused", "attn_res"}
)
# compute capability -> the arch a cache is built for: the kernel build's own table
ARCHES = ARCH_OF_CAPABILITY


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


@dataclass(frozen=True)
class DeploymentCache:
    """The prebuilt cache of one deployment on this node's stack: what doctor and serve report."""

    plan: KernelPlan  # with the arch's skinny GEMM units when the arch is known
    dsl: str | None
    vllm: str | None
    arch: str | None
    lookup: CacheLookup | None  # None when dsl, vllm or arch is unknown

    @property
    def missing(self) -> list[str]:
        """What this machine lacks to tell (package names, "GPU arch")."""
        pairs = (("nvidia-cutlass-dsl", self.dsl), ("vllm", self.vllm), ("GPU arch", self.arch))
        return [name for name, value in pairs if not value]

    @property
    def folder(self) -> Path | None:
        """The cache folder to hand vLLM (KIMICTL_VLLM_PREBUILT), when one matches."""
        return self.lookup.folder if self.lookup is not None and self.lookup.found else None

    @property
    def installable(self) -> bool:
        """`kimictl kernels install --vllm` builds part of the plan: the skinny GEMM units
        (sm_90a) or the o-proj and AttnRes units (SM100/SM103; specialized.py)."""
        return any(u.family in PREBUILT_FAMILIES for u in self.plan.units)


def deployment_cache(
    spec: DeploymentSpec,
    *,
    versions: Mapping[str, str | None],
    capability: tuple[int, int] | None,
) -> DeploymentCache | None:
    """The one lookup of `spec`'s prebuilt cache for the installed stack (`versions`: package ->
    version, as StackReport.versions(); `capability`: the GPU's). None when vLLM compiles no CuTe
    DSL unit for this deployment on this arch (nothing to prebuild)."""
    from kimictl.kernels.vllm.plan import plan_units

    arch = ARCHES.get(capability) if capability is not None else None
    plan = plan_units(spec, arch=arch)
    if not plan.units:
        return None
    dsl, vllm = versions.get("nvidia-cutlass-dsl"), versions.get("vllm")
    lookup = (
        find_cache(plan, dsl=dsl, vllm=vllm, arch=arch)
        if dsl is not None and vllm is not None and arch is not None
        else None
    )
    return DeploymentCache(plan, dsl, vllm, arch, lookup)
