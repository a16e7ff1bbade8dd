"""Doctor (and serve): kimictl's vLLM kernels plugin (kimictl.kernels.vllm.plugin) on this node,
and its fused-layer switch (kimictl.kernels.vllm.layer_route)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kimictl.kernels.vllm.plugin import ENTRY_POINT, ENV_VAR, GROUP, plugin_status
from kimictl.runtime.checks.rules.base import Check, Section, Status

__all__ = ["RECORD_KEY", "layer_check", "plugin_check", "unrecorded_plugin_check"]

RECORD_KEY = "kimictl_plugin"  # the key of plugin_status in a snapshot's recorded stack


def unrecorded_plugin_check() -> Check:
    """A snapshot from before kimictl recorded the plugin: this machine's install says nothing
    about the recorded node's."""
    return Check(
        "kernels.vllm_plugin",
        Section.STACK,
        Status.UNKNOWN,
        "kimictl's vLLM plugin: not recorded in the snapshot (this machine's install says nothing "
        "about that node's).",
        "Re-capture it with kimictl doctor --save-snapshot FILE on the node.",
    )


def plugin_check(
    env: Mapping[str, str], arch: str | None, *, recorded: Mapping[str, Any] | None = None
) -> Check:
    """doctor's `kernels.vllm_plugin` finding: installed? enabled (in the launch env)? a table for
    this GPU? Never blocking: the plugin is optional and falls through to vLLM's plan. With
    `recorded` (a snapshot's `plugin_status`) the recorded node's install, not this machine's."""
    from kimictl.kernels.vllm.plugin import enabled

    st = plugin_status(env, arch) if recorded is None else {**recorded, "enabled": enabled(env)}
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


def layer_check(env: Mapping[str, str], arch: str | None, tp: int | None = None) -> Check | None:
    """`kernels.vllm_layer`, only when the launch env asks for the fused layer
    (`[serve] kimictl_layer = true`): are its kernels built for this GPU, and what vLLM's K3
    layers get from it at tensor parallel `tp`. Never blocking: where segment f does not serve,
    vLLM's forward does."""
    from kimictl.kernels.layer.chain import BUILT_TP
    from kimictl.kernels.toolchain.build import LAYER_FAMILIES
    from kimictl.kernels.vllm.layer_route import ENV_VAR as LAYER_VAR
    from kimictl.kernels.vllm.layer_route import SERVED

    st = plugin_status(env, arch)
    if not st["layer_enabled"]:
        return None
    cid, on = "kernels.vllm_layer", f"[serve] kimictl_layer is on ({LAYER_VAR}=1)"
    arches = sorted({a for fam in LAYER_FAMILIES.values() for a in fam.arches})
    if arch is None:
        return Check(cid, Section.STACK, Status.UNKNOWN,
                     f"{on}; no GPU seen, so its layer kernels were not looked for.")  # fmt: skip
    if arch not in arches:
        return Check(cid, Section.STACK, Status.WARN,
                     f"{on} but the fused layer is built for {', '.join(arches)} only: "
                     f"on {arch} every layer keeps vLLM's forward.")  # fmt: skip
    if st["layer_build"] is None:
        return Check(
            cid, Section.STACK, Status.WARN,
            f"{on} but this node has no built layer kernels for {arch}: the plugin routes no "
            "layer, every layer keeps vLLM's forward.",
            f"kimictl kernels build --arch {arch} (it builds the layer family too).",
        )  # fmt: skip
    if tp is not None and tp != BUILT_TP:
        return Check(
            cid, Section.STACK, Status.WARN,
            f"{on}, layer kernels built in {st['layer_build']}, but at TP {tp} the K3 "
            f"attentions' shapes are not the TP {BUILT_TP} shapes segment f is built at: every "
            "layer keeps vLLM's forward.",
        )  # fmt: skip
    where = "; ".join(
        f"{kind.upper()} at M = {', '.join(str(m) for k, m in sorted(SERVED) if k == kind)}"
        for kind in sorted({k for k, _ in SERVED})
    )
    return Check(
        cid, Section.STACK, Status.PASS,
        f"{on}, layer kernels built in {st['layer_build']}: segment f serves the bf16 K3 "
        f"attentions' projections and norms before their core ({where}, TP {BUILT_TP}), where it "
        "measured faster than vLLM's plan; everything else keeps vLLM's forward.",
    )  # fmt: skip
