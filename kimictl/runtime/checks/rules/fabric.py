"""Fabric and multicast checks of one TP group: NVLink, P2P, the NVLink fabric and clique,
multicast, IMEX."""

from __future__ import annotations

from collections import defaultdict

from kimictl.deployment.cluster import CLIQUE_LABEL
from kimictl.deployment.k3 import (
    MULTICAST_ERRORS,
)
from kimictl.runtime.checks.hardware import GpuInfo, HardwareReport, NodeReport, Unavailable
from kimictl.runtime.checks.rules._names import _gpus_where, _list, _where
from kimictl.runtime.checks.rules.base import Check, Section, Status

__all__ = [
    "fabric_checks",
    "imex_check",
    "multicast_check",
    "nvlink_check",
    "p2p_check",
    "pod_view_check",
]

F = Section.FABRIC


# ------------------------------------------------------------------------------------------ fabric


def nvlink_check(hw: HardwareReport) -> Check | None:
    multi = len(hw.nodes) > 1
    gpus = [(n, g) for n in hw.nodes for g in n.gpus if g.lost is None]
    if not gpus:
        return None
    down: list[tuple[NodeReport, GpuInfo]] = []
    unknown: list[str] = []
    counts: set[int] = set()
    for node, gpu in gpus:
        active = gpu.active_nvlinks
        if isinstance(active, Unavailable):
            unknown.append(f"{_where(node, gpu, multi)}: {active.reason}")
        elif active == 0:
            down.append((node, gpu))
        else:
            counts.add(active)
    if down:
        return Check(
            "fabric.nvlink",
            F,
            Status.FAIL,
            f"No active NVLink on {_gpus_where(down, multi)}.",
            "Check the NVLink cabling/trays and `nvidia-smi nvlink --status`; a tray with links "
            "down cannot join the TP group.",
        )
    if unknown:
        return Check(
            "fabric.nvlink", F, Status.UNKNOWN, f"NVLink state not read: {_list(unknown)}."
        )
    shown = "/".join(str(c) for c in sorted(counts))
    most = max(counts)
    fewer = [
        (n, g) for n, g in gpus if isinstance(g.active_nvlinks, int) and g.active_nvlinks < most
    ]
    versions = sorted(
        {
            str(link.version)
            for _, g in gpus
            if isinstance(g.nvlinks, list)
            for link in g.nvlinks
            if link.active is True and isinstance(link.version, str)
        }
    )
    if fewer:  # a GPU with links down still talks, at a fraction of the bandwidth
        return Check(
            "fabric.nvlink",
            F,
            Status.WARN,
            f"NVLinks down on {_gpus_where(fewer, multi)}: {shown} active per GPU (others have "
            f"{most}); all-reduces through those GPUs run slower.",
            "Check `nvidia-smi nvlink --status` on the listed GPUs; reseat or replace the link.",
        )
    if len(versions) > 1:
        return Check(
            "fabric.nvlink",
            F,
            Status.WARN,
            f"Mixed NVLink generations in one TP group: {', '.join(versions)}.",
            "Use one GPU/NVLink generation for every rank of the TP group.",
        )
    return Check("fabric.nvlink", F, Status.PASS, f"{shown} active NVLinks per GPU.")


def p2p_check(hw: HardwareReport) -> Check | None:
    bad: list[str] = []
    pairs = 0
    for node in hw.nodes:
        if isinstance(node.p2p, Unavailable):
            continue
        lost = {g.index for g in node.gpus if g.lost is not None}
        for pair in node.p2p:
            if pair.a in lost or pair.b in lost:
                continue  # reported once, by hw.gpu_count
            pairs += 1
            if pair.status != "ok":
                prefix = f"{node.hostname} " if len(hw.nodes) > 1 else ""
                bad.append(f"{prefix}GPU {pair.a}<->{pair.b} {pair.status}")
    if bad:
        return Check(
            "fabric.p2p",
            F,
            Status.FAIL,
            f"NVLink P2P not available: {_list(bad)}.",
            "Check `nvidia-smi topo -p2p n`; fix NVLink or fabric manager before serving.",
        )
    if pairs:
        return Check("fabric.p2p", F, Status.PASS, f"NVLink P2P OK for all {pairs} GPU pairs.")
    return None


def fabric_checks(hw: HardwareReport) -> list[Check]:
    multi = len(hw.nodes) > 1
    gpus = [(n, g) for n in hw.nodes for g in n.gpus if g.lost is None]
    if not gpus:
        return []
    checks: list[Check] = []
    unsupported: list[str] = []
    unknown: list[str] = []
    cliques: dict[tuple[str, int], list[str]] = defaultdict(list)
    pending: dict[str, list[tuple[NodeReport, GpuInfo]]] = defaultdict(list)
    for node, gpu in gpus:
        fabric = gpu.fabric
        where = _where(node, gpu, multi)
        if isinstance(fabric, Unavailable):
            if "not supported" in fabric.reason:
                unsupported.append(where)
            else:
                unknown.append(f"{where}: {fabric.reason}")
            continue
        if fabric.state == "not_supported":
            unsupported.append(where)
        elif fabric.state != "completed" or fabric.status != "success":
            pending[f"state {fabric.state}, status {fabric.status}"].append((node, gpu))
        else:
            # A zero cluster UUID is a single-node NVSwitch fabric (HGX H100/H200: seen on the
            # lent 2 x H200): clique 0 there names no domain shared with other nodes.
            uuid = fabric.cluster_uuid
            key = (
                uuid if uuid != _NO_CLUSTER else f"{_NODE_ONLY}{node.hostname}",
                fabric.clique_id,
            )
            cliques[key].append(node.hostname if multi else f"GPU {gpu.index}")
    not_done = [f"{_gpus_where(items, multi)} ({why})" for why, items in pending.items()]
    if not_done:
        checks.append(
            Check(
                "fabric.state",
                F,
                Status.FAIL,
                f"NVLink fabric registration not completed: {_list(not_done)}.",
                "Check the fabric services on each listed node: systemctl status "
                "nvidia-fabricmanager nvidia-imex (and the NVLink switch trays' NMX); then re-run "
                "kimictl doctor.",
            )
        )
    elif unsupported and multi:
        checks.append(
            Check(
                "fabric.state",
                F,
                Status.FAIL,
                f"No NVLink fabric on {_list(unsupported)}: these GPUs cannot share an NVLink "
                "domain with other nodes.",
                "Run a multi-node TP group only on NVLink-fabric systems (GB200/GB300 NVL72).",
            )
        )
    elif unsupported:
        checks.append(
            Check(
                "fabric.state",
                F,
                Status.WARN,
                "GPU fabric info not supported here (not an NVLink-fabric system such as GB300 "
                "NVL72): only a TP group inside this node is possible.",
                "",
            )
        )
    elif unknown:
        checks.append(
            Check("fabric.state", F, Status.UNKNOWN, f"Fabric state not read: {_list(unknown)}.")
        )
    else:
        checks.append(
            Check(
                "fabric.state",
                F,
                Status.PASS,
                f"Fabric registration completed on {len(gpus)} GPU{'' if len(gpus) == 1 else 's'}.",
            )
        )
    if len(cliques) > 1:
        groups = "; ".join(
            f"{_clique_name(uuid, cid)}: {_list(sorted(set(members)))}"
            for (uuid, cid), members in sorted(cliques.items(), key=lambda kv: -len(kv[1]))
        )
        checks.append(
            Check(
                "fabric.clique",
                F,
                Status.FAIL,
                f"The TP group spans {len(cliques)} NVLink cliques ({groups}); all TP ranks must "
                "share one NVLink domain.",
                "Place every node of the TP group in one NVLink partition (same cluster UUID and "
                "clique id): the specialized path's multicast buffers span the whole TP group.",
            )
        )
    elif len(cliques) == 1:
        (uuid, cid), members = next(iter(cliques.items()))
        what = (
            "One single-node NVSwitch fabric (cluster UUID 0: no multi-node NVLink partition)"
            if uuid.startswith(_NODE_ONLY)
            else f"One NVLink clique (cluster {uuid}, clique {cid})"
        )
        noun = "GPU" if len(members) == 1 else "GPUs"
        checks.append(
            Check("fabric.clique", F, Status.PASS, f"{what} for all {len(members)} {noun}.")
        )
    return checks


_NO_CLUSTER = "00000000-0000-0000-0000-000000000000"
_NODE_ONLY = "node-only:"


def _clique_name(uuid: str, cid: int) -> str:
    if uuid.startswith(_NODE_ONLY):
        return f"{uuid[len(_NODE_ONLY) :]}'s own NVSwitch fabric (cluster UUID 0)"
    return f"clique {cid} of cluster {uuid[:8]}"


def multicast_check(hw: HardwareReport) -> Check | None:
    multi = len(hw.nodes) > 1
    gpus = [(n, g) for n in hw.nodes for g in n.gpus if g.lost is None]
    if not gpus:
        return None
    off_gpus = [(n, g) for n, g in gpus if g.multicast_supported is False]
    unknown = [
        f"{_where(n, g, multi)}: {g.multicast_supported.reason}"
        for n, g in gpus
        if isinstance(g.multicast_supported, Unavailable)
    ]
    if off_gpus:
        return Check(
            "fabric.multicast",
            F,
            Status.FAIL,
            f"Multicast (NVLS) not supported on {_gpus_where(off_gpus, multi)}: vLLM will raise "
            f'"{MULTICAST_ERRORS[0]}".',
            "Multicast needs GPUs joined by NVLink switches (NVSwitch, GB300 NVL72) with the "
            "fabric registered: check the Fabric block of `nvidia-smi -q` (State Completed) and "
            "that nvidia-fabricmanager / nvidia-imex run. A PCIe or VM-passthrough GPU has none.",
        )
    if unknown:
        return Check(
            "fabric.multicast",
            F,
            Status.UNKNOWN,
            f"Multicast support not read: {_list(unknown)}.",
            "pip install 'cuda-bindings>=13' (or check libcuda.so.1 loads) and re-run.",
        )
    return Check(
        "fabric.multicast",
        F,
        Status.PASS,
        f"Multicast supported on {'the GPU' if len(gpus) == 1 else f'all {len(gpus)} GPUs'} "
        "(a driver capability query: only a rendezvous with multicast proves it).",
    )


def imex_check(hw: HardwareReport) -> Check | None:
    nodes = [n for n in hw.nodes if n.no_driver_reason is None]
    if not nodes:
        return None
    if len(nodes) == 1:
        channels = nodes[0].imex_channels
        detail = ", ".join(channels) if isinstance(channels, list) and channels else "none"
        return Check(
            "fabric.imex",
            F,
            Status.PASS,
            f"Single node: IMEX channels not needed (present: {detail}).",
        )
    missing: list[str] = []
    for node in nodes:
        channels = node.imex_channels
        if isinstance(channels, Unavailable) or not channels:
            why = channels.reason if isinstance(channels, Unavailable) else "directory is empty"
            missing.append(f"{node.hostname} ({why})")
    if missing:
        return Check(
            "fabric.imex",
            F,
            Status.FAIL,
            f"Cross-tray NVLink needs an IMEX channel on every node; missing on {_list(missing)}.",
            "Start nvidia-imex on every node of the NVLink domain and create channel0 (driver "
            "parameter NVreg_CreateImexChannel0=1, or nvidia-modprobe -i 0:1).",
        )
    return Check("fabric.imex", F, Status.PASS, f"IMEX channel present on all {len(nodes)} nodes.")


def pod_view_check(hw: HardwareReport) -> Check | None:
    """What several trays' host snapshots cannot show about the pods a render starts on them:
    the IMEX channel inside each pod, and whether the nodes carry the clique label the pods'
    affinity needs. Named with the exact values to check; only for a group in one clique."""
    nodes = [n for n in hw.nodes if n.no_driver_reason is None]
    if len(nodes) < 2:
        return None
    ids = set()
    for node in nodes:
        for gpu in node.gpus:
            fabric = gpu.fabric
            if gpu.lost is not None or isinstance(fabric, Unavailable):
                return None
            if fabric.state != "completed" or fabric.cluster_uuid == _NO_CLUSTER:
                return None
            ids.add((fabric.cluster_uuid, fabric.clique_id))
    if len(ids) != 1:
        return None  # fabric.clique reports the split
    (uuid, cid), names = next(iter(ids)), ", ".join(n.hostname for n in nodes)
    label = f"{CLIQUE_LABEL}={uuid}.{cid}"
    return Check(
        "fabric.pods",
        F,
        Status.UNKNOWN,
        f"Not visible in host snapshots: the IMEX channel inside each pod, and the node label "
        f"{label} the rendered pods' affinity needs on all {len(nodes)} nodes ({names}).",
        f"Kubernetes (`serve --render k8s`): `kubectl get nodes -l {label}` must list all "
        f"{len(nodes)} (GPU feature discovery sets it where the IMEX nodes config exists); each "
        "pod claims its channel through the rendered ComputeDomain: inside one, `ls "
        "/dev/nvidia-caps-imex-channels` shows channel0. Slurm (`--render slurm`): the job "
        "checks the channel on every node before vLLM starts.",
    )
