"""Hardware, fabric, multicast and software-stack checks for the K3 fast path.

The report may hold several nodes (merged snapshots): they are checked as ONE TP group. Each check
names the nodes/GPUs that fail and the exact fix. A field a probe could not read makes its check
UNKNOWN (reported with the reason, not blocking) rather than PASS or FAIL.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from kimictl.deployment.k3 import (
    SUPPORTED_COMPUTE_CAPABILITY_MAJOR,
    unsupported_message,
)
from kimictl.runtime.checks.hardware import HardwareReport, Unavailable
from kimictl.runtime.checks.rules._names import _list, _where
from kimictl.runtime.checks.rules.base import Check, Section, Status
from kimictl.runtime.checks.rules.fabric import (
    fabric_checks,
    imex_check,
    multicast_check,
    nvlink_check,
    p2p_check,
    pod_view_check,
)
from kimictl.runtime.checks.stack import VLLM_VERSION, StackReport

__all__ = [
    "MIN_CUDA_DRIVER",
    "MIN_DRIVER_MAJOR",
    "hardware_checks",
    "stack_checks",
]


if TYPE_CHECKING:
    pass

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


def _gpu_count_check(hw: HardwareReport) -> Check:
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
    noun = "GPU" if len(usable) == 1 else "GPUs"
    return Check("hw.gpu_count", H, Status.PASS, f"{len(usable)} {noun}{where}.")


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


def hardware_checks(hw: HardwareReport) -> list[Check]:
    """Hardware and fabric/multicast checks of one TP group (all nodes of `hw`). The GPUs a
    deployment needs are counted by the deployment rules (k3.gpu_count)."""
    checks = _driver_checks(hw)
    if not hw.has_driver:
        return checks
    checks.append(_gpu_count_check(hw))
    if not any(g.lost is None for g in hw.gpus):
        return checks
    checks.append(_compute_capability_check(hw))
    checks.append(_mig_check(hw))
    optional: list[Check | None] = [
        _same_model_check(hw),
        _persistence_check(hw),
        _throttle_check(hw),
        nvlink_check(hw),
        p2p_check(hw),
    ]
    checks.extend(c for c in optional if c is not None)
    checks.extend(fabric_checks(hw))
    for extra in (multicast_check(hw), imex_check(hw), pod_view_check(hw)):
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
