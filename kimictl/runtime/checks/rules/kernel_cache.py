"""Doctor: does a prebuilt CuTe DSL unit cache exist for this deployment and the installed stack?

Without one, vLLM 0.33.0 compiles every unit of `kimictl kernels plan` at each start on each TP
rank. Reads THIS machine's kimictl cache, so it runs on a live probe only (a snapshot of another
node says nothing about that node's disk).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kimictl.runtime.checks.rules.base import Check, Section, Status

if TYPE_CHECKING:
    from kimictl.deployment.spec import DeploymentSpec
    from kimictl.runtime.checks.hardware import HardwareReport
    from kimictl.runtime.checks.stack import StackReport

__all__ = ["CHECK_ID", "kernel_cache_check", "node_capability"]

CHECK_ID = "stack.kernel_cache"


def _check(status: Status, message: str, remedy: str = "") -> Check:
    return Check(CHECK_ID, Section.STACK, status, message, remedy)


def node_capability(hw: HardwareReport | None) -> tuple[int, int] | None:
    """The compute capability a cache is looked up for: the first GPU the report shows."""
    for node in hw.nodes if hw is not None else []:
        for gpu in node.gpus:
            cc = gpu.compute_capability
            if isinstance(cc, tuple):
                return int(cc[0]), int(cc[1])
    return None


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
    from kimictl.kernels.vllm.cache import deployment_cache
    from kimictl.kernels.vllm.plan import compile_times

    versions = stack.versions() if stack is not None else {}
    # the specialized decode's units, plus the skinny GEMM units vLLM compiles on this arch
    cache = deployment_cache(spec, versions=versions, capability=capability)
    if cache is None:
        return None
    plan = cache.plan
    times, _ = compile_times(plan)
    cost = f"{len(plan.units)}+ CuTe DSL units"
    if times:
        cost += f" (about {sum(t.vllm_seconds for t in times):.0f}+ s measured on a CPU here)"
    plan_hint = "`kimictl kernels plan PROFILE` lists them" + (
        "; `kimictl kernels install --vllm PROFILE` prebuilds part of them"
        if cache.installable
        else ""
    )
    if not live:
        return _check(
            Status.UNKNOWN,
            "Prebuilt kernel cache: not checked from snapshots (it lives on each node's disk).",
            "Run kimictl doctor on the GPU node itself.",
        )
    dsl, vllm, arch, found = cache.dsl, cache.vllm, cache.arch, cache.lookup
    if found is None:
        return _check(
            Status.UNKNOWN,
            f"Prebuilt kernel cache: cannot tell without {', '.join(cache.missing)} on this "
            f"machine; vLLM compiles {cost} at each start on each rank.",
            plan_hint + ".",
        )
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
