"""`kimictl serve` and the node's prebuilt CuTe DSL unit cache: hand vLLM the cache that matches.

The lookup is doctor's (kernels.vllm.cache.deployment_cache). When the profile's `[serve]
prebuilt_units` is "auto" (the default) and a cache matches this deployment and the installed
cutlass-dsl, vLLM and GPU arch, vLLM's process gets `KIMICTL_VLLM_PREBUILT=<folder>`; kimictl's
vLLM plugin (kimictl.kernels.vllm.plugin, in vLLM's environment) loads the units before vLLM's
warmup and falls back to vLLM's JIT on any miss. Either way the operator gets one line saying what
happened, with the command that builds a missing cache. The units only load where the plugin is
installed in the environment of the `vllm` that serve launches, which can differ from kimictl's own:
serve asks that environment's Python and, when the plugin is absent there, says so and sets nothing.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kimictl.deployment.spec import PREBUILT_ENV_VAR

if TYPE_CHECKING:
    from kimictl.deployment.spec import DeploymentSpec

__all__ = ["PrebuiltChoice", "plugin_in_env_of", "prebuilt_choice"]


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
    plugin_check: Callable[[], tuple[bool | None, str]] | None = None,
) -> PrebuiltChoice:
    """What serve adds for `spec` (profile `profile`, `[serve] prebuilt_units = mode`) on a node
    with `versions` (StackReport.versions()) and a GPU of `capability`; `plugin_check` (run only
    when a cache matches) answers whether vLLM's environment has kimictl's plugin, and where."""
    from kimictl.kernels.vllm.cache import deployment_cache

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
    has_plugin, where = plugin_check() if plugin_check is not None else (None, "")
    if has_plugin is False:
        return PrebuiltChoice(
            note=f"prebuilt CuTe units: {folder} matches, but kimictl's vLLM plugin is not "
            f"installed in vLLM's environment ({where}), so vLLM would not load them and compiles "
            f"{units}+ units at start-up; `{where} -m pip install kimictl` installs it there."
        )
    return PrebuiltChoice(
        env={PREBUILT_ENV_VAR: str(folder)},
        note=f"prebuilt CuTe units: {folder} ({PREBUILT_ENV_VAR}; kimictl's vLLM plugin loads "
        "them, vLLM compiles any other).",
    )


def plugin_in_env_of(executable: str = "vllm", timeout: float = 30.0) -> tuple[bool | None, str]:
    """Whether the Python behind the `executable` console script (on PATH) has kimictl's vLLM
    plugin entry point, and that Python's path; None when it cannot be told (no such script, not
    a Python script, the interpreter failed or hung)."""
    from kimictl.kernels.vllm.plugin import ENTRY_POINT, GROUP

    found = shutil.which(executable)
    if found is None:
        return None, executable
    try:
        with open(found, "rb") as fh:
            first = fh.readline(4096).decode(errors="replace").strip()
    except OSError:
        return None, found
    if not first.startswith("#!"):
        return None, found
    words = first[2:].split()
    python = words[-1] if words and Path(words[0]).name == "env" else (words[0] if words else "")
    if not python or "python" not in Path(python).name:
        return None, found
    code = (
        "import importlib.metadata as m, sys\n"
        f"sys.exit(0 if any(e.name == {ENTRY_POINT!r} for e in m.entry_points(group={GROUP!r}))"
        " else 3)"
    )
    try:
        # cwd "/": `-c` puts the cwd on sys.path, and a source tree's egg-info would answer
        done = subprocess.run(
            [python, "-c", code], capture_output=True, timeout=timeout, cwd=Path("/")
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, python
    if done.returncode in (0, 3):
        return done.returncode == 0, python
    return None, python
