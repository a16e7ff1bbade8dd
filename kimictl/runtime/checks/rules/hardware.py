"""Hardware, fabric, multicast and software-stack checks for the K3 fast path.

The report may hold several nodes (merged snapshots): they are checked as ONE TP group. Each check
names the nodes/GPUs that fail and the exact fix. A field a probe could not read makes its check
UNKNOWN (reported with the reason, not blocking) rather than PASS or FAIL.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from kimictl.runtime.checks.hardware import GpuInfo, HardwareReport, NodeReport, Unavailable
from kimictl.runtime.checks.rules.base import Check, Section, Status
from kimictl.runtime.checks.stack import VLLM_VERSION, StackReport
from kimictl.runtime.deployment.k3 import (
    MULTICAST_ERRORS,
    SUPPORTED_COMPUTE_CAPABILITY_MAJOR,
    unsupported_message,
)

if TYPE_CHECKING:
    from kimictl.runtime.deployment.spec import DeploymentSpec

__all__ = [
    "MIN_CUDA_DRIVER",
    "MIN_DRIVER_MAJOR",
    "hardware_checks",
    "stack_checks",
]

# The pinned stack is built for CUDA 13 (torch 2.14 cu13 wheels, nvidia-cutlass-dsl[cu13]);
# CUDA 13.0 needs an R580 driver or newer.
MIN_CUDA_DRIVER = (13, 0)
MIN_DRIVER_MAJOR = 580
# Clock-event reasons that mean the GPU is being slowed now (idle / app clocks are normal).
_SLOWDOWNS = {
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_power_cap",
}
H, F, S = Section.HARDWARE, Section.FABRIC, Section.STACK


def _where(node: NodeReport, gpu: GpuInfo | None, multi: bool) -> str:
    g = f"GPU {gpu.index}" if gpu is not None else ""
    if multi:
        return f"{node.hostname} {g}".strip()
    return g or node.hostname


def _list(items: list[str], limit: int = 6) -> str:
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f" and {len(items) - limit} more"


def _gpus_where(items: list[tuple[NodeReport, GpuInfo]], multi: bool, limit: int = 6) -> str:
    """ "tray01 GPU 1; tray02 GPUs 0, 1, 2, 3" - one entry per node, GPU indices grouped."""
    by_node: dict[str, list[int]] = defaultdict(list)
    for node, gpu in items:
        by_node[node.hostname].append(gpu.index)
    parts = []
    for host, indices in by_node.items():
        gpus = f"GPU {indices[0]}" if len(indices) == 1 else f"GPUs {', '.join(map(str, indices))}"
        parts.append(f"{host} {gpus}" if multi else gpus)
    return _list(parts, limit)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


# ---------------------------------------------------------------------------------------- hardware


def _driver_checks(hw: HardwareReport) -> list[Check]:
    checks: list[Check] = []
    multi = len(hw.nodes) > 1
    no_driver = [n for n in hw.nodes if n.no_driver_reason is not None]
    if no_driver:
        names = "; ".join(
            f"{n.hostname}: {n.no_driver_reason}" if multi else str(n.no_driver_reason)
            for n in no_driver
        )
        prefix = "no NVIDIA driver: "
        if not multi and names.startswith(prefix):
            names = f"no NVIDIA driver ({names[len(prefix) :]})"
        checks.append(
            Check(
                "hw.driver",
                H,
                Status.FAIL,
                f"{names[:1].upper()}{names[1:]}: no GPU to run the K3 fast path."
                if not multi
                else f"No usable NVIDIA driver on {names}.",
                "Run kimictl doctor on a GPU node, or check a recorded one: "
                "kimictl doctor --from-snapshot FILE",
            )
        )
        if len(no_driver) == len(hw.nodes):
            return checks
    nodes = [n for n in hw.nodes if n.no_driver_reason is None]
    old: list[str] = []
    unknown: list[str] = []
    for node in nodes:
        cuda, driver = node.cuda_driver_version, node.driver_version
        label = node.hostname
        if isinstance(cuda, str):
            if _version_tuple(cuda)[:2] < MIN_CUDA_DRIVER:
                old.append(f"{label}: driver {driver} (CUDA {cuda})")
        elif isinstance(driver, str):
            if _version_tuple(driver)[0] < MIN_DRIVER_MAJOR:
                old.append(f"{label}: driver {driver}")
        else:
            unknown.append(f"{label}: {cuda}")
    if old:
        checks.append(
            Check(
                "hw.driver_version",
                H,
                Status.FAIL,
                f"Driver too old for the CUDA 13 stack: {_list(old)}.",
                f"Install NVIDIA driver {MIN_DRIVER_MAJOR} or newer (CUDA 13.0+) on every node.",
            )
        )
    elif unknown:
        checks.append(
            Check(
                "hw.driver_version",
                H,
                Status.UNKNOWN,
                f"Driver version not read: {_list(unknown)}.",
            )
        )
    else:
        shown = sorted({f"{n.driver_version} (CUDA {n.cuda_driver_version})" for n in nodes})
        checks.append(
            Check(
                "hw.driver_version", H, Status.PASS, f"Driver {', '.join(shown)}: CUDA 13 capable."
            )
        )
    if len(nodes) > 1:
        versions: dict[str, list[str]] = defaultdict(list)
        for node in nodes:
            versions[str(node.driver_version)].append(node.hostname)
        if len(versions) > 1:
            detail = "; ".join(f"{v} on {_list(h)}" for v, h in sorted(versions.items()))
            checks.append(
                Check(
                    "hw.driver_same",
                    H,
                    Status.FAIL,
                    f"Nodes of one TP group run different drivers: {detail}.",
                    "Install the same NVIDIA driver version on every node of the TP group.",
                )
            )
        else:
            checks.append(
                Check("hw.driver_same", H, Status.PASS, f"Same driver on all {len(nodes)} nodes.")
            )
    return checks


def _gpu_count_check(hw: HardwareReport, spec: DeploymentSpec | None) -> Check:
    multi = len(hw.nodes) > 1
    lost = [
        f"{_where(n, g, multi)} ({g.lost})" for n in hw.nodes for g in n.gpus if g.lost is not None
    ]
    usable = [g for g in hw.gpus if g.lost is None]
    problems: list[str] = []
    if lost:
        problems.append(f"GPU not usable: {_list(lost)}")
    counts = {
        n.hostname: len([g for g in n.gpus if g.lost is None])
        for n in hw.nodes
        if not n.no_driver_reason
    }
    if multi and len(set(counts.values())) > 1:
        most = max(counts.values())
        short = [f"{h} has {c}" for h, c in counts.items() if c < most]
        problems.append(f"uneven nodes ({_list(short)}; others have {most})")
    needed = spec.gpus_needed if spec is not None else None
    if needed is not None and len(usable) < needed:
        problems.append(
            f"the deployment needs {needed} GPUs (TP x PP x DP) but {len(usable)} are usable"
        )
    if problems:
        return Check(
            "hw.gpu_count",
            H,
            Status.FAIL,
            "; ".join(problems)[:1].upper() + "; ".join(problems)[1:] + ".",
            "Bring the missing GPU back (check `nvidia-smi`, dmesg for Xid errors; a lost GPU "
            "needs a node reboot) or snapshot every node of the TP group "
            "(--from-snapshot once per node).",
        )
    live = [n for n in hw.nodes if n.no_driver_reason is None]
    where = f" on {len(live)} nodes" if multi else ""
    if multi and len(live) < len(hw.nodes):
        where = f" on {len(live)} node{'s' if len(live) != 1 else ''} with a driver"
    need = f", deployment needs {needed}" if needed is not None else ""
    noun = "GPU" if len(usable) == 1 else "GPUs"
    return Check("hw.gpu_count", H, Status.PASS, f"{len(usable)} {noun}{where}{need}.")


def _compute_capability_check(hw: HardwareReport) -> Check:
    multi = len(hw.nodes) > 1
    bad: list[str] = []
    unknown: list[str] = []
    archs: set[str] = set()
    for node in hw.nodes:
        for gpu in node.gpus:
            if gpu.lost is not None:
                continue
            cc = gpu.compute_capability
            if isinstance(cc, Unavailable):
                unknown.append(f"{_where(node, gpu, multi)}: {cc.reason}")
                continue
            archs.add(f"{gpu.name} SM{cc[0]}{cc[1]}")
            if cc[0] != SUPPORTED_COMPUTE_CAPABILITY_MAJOR:
                bad.append(f"{_where(node, gpu, multi)} ({gpu.name}, SM{cc[0]}{cc[1]})")
    if bad:
        return Check(
            "hw.compute_capability",
            H,
            Status.FAIL,
            f"{unsupported_message('this GPU (SM100/103)')}: {_list(bad)}.",
            "Run on Blackwell GB200/GB300 or B200/B300 GPUs (compute capability 10.x); "
            "elsewhere only stock decode runs (additional_config decode_backend=auto).",
        )
    if unknown:
        return Check(
            "hw.compute_capability",
            H,
            Status.UNKNOWN,
            f"Compute capability not read: {_list(unknown)}.",
        )
    return Check(
        "hw.compute_capability", H, Status.PASS, f"{', '.join(sorted(archs))}: SM100/103 family."
    )


def _mig_check(hw: HardwareReport) -> Check:
    multi = len(hw.nodes) > 1
    on = [(n, g) for n in hw.nodes for g in n.gpus if g.lost is None and g.mig_mode is True]
    if on:
        where = _list([_where(n, g, multi) for n, g in on])
        idx = ",".join(sorted({str(g.index) for _, g in on}))
        return Check(
            "hw.mig",
            H,
            Status.FAIL,
            f"MIG is enabled on {where}: the TP group needs whole GPUs.",
            f"sudo nvidia-smi -i {idx} -mig 0 on each listed node, then reset those GPUs "
            "(nothing may be running on them).",
        )
    unknown = [g for g in hw.gpus if g.lost is None and isinstance(g.mig_mode, Unavailable)]
    if unknown and len(unknown) == len([g for g in hw.gpus if g.lost is None]):
        reason = unknown[0].mig_mode
        return Check("hw.mig", H, Status.PASS, f"MIG not available on these GPUs ({reason}).")
    return Check("hw.mig", H, Status.PASS, "MIG off on every GPU.")


def _persistence_check(hw: HardwareReport) -> Check | None:
    multi = len(hw.nodes) > 1
    off = [_where(n, g, multi) for n in hw.nodes for g in n.gpus if g.persistence is False]
    if off:
        return Check(
            "hw.persistence",
            H,
            Status.WARN,
            f"Persistence mode off on {_list(off)}: the first CUDA call re-initialises the GPU.",
            "sudo nvidia-smi -pm 1 (or enable nvidia-persistenced)",
        )
    if any(g.persistence is True for g in hw.gpus):
        return Check("hw.persistence", H, Status.PASS, "Persistence mode on.")
    return None


def _throttle_check(hw: HardwareReport) -> Check | None:
    multi = len(hw.nodes) > 1
    slowed: list[str] = []
    for node in hw.nodes:
        for gpu in node.gpus:
            if isinstance(gpu.throttle_reasons, list):
                hits = sorted(set(gpu.throttle_reasons) & _SLOWDOWNS)
                if hits:
                    slowed.append(f"{_where(node, gpu, multi)} ({', '.join(hits)})")
    if slowed:
        return Check(
            "hw.throttle",
            H,
            Status.WARN,
            f"Clocks slowed at capture time: {_list(slowed)}; latency figures will suffer.",
            "Check cooling and power limits: nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE",
        )
    if any(isinstance(g.throttle_reasons, list) for g in hw.gpus):
        return Check("hw.throttle", H, Status.PASS, "No thermal or power slowdown.")
    return None


def _same_model_check(hw: HardwareReport) -> Check | None:
    names = {str(g.name) for g in hw.gpus if g.lost is None and isinstance(g.name, str)}
    if len(names) > 1:
        return Check(
            "hw.same_model",
            H,
            Status.FAIL,
            f"Mixed GPU models in one TP group: {', '.join(sorted(names))}.",
            "Use identical GPUs for every rank of the TP group.",
        )
    return None


# ------------------------------------------------------------------------------------------ fabric


def _nvlink_check(hw: HardwareReport) -> Check | None:
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


def _p2p_check(hw: HardwareReport) -> Check | None:
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


def _fabric_checks(hw: HardwareReport) -> list[Check]:
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


def _multicast_check(hw: HardwareReport) -> Check | None:
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


def _imex_check(hw: HardwareReport) -> Check | None:
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


def hardware_checks(hw: HardwareReport, spec: DeploymentSpec | None = None) -> list[Check]:
    """Hardware and fabric/multicast checks of one TP group (all nodes of `hw`)."""
    checks = _driver_checks(hw)
    if not hw.has_driver:
        return checks
    checks.append(_gpu_count_check(hw, spec))
    if not any(g.lost is None for g in hw.gpus):
        return checks
    checks.append(_compute_capability_check(hw))
    checks.append(_mig_check(hw))
    optional: list[Check | None] = [
        _same_model_check(hw),
        _persistence_check(hw),
        _throttle_check(hw),
        _nvlink_check(hw),
        _p2p_check(hw),
    ]
    checks.extend(c for c in optional if c is not None)
    checks.extend(_fabric_checks(hw))
    for extra in (_multicast_check(hw), _imex_check(hw)):
        if extra is not None:
            checks.append(extra)
    return checks


# ------------------------------------------------------------------------------------------- stack


def stack_checks(stack: StackReport, hw: HardwareReport | None = None) -> list[Check]:
    """Installed packages vs vLLM 0.33.0's pins; the specialized decode package; and, for merged
    snapshots, the same stack on every node."""
    checks: list[Check] = []
    for pkg in stack.packages:
        cid = f"stack.{pkg.name}"
        if pkg.status == "ok":
            checks.append(Check(cid, S, Status.PASS, f"{pkg.name} {pkg.installed} ({pkg.spec})."))
            continue
        status = Status.FAIL if pkg.required else Status.WARN
        why = f"; {pkg.why}" if pkg.why else ""
        who = f"vLLM {VLLM_VERSION} pins" if pkg.required else "kimictl wants"
        if pkg.status == "missing":
            message = f"{pkg.name} is not installed ({who} {pkg.spec}){why}."
        else:
            message = f"{pkg.name} {pkg.installed} installed, {who} {pkg.spec}{why}."
        checks.append(Check(cid, S, status, message, pkg.fix))
    sd = stack.specialized_decode
    if isinstance(sd, Unavailable):
        checks.append(
            Check(
                "stack.specialized_decode",
                S,
                Status.FAIL,
                f"K3 specialized decode package not found: {sd.reason}.",
                f"pip install vllm=={VLLM_VERSION}",
            )
        )
    else:
        checks.append(
            Check("stack.specialized_decode", S, Status.PASS, f"Specialized decode found at {sd}.")
        )
    if hw is not None and len(hw.nodes) > 1:
        same = _same_stack_check(hw)
        if same is not None:
            checks.append(same)
    return checks


def _same_stack_check(hw: HardwareReport) -> Check | None:
    recorded = [(n.hostname, n.stack) for n in hw.nodes if n.stack]
    if len(recorded) < 2:
        return None
    per_pkg: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for host, raw in recorded:
        versions: dict[str, Any] = {
            p["name"]: p.get("installed") for p in (raw or {}).get("packages", [])
        }
        for name, version in versions.items():
            per_pkg[name][str(version) if version else "not installed"].append(host)
    differ = {name: v for name, v in per_pkg.items() if len(v) > 1}
    if differ:
        detail = "; ".join(
            f"{name}: " + ", ".join(f"{ver} on {_list(hosts)}" for ver, hosts in sorted(v.items()))
            for name, v in sorted(differ.items())
        )
        return Check(
            "stack.same",
            S,
            Status.FAIL,
            f"Nodes of one TP group run different software: {detail}.",
            "Install the same pinned stack on every node (see the pip commands above).",
        )
    return Check("stack.same", S, Status.PASS, f"Same stack on all {len(recorded)} nodes.")
