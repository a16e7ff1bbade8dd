"""The environment vLLM will run with: switches that turn multicast or symmetric memory off, and
`CUDA_VISIBLE_DEVICES`, which decides the GPUs the deployment sees.

The environment is the launching process's (live: this process; a snapshot: what the capturing
process had, `NodeReport.env`) with the deployment's `[env]` / leading `VAR=value` on top (the
deployment wins, as it does at launch). Each value is read the way the library that consumes it
reads it:

- torch (`c10::utils::check_env`, used by `device_has_multicast_support` for
  TORCH_SYMM_MEM_DISABLE_MULTICAST): exactly "1" is true, exactly "0" is false, anything else is
  ignored with a warning (so "true" does NOT disable multicast).
- torch `TORCH_SYMMMEM` (`getSymmMemBackendCUDA`): exactly "CUDA", "NVSHMEM" or "NCCL", else
  torch raises. The NCCL backend returns no multicast pointer (`get_multicast_ptr` is nullptr).
- vLLM envs.py: `bool(int(os.getenv(NAME, default)))` for VLLM_ALLREDUCE_USE_SYMM_MEM: a value
  that is not an integer raises ValueError when vLLM reads it.
- NCCL integer parameters (NCCL_NVLS_ENABLE): an integer; 0 switches NVLS off.
- NVSHMEM booleans (NVSHMEM_DISABLE_NVLS): kimictl takes 1/y/yes/t/true/on as set (not checked
  against NVSHMEM's parser).

A check here is about configuration only: the multicast attribute (fabric.multicast) is a
capability query, and only a rendezvous with multicast proves the path works (doctor never does
one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kimictl.deployment.k3 import MULTICAST_ERRORS
from kimictl.runtime.checks.hardware import RECORDED_ENV
from kimictl.runtime.checks.rules.base import Check, Section, Status

if TYPE_CHECKING:
    from kimictl.deployment.spec import DeploymentSpec
    from kimictl.runtime.checks.hardware import HardwareReport, NodeReport

__all__ = [
    "RELEVANT_ENV",
    "Visible",
    "environment_checks",
    "launch_env",
    "parse_visible_devices",
    "restrict_to_visible",
]

DISABLE_MULTICAST = "TORCH_SYMM_MEM_DISABLE_MULTICAST"
SYMMMEM_BACKEND = "TORCH_SYMMMEM"
NCCL_NVLS = "NCCL_NVLS_ENABLE"
NVSHMEM_NVLS = "NVSHMEM_DISABLE_NVLS"
VLLM_SYMM_AR = "VLLM_ALLREDUCE_USE_SYMM_MEM"
VISIBLE = "CUDA_VISIBLE_DEVICES"

RELEVANT_ENV = RECORDED_ENV
_NVSHMEM_TRUE = {"1", "y", "yes", "t", "true", "on"}
F, H = Section.FABRIC, Section.HARDWARE


@dataclass(frozen=True)
class EnvValue:
    value: str
    origin: str  # "deployment" ([env] / VAR=value) or "process" (the launching environment)


def launch_env(
    process: Mapping[str, str] | None, spec: DeploymentSpec | None
) -> dict[str, EnvValue]:
    """The relevant variables vLLM would see: process env, then the deployment's on top."""
    merged: dict[str, EnvValue] = {}
    for name in RELEVANT_ENV:
        if process is not None and name in process:
            merged[name] = EnvValue(process[name], "process")
    if spec is not None:
        for name, value in spec.env.items():
            if name in RELEVANT_ENV:
                merged[name] = EnvValue(value, "deployment")
    return merged


def _shown(name: str, ev: EnvValue) -> str:
    where = "the deployment's env" if ev.origin == "deployment" else "the launching environment"
    return f"{name}={ev.value!r} (from {where})"


def _unset_fix(name: str, ev: EnvValue, good: str) -> str:
    if ev.origin == "deployment":
        return f"remove {name}={ev.value} from the launch command / the profile's [env]"
    return (
        f"unset {name} in the shell or job script that starts vLLM, or override it in the "
        f'deployment: {name}={good} (profile: [env] {name} = "{good}")'
    )


# ------------------------------------------------------------------------------- multicast switches


def _torch_multicast(env: Mapping[str, EnvValue]) -> Check:
    ev = env.get(DISABLE_MULTICAST)
    cid = "env.torch_multicast"
    if ev is None:
        return Check(cid, F, Status.PASS, f"{DISABLE_MULTICAST} not set: torch may use multicast.")
    if ev.value == "1":  # c10::utils::check_env: exactly "1" is true
        return Check(
            cid,
            F,
            Status.FAIL,
            f"{_shown(DISABLE_MULTICAST, ev)}: torch symmetric memory reports no multicast, "
            "symm_mem.rendezvous(...).multicast_ptr is 0 and vLLM fails after loading the model "
            f'("{MULTICAST_ERRORS[0]}").',
            _unset_fix(DISABLE_MULTICAST, ev, "0"),
        )
    if ev.value == "0":
        return Check(cid, F, Status.PASS, f"{DISABLE_MULTICAST}=0: torch may use multicast.")
    return Check(
        cid,
        F,
        Status.WARN,
        f"{_shown(DISABLE_MULTICAST, ev)}: torch accepts only 0 or 1 and ignores this value "
        "(with a warning), so multicast stays on; whoever set it probably meant to switch it off.",
        f"set {DISABLE_MULTICAST}=0 or unset it (torch reads only the exact strings 0 and 1)",
    )


def _nvshmem_nvls_set(env: Mapping[str, EnvValue]) -> EnvValue | None:
    ev = env.get(NVSHMEM_NVLS)
    return ev if ev is not None and ev.value.strip().lower() in _NVSHMEM_TRUE else None


def _symm_backend(env: Mapping[str, EnvValue]) -> Check:
    ev = env.get(SYMMMEM_BACKEND)
    cid = "env.symm_mem_backend"
    if ev is None or ev.value == "CUDA":
        return Check(
            cid, F, Status.PASS, "torch symmetric memory backend: CUDA (multicast through cuMem)."
        )
    if ev.value == "NCCL":
        return Check(
            cid,
            F,
            Status.FAIL,
            f"{_shown(SYMMMEM_BACKEND, ev)}: torch's NCCL symmetric-memory backend returns no "
            "multicast pointer, so the K3 specialized decode cannot build its buffers.",
            _unset_fix(SYMMMEM_BACKEND, ev, "CUDA"),
        )
    if ev.value == "NVSHMEM":
        off = _nvshmem_nvls_set(env)
        if off is not None:
            return Check(
                cid,
                F,
                Status.FAIL,
                f"{_shown(SYMMMEM_BACKEND, ev)} with {_shown(NVSHMEM_NVLS, off)}: the NVSHMEM "
                "backend's multicast (NVLS) is switched off.",
                _unset_fix(NVSHMEM_NVLS, off, "0"),
            )
        return Check(
            cid,
            F,
            Status.WARN,
            f"{_shown(SYMMMEM_BACKEND, ev)}: multicast then comes from NVSHMEM's NVLS, not the "
            "CUDA backend the K3 specialized decode is built and tested with.",
            _unset_fix(SYMMMEM_BACKEND, ev, "CUDA"),
        )
    return Check(
        cid,
        F,
        Status.FAIL,
        f'{_shown(SYMMMEM_BACKEND, ev)}: torch raises "TORCH_SYMMMEM environment variable must '
        "be one of 'CUDA', 'NVSHMEM', 'NCCL'\" at the first symmetric-memory call (exact case).",
        _unset_fix(SYMMMEM_BACKEND, ev, "CUDA"),
    )


def _nccl_nvls(env: Mapping[str, EnvValue]) -> Check | None:
    ev = env.get(NCCL_NVLS)
    if ev is None:
        return None
    cid = "env.nccl_nvls"
    try:
        number = int(ev.value.strip(), 0)
    except ValueError:
        return Check(
            cid,
            F,
            Status.WARN,
            f"{_shown(NCCL_NVLS, ev)} is not an integer: NCCL ignores it and uses its default.",
            f"set {NCCL_NVLS} to 0 or 1, or unset it",
        )
    if number != 0:
        return Check(cid, F, Status.PASS, f"{NCCL_NVLS}={ev.value}: NCCL may use NVLS.")
    return Check(
        cid,
        F,
        Status.WARN,
        f"{_shown(NCCL_NVLS, ev)}: NCCL's own collectives (vLLM's stock all-reduce for prefill "
        "and for steps outside the prepared batches) run without NVLink SHARP. The specialized "
        "decode's multicast buffers come from torch symmetric memory and are not affected; on "
        "shared hosts this is often set on purpose.",
        _unset_fix(NCCL_NVLS, ev, "1"),
    )


def _nvshmem_nvls(env: Mapping[str, EnvValue]) -> Check | None:
    off = _nvshmem_nvls_set(env)
    backend = env.get(SYMMMEM_BACKEND)
    if off is None or (backend is not None and backend.value == "NVSHMEM"):
        return None  # with the NVSHMEM backend env.symm_mem_backend reports it as a FAIL
    return Check(
        "env.nvshmem_nvls",
        F,
        Status.WARN,
        f"{_shown(NVSHMEM_NVLS, off)}: NVSHMEM will not use NVLS. No effect on torch's default "
        "CUDA symmetric-memory backend (the K3 path's); it matters for NVSHMEM-based kernels and "
        f"for {SYMMMEM_BACKEND}=NVSHMEM.",
        _unset_fix(NVSHMEM_NVLS, off, "0"),
    )


def _vllm_symm_ar(env: Mapping[str, EnvValue]) -> Check | None:
    ev = env.get(VLLM_SYMM_AR)
    if ev is None:
        return None
    cid = "env.vllm_symm_mem_allreduce"
    try:
        on = bool(int(ev.value))  # vLLM envs.py: bool(int(os.getenv(...)))
    except ValueError:
        return Check(
            cid,
            F,
            Status.FAIL,
            f"{_shown(VLLM_SYMM_AR, ev)}: vLLM reads it with int() and raises ValueError "
            "when it builds the TP all-reduce.",
            f"set {VLLM_SYMM_AR} to 1 or 0 (vLLM accepts integers only), or unset it",
        )
    if on:
        return Check(cid, F, Status.PASS, f"{VLLM_SYMM_AR}={ev.value}: vLLM all-reduce may use it.")
    return Check(
        cid,
        F,
        Status.WARN,
        f"{_shown(VLLM_SYMM_AR, ev)}: vLLM's generic all-reduce (stock forward, prefill) skips "
        "torch symmetric memory; the K3 specialized decode allocates its own and is not affected.",
        _unset_fix(VLLM_SYMM_AR, ev, "1"),
    )


# ------------------------------------------------------------------------- CUDA_VISIBLE_DEVICES


@dataclass(frozen=True)
class Visible:
    """The GPUs CUDA_VISIBLE_DEVICES leaves visible on one node (NVML indices), as CUDA reads it:
    comma-separated entries, each an ordinal, a GPU UUID (a unique prefix is enough) or a MIG
    device; the list ends at the first entry that names no device."""

    indices: list[int]
    mig: list[str]  # MIG entries: a MIG slice is never a whole GPU
    ignored: list[str]  # entries at and after the first invalid one (CUDA stops there)
    text: str


def parse_visible_devices(text: str, node: NodeReport) -> Visible:
    gpus = node.gpus
    indices: list[int] = []
    mig: list[str] = []
    entries = [e.strip() for e in text.split(",")] if text.strip() else []
    for pos, entry in enumerate(entries):
        found: int | None = None
        if entry.upper().startswith("MIG-"):
            mig.append(entry)
            continue
        if re.fullmatch(r"[+-]?\d+", entry):
            n = int(entry)
            found = n if 0 <= n < len(gpus) else None
        elif entry.upper().startswith("GPU-"):
            hits = [g.index for g in gpus if isinstance(g.uuid, str) and g.uuid.startswith(entry)]
            found = hits[0] if len(hits) == 1 else None
        if found is None or found in indices:
            return Visible(indices, mig, entries[pos:], text)
        indices.append(found)
    return Visible(indices, mig, [], text)


def restrict_to_visible(
    hw: HardwareReport, env_by_node: list[dict[str, EnvValue]]
) -> HardwareReport:
    """The report limited to the GPUs each node's CUDA_VISIBLE_DEVICES leaves visible."""
    nodes = []
    for node, env in zip(hw.nodes, env_by_node, strict=True):
        ev = env.get(VISIBLE)
        if ev is None or node.no_driver_reason is not None:
            nodes.append(node)
            continue
        keep = set(parse_visible_devices(ev.value, node).indices)
        gpus = [g for g in node.gpus if g.index in keep]
        p2p = node.p2p
        if isinstance(p2p, list):
            p2p = [p for p in p2p if p.a in keep and p.b in keep]
        note = f"{VISIBLE}={ev.value!r}: checking GPUs {sorted(keep) or 'none'} of {len(node.gpus)}"
        nodes.append(replace(node, gpus=gpus, p2p=p2p, notes=[*node.notes, note]))
    return replace(hw, nodes=nodes)


def _visible_check(
    hw: HardwareReport, env_by_node: list[dict[str, EnvValue]], spec: DeploymentSpec | None
) -> Check | None:
    cid = "env.visible_devices"
    multi = len(hw.nodes) > 1
    seen: list[str] = []
    mig: list[str] = []
    ignored: list[str] = []
    visible_total = 0
    restricted = False
    for node, env in zip(hw.nodes, env_by_node, strict=True):
        if node.no_driver_reason is not None:
            continue
        ev = env.get(VISIBLE)
        if ev is None:
            visible_total += len(node.gpus)
            continue
        restricted = True
        vis = parse_visible_devices(ev.value, node)
        visible_total += len(vis.indices)
        prefix = f"{node.hostname}: " if multi else ""
        shown = ", ".join(f"GPU {i}" for i in vis.indices) or "no GPU"
        seen.append(f"{prefix}{VISIBLE}={ev.value!r} -> {shown} of {len(node.gpus)}")
        mig.extend(f"{prefix}{m}" for m in vis.mig)
        if vis.ignored:
            ignored.append(f"{prefix}{', '.join(vis.ignored)}")
    if not restricted:
        return None
    detail = "; ".join(seen)
    need = spec.gpus_needed if spec is not None else None
    if mig:
        return Check(
            cid,
            H,
            Status.FAIL,
            f"{detail}; MIG devices listed ({', '.join(mig)}): the TP group needs whole GPUs.",
            f"list whole GPUs in {VISIBLE} (indices or GPU-UUIDs), not MIG devices",
        )
    if need is not None and visible_total < need:
        return Check(
            cid,
            H,
            Status.FAIL,
            f"{detail}: {visible_total} visible, the deployment needs {need} (TP x PP x DP).",
            f"list {need} GPUs in {VISIBLE} (e.g. {VISIBLE}={','.join(map(str, range(need)))}) "
            "or unset it",
        )
    if ignored:
        return Check(
            cid,
            H,
            Status.WARN,
            f"{detail}; CUDA stops at the first entry that names no GPU, so these are ignored: "
            f"{'; '.join(ignored)}.",
            f"remove the invalid or duplicate entries from {VISIBLE}",
        )
    return Check(cid, H, Status.PASS, f"{detail}; the checks below cover those GPUs only.")


# The variable each switch check reads: "not set" is only known where the environment was recorded.
_CHECK_VARS = {
    "env.torch_multicast": DISABLE_MULTICAST,
    "env.symm_mem_backend": SYMMMEM_BACKEND,
    "env.nccl_nvls": NCCL_NVLS,
    "env.nvshmem_nvls": NVSHMEM_NVLS,
    "env.vllm_symm_mem_allreduce": VLLM_SYMM_AR,
}


def _unrecorded(check: Check, env: Mapping[str, EnvValue]) -> Check:
    """A PASS that rests on a variable being unset, on a node whose launching environment was
    not recorded: UNKNOWN (the deployment's own env does not set it; the node's may)."""
    var = _CHECK_VARS.get(check.id)
    if check.status is not Status.PASS or var is None or var in env:
        return check
    return replace(
        check,
        status=Status.UNKNOWN,
        message=f"{var}: not known (the launching environment was not recorded; the "
        "deployment's env does not set it).",
    )


def environment_checks(
    hw: HardwareReport | None,
    env_by_node: list[dict[str, EnvValue]],
    spec: DeploymentSpec | None,
) -> list[Check]:
    """Multicast/symmetric-memory switches (per distinct environment) and CUDA_VISIBLE_DEVICES."""
    checks: list[Check] = []
    envs = env_by_node or [launch_env(None, spec)]
    hosts = [n.hostname for n in hw.nodes] if hw is not None else ["this node"]
    recorded = [n.env is not None for n in hw.nodes] if hw is not None else [True]
    # the same finding on several nodes is reported once, naming the nodes unless it is all
    found: dict[tuple[str, str, str], tuple[Check, list[str]]] = {}
    for host, env, known in zip(hosts, envs, recorded, strict=False):
        for check in (
            _torch_multicast(env),
            _symm_backend(env),
            _nccl_nvls(env),
            _nvshmem_nvls(env),
            _vllm_symm_ar(env),
        ):
            if check is not None and not known:
                check = _unrecorded(check, env)
            if check is not None:
                key = (check.id, check.status.value, check.message)
                found.setdefault(key, (check, []))[1].append(host)
    for check, where in found.values():
        if len(where) < len(envs):
            check = replace(check, message=f"{', '.join(where)}: {check.message}")
        checks.append(check)
    unrecorded = [n.hostname for n in hw.nodes if n.env is None] if hw is not None else []
    if unrecorded:
        checks.append(
            Check(
                "env.recorded",
                F,
                Status.UNKNOWN,
                f"No launching environment recorded for {', '.join(unrecorded)} (a snapshot from "
                "before kimictl recorded it): only the deployment's env was checked.",
                "Re-capture with kimictl doctor --save-snapshot FILE in the environment vLLM "
                "starts from.",
            )
        )
    if hw is not None and env_by_node:
        visible = _visible_check(hw, env_by_node, spec)
        if visible is not None:
            checks.append(visible)
    return checks
