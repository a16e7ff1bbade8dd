"""`kimictl serve` and the node's prebuilt CuTe DSL unit cache: hand vLLM the cache that matches.

The lookup is doctor's (runtime.kernel_cache.deployment_cache). When the profile's `[serve]
prebuilt_units` is "auto" (the default) and a cache matches this deployment and the installed
cutlass-dsl, vLLM and GPU arch, vLLM's process gets `KIMICTL_VLLM_PREBUILT=<folder>`; kimictl's
vLLM plugin (kernels.vllm_plugin, installed in vLLM's environment) loads the units before vLLM's
warmup and falls back to vLLM's JIT on any miss. Either way the operator gets one line saying what
happened, with the command that builds a missing cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kimictl.runtime.deployment.spec import PREBUILT_ENV_VAR

if TYPE_CHECKING:
    from kimictl.runtime.deployment.spec import DeploymentSpec

__all__ = ["PrebuiltChoice", "prebuilt_choice"]


@dataclass(frozen=True)
class PrebuiltChoice:
    env: dict[str, str] = field(default_factory=dict)  # added to vLLM's environment
    note: str = ""  # the one line for the operator ("" when there is nothing to prebuild)


def prebuilt_choice(
    spec: DeploymentSpec,
    *,
    profile: str,
    mode: str,
    versions: Mapping[str, str | None],
    capability: tuple[int, int] | None,
) -> PrebuiltChoice:
    """What serve adds for `spec` (profile `profile`, `[serve] prebuilt_units = mode`) on a node
    with `versions` (StackReport.versions()) and a GPU of `capability`."""
    from kimictl.runtime.kernel_cache import deployment_cache

    given = spec.env.get(PREBUILT_ENV_VAR)
    if given:  # the profile's [env] names a cache itself: it travels as it is
        return PrebuiltChoice(note=f"prebuilt CuTe units: {given} (the profile's [env] sets it).")
    if mode == "off":
        return PrebuiltChoice(
            note='prebuilt CuTe units: off ([serve] prebuilt_units = "off"); vLLM compiles its '
            "units at start-up."
        )
    cache = deployment_cache(spec, versions=versions, capability=capability)
    if cache is None:  # vLLM compiles no CuTe unit for this deployment on this arch
        return PrebuiltChoice()
    units = len(cache.plan.units)
    build = (
        f"`kimictl kernels install --vllm {profile}` on this node builds them"
        if cache.installable
        else f"`kimictl kernels plan {profile}` lists them (no prebuilt path for {cache.arch})"
    )
    if cache.lookup is None:
        return PrebuiltChoice(
            note=f"prebuilt CuTe units: none (cannot look without {', '.join(cache.missing)} "
            f"here); vLLM compiles {units}+ units at start-up."
        )
    folder = cache.folder
    if folder is None:
        return PrebuiltChoice(
            note=f"prebuilt CuTe units: none for this deployment and stack at "
            f"{cache.lookup.folder}; vLLM compiles {units}+ units at start-up; {build}."
        )
    return PrebuiltChoice(
        env={PREBUILT_ENV_VAR: str(folder)},
        note=f"prebuilt CuTe units: {folder} ({PREBUILT_ENV_VAR}; kimictl's vLLM plugin loads "
        "them, vLLM compiles any other).",
    )
