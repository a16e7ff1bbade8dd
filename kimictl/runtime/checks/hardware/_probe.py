"""probe_local(): this node, live, through NVML (or nvidia-smi) plus the CUDA driver."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime

from kimictl.runtime.checks.hardware import _nvml
from kimictl.runtime.checks.hardware._cuda import query_multicast
from kimictl.runtime.checks.hardware._imex import list_imex_channels
from kimictl.runtime.checks.hardware._smi import smi_available, smi_probe
from kimictl.runtime.checks.hardware._types import (
    RECORDED_ENV,
    HardwareReport,
    NodeReport,
    Unavailable,
)

__all__ = ["probe_local", "probe_node"]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _stack_json() -> dict[str, object] | None:
    try:
        from kimictl.runtime.checks.stack import probe_stack
    except ImportError:
        return None
    return probe_stack().to_json()


def _env() -> dict[str, str]:
    return {name: os.environ[name] for name in RECORDED_ENV if name in os.environ}


def probe_node(include_stack: bool = True) -> NodeReport:
    host = socket.gethostname()
    stack = _stack_json() if include_stack else None
    nvml_error = _nvml.nvml_status()
    if nvml_error is not None:
        if "not installed" in nvml_error.reason and smi_available():
            return _probe_with_smi(host, stack, nvml_error)
        no_driver = nvml_error.reason
        return NodeReport(
            hostname=host,
            captured_at=_now(),
            driver_version=nvml_error,
            cuda_driver_version=nvml_error,
            gpus=[],
            p2p=nvml_error,
            imex_channels=list_imex_channels(),
            no_driver_reason=no_driver,
            device_count=nvml_error,
            backend="none",
            stack=stack,
            env=_env(),
        )
    driver, cuda, count = _nvml.query_driver()
    multicast = query_multicast() if isinstance(count, int) and count > 0 else {}
    notes = []
    if "source" in multicast:
        notes.append(f"multicast read through {multicast['source']}")
    gpus, handles = _nvml.probe_gpus(count if isinstance(count, int) else 0, multicast)
    return NodeReport(
        hostname=host,
        captured_at=_now(),
        driver_version=driver,
        cuda_driver_version=cuda,
        gpus=gpus,
        p2p=_nvml.probe_p2p(handles),
        imex_channels=list_imex_channels(),
        no_driver_reason=None,
        device_count=count,
        backend="nvml",
        stack=stack,
        notes=notes,
        env=_env(),
    )


def _probe_with_smi(host: str, stack: dict[str, object] | None, why: Unavailable) -> NodeReport:
    found = smi_probe()
    notes = [f"NVML unavailable ({why.reason}); read through `nvidia-smi --query-gpu`"]
    if isinstance(found, Unavailable):
        return NodeReport(
            hostname=host,
            captured_at=_now(),
            driver_version=found,
            cuda_driver_version=found,
            gpus=[],
            p2p=found,
            imex_channels=list_imex_channels(),
            no_driver_reason=found.reason,
            device_count=found,
            backend="none",
            stack=stack,
            notes=notes,
            env=_env(),
        )
    driver, gpus = found
    multicast = query_multicast() if gpus else {}
    from dataclasses import replace

    gpus = [
        replace(
            g, multicast_supported=multicast.get(g.uuid, multicast.get("*", g.multicast_supported))
        )
        if isinstance(g.uuid, str)
        else g
        for g in gpus
    ]
    if "source" in multicast:
        notes.append(f"multicast read through {multicast['source']}")
    return NodeReport(
        hostname=host,
        captured_at=_now(),
        driver_version=driver,
        cuda_driver_version=Unavailable("not read by the nvidia-smi fallback"),
        gpus=gpus,
        p2p=Unavailable("not read by the nvidia-smi fallback (install nvidia-ml-py)"),
        imex_channels=list_imex_channels(),
        no_driver_reason=None,
        device_count=len(gpus),
        backend="nvidia-smi",
        stack=stack,
        notes=notes,
        env=_env(),
    )


def probe_local(include_stack: bool = True) -> HardwareReport:
    """This machine, now. Never raises for a missing driver or library: see NodeReport fields."""
    return HardwareReport(nodes=[probe_node(include_stack)], source="live")
