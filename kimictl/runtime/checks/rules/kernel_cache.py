"""Doctor: does a prebuilt CuTe DSL unit cache exist for this deployment and the installed stack?

Without one, vLLM 0.33.0 compiles every unit of `kimictl kernels plan` at each start on each TP
rank. Reads THIS machine's kimictl cache, so it runs on a live probe only (a snapshot of another
node says nothing about that node's disk).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kimictl.runtime.checks.rules.base import Check, Section, Status

if TYPE_CHECKING:
    from kimictl.runtime.checks.stack import StackReport
    from kimictl.runtime.deployment.spec import DeploymentSpec

__all__ = ["CHECK_ID", "kernel_cache_check"]

CHECK_ID = "stack.kernel_cache"
_ARCHES = {(9, 0): "sm_90a", (10, 0): "sm_100a", (10, 3): "sm_103a"}


def _check(status: Status, message: str, remedy: str = "") -> Check:
    return Check(CHECK_ID, Section.STACK, status, message, remedy)


def kernel_cache_check(
    spec: DeploymentSpec | None,
    stack: StackReport | None,
    capability: tuple[int, int] | None,
    *,
    live: bool = True,
) -> Check | None:
    """None when there is nothing to say (no deployment, or no CuTe units on this arch)."""
    if spec is None:
        return None
    from kimictl.runtime.kernel_cache import find_cache
    from kimictl.runtime.kernel_plan import compile_times, plan_units

    arch = _ARCHES.get(capability) if capability is not None else None
    # the specialized decode's units, plus the skinny GEMM units vLLM compiles on this arch
    plan = plan_units(spec, arch=arch)
    if not plan.units:
        return None
    times, _ = compile_times(plan)
    cost = f"{len(plan.units)}+ CuTe DSL units"
    if times:
        cost += f" (about {sum(t.vllm_seconds for t in times):.0f}+ s measured on a CPU here)"
    plan_hint = "`kimictl kernels plan PROFILE` lists them" + (
        "; `kimictl kernels install --vllm PROFILE` prebuilds the skinny GEMM units"
        if any(u.family == "skinny_gemm" for u in plan.units)
        else ""
    )
    if not live:
        return _check(
            Status.UNKNOWN,
            "Prebuilt kernel cache: not checked from snapshots (it lives on each node's disk).",
            "Run kimictl doctor on the GPU node itself.",
        )
    versions = stack.versions() if stack is not None else {}
    dsl, vllm = versions.get("nvidia-cutlass-dsl"), versions.get("vllm")
    missing = [
        n for n, v in (("nvidia-cutlass-dsl", dsl), ("vllm", vllm), ("GPU arch", arch)) if not v
    ]
    if missing or dsl is None or vllm is None or arch is None:
        return _check(
            Status.UNKNOWN,
            f"Prebuilt kernel cache: cannot tell without {', '.join(missing)} on this machine; "
            f"vLLM compiles {cost} at each start on each rank.",
            plan_hint + ".",
        )
    found = find_cache(plan, dsl=dsl, vllm=vllm, arch=arch)
    if found.found:
        return _check(
            Status.PASS,
            f"Prebuilt kernel cache for this deployment and stack (cutlass-dsl {dsl}, vLLM {vllm}, "
            f"{arch}): {found.folder}.",
        )
    why = f" ({found.problem})" if found.problem else ""
    elsewhere = (
        f"; caches exist for other stacks/deployments: {', '.join(found.others)}"
        if (found.others)
        else ""
    )
    return _check(
        Status.WARN,
        f"No prebuilt kernel cache at {found.folder}{why}{elsewhere}: vLLM compiles {cost} at "
        "each start on each TP rank.",
        plan_hint + "; setting CUTE_DSL_CACHE_DIR does not help (cute.compile bypasses the "
        "DSL's file cache).",
    )
