"""Fallback when pynvml is not installed but the driver is: ask `nvidia-smi` (argv, no shell).

Reads fewer fields than NVML (no per-link NVLink detail, no P2P matrix); what it cannot read is
marked Unavailable with the reason "read via nvidia-smi fallback".
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from kimictl.runtime.checks.hardware._types import FabricInfo, GpuInfo, Unavailable

__all__ = ["parse_smi", "smi_available", "smi_probe"]

_FIELDS = [
    "index",
    "name",
    "uuid",
    "compute_cap",
    "memory.total",
    "mig.mode.current",
    "ecc.mode.current",
    "persistence_mode",
    "pci.bus_id",
    "driver_version",
]
_NOT_READ = Unavailable("not read by the nvidia-smi fallback (install nvidia-ml-py)")


def smi_available() -> bool:
    return shutil.which("nvidia-smi") is not None


def _run(args: list[str]) -> str | Unavailable:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return Unavailable("nvidia-smi not found")
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return Unavailable(f"nvidia-smi failed: {error}")
    if done.returncode != 0:
        return Unavailable(f"nvidia-smi exited {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout


def _flag(text: str) -> bool | Unavailable:
    t = text.strip().lower()
    if t in ("enabled", "on"):
        return True
    if t in ("disabled", "off"):
        return False
    return Unavailable(f"nvidia-smi said {text.strip()!r}")


def _fabric_from_q(text: str) -> list[FabricInfo | Unavailable]:
    """Parse the Fabric blocks of `nvidia-smi -q`, one per GPU, in GPU order."""
    out: list[FabricInfo | Unavailable] = []
    current: dict[str, str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("GPU ") and stripped.count(":") >= 2 and current is not None:
            out.append(_fabric_block(current))
            current = None
        if stripped == "Fabric":
            current = {}
            continue
        if current is not None and ":" in stripped:
            key, _, value = stripped.partition(":")
            current[key.strip().lower()] = value.strip()
        elif current is not None and stripped and ":" not in stripped and current:
            out.append(_fabric_block(current))
            current = None
    if current is not None:
        out.append(_fabric_block(current))
    return out


def _fabric_block(block: dict[str, str]) -> FabricInfo | Unavailable:
    state = block.get("state", "").lower().replace(" ", "_")
    if not state or state in ("n/a", "not_supported"):
        return Unavailable("fabric: not supported on this GPU/driver")
    try:
        clique = int(block.get("cliqueid", block.get("clique id", "0")))
    except ValueError:
        clique = 0
    return FabricInfo(
        state=state,
        status=block.get("status", "unknown").lower(),
        cluster_uuid=block.get("clusteruuid", block.get("cluster uuid", "")),
        clique_id=clique,
    )


def smi_probe() -> tuple[str | Unavailable, list[GpuInfo]] | Unavailable:
    """(driver version, GPUs) read through nvidia-smi, or why it could not."""
    out = _run([f"--query-gpu={','.join(_FIELDS)}", "--format=csv,noheader,nounits"])
    if isinstance(out, Unavailable):
        return out
    q = _run(["-q"])
    return parse_smi(out, q if isinstance(q, str) else "")


def parse_smi(out: str, q: str) -> tuple[str | Unavailable, list[GpuInfo]]:
    """Parse `--query-gpu=<_FIELDS> --format=csv,noheader,nounits` and `nvidia-smi -q` text."""
    fabrics = _fabric_from_q(q) if q else []
    driver: str | Unavailable = Unavailable("no GPU listed by nvidia-smi")
    gpus: list[GpuInfo] = []
    for row_index, line in enumerate(r for r in out.splitlines() if r.strip()):
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(_FIELDS):
            continue
        row: dict[str, Any] = dict(zip(_FIELDS, cells, strict=True))
        driver = row["driver_version"]
        major, _, minor = row["compute_cap"].partition(".")
        cc: tuple[int, int] | Unavailable
        try:
            cc = (int(major), int(minor))
        except ValueError:
            cc = Unavailable(f"nvidia-smi compute_cap {row['compute_cap']!r}")
        try:
            mem: int | Unavailable = int(float(row["memory.total"]))
        except ValueError:
            mem = Unavailable(f"nvidia-smi memory.total {row['memory.total']!r}")
        fabric = fabrics[row_index] if row_index < len(fabrics) else _NOT_READ
        gpus.append(
            GpuInfo(
                index=int(row["index"]),
                name=row["name"],
                uuid=row["uuid"],
                compute_capability=cc,
                memory_total_mib=mem,
                mig_mode=_flag(row["mig.mode.current"]),
                ecc=_flag(row["ecc.mode.current"]),
                persistence=_flag(row["persistence_mode"]),
                throttle_reasons=_NOT_READ,
                nvlinks=_NOT_READ,
                fabric=fabric,
                multicast_supported=_NOT_READ,
                pci_bus_id=row["pci.bus_id"],
            )
        )
    return driver, gpus
