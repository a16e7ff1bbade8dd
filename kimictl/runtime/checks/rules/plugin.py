"""Doctor: kimictl's vLLM kernels plugin (kimictl.kernels.vllm.plugin) on this node."""

from __future__ import annotations

from collections.abc import Mapping

from kimictl.kernels.vllm.plugin import ENTRY_POINT, ENV_VAR, GROUP, plugin_status
from kimictl.runtime.checks.rules.base import Check, Section, Status

__all__ = ["plugin_check"]


def plugin_check(env: Mapping[str, str], arch: str | None) -> Check:
    """doctor's `kernels.vllm_plugin` finding: installed? enabled (in the launch env)? a table for
    this GPU? Never blocking: the plugin is optional and falls through to vLLM's plan."""
    st = plugin_status(env, arch)
    cid = "kernels.vllm_plugin"
    if not st["installed"]:
        return Check(
            cid,
            Section.STACK,
            Status.WARN if st["enabled"] else Status.UNKNOWN,
            f"kimictl's vLLM plugin is not installed (no {GROUP} entry point {ENTRY_POINT!r}).",
            "pip install kimictl into vLLM's environment to let vLLM load it.",
        )
    if not st["enabled"]:
        return Check(
            cid,
            Section.STACK,
            Status.PASS,
            f"kimictl's vLLM plugin is installed and off ({ENV_VAR} not set): vLLM's own plan.",
        )
    if st["table"] is None:
        return Check(
            cid,
            Section.STACK,
            Status.WARN,
            f"kimictl's vLLM plugin is enabled but this node has no dispatch table for "
            f"{arch or 'this GPU'}: it installs nothing.",
            "kimictl kernels install on the GPU node (with vLLM installed, for three-way timings).",
        )
    three = st["three_way_points"]
    return Check(
        cid,
        Section.STACK,
        Status.PASS if three else Status.WARN,
        f"kimictl's vLLM plugin is installed and enabled; table {st['table']} has {three} "
        "points timed against vLLM's plan"
        + ("." if three else ": without them it keeps vLLM's plan everywhere."),
        "" if three else "Re-run kimictl kernels bench on a node with vLLM installed.",
    )
