"""Live per-GPU telemetry through NVML (utilisation, memory, power, clocks) for `kimictl monitor`.

pynvml (package nvidia-ml-py) is imported lazily on the first call. Every NVML query goes through
`_query`, so a field the driver does not support costs that field (None), not the GPU. With no
NVML or no GPU the result is an empty `GpuTelemetry` carrying the reason, never an exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["GpuSample", "GpuTelemetry", "sample_gpus", "shutdown"]


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one moment. None = the driver did not report that field."""

    index: int
    name: str | None
    util_percent: float | None  # SM busy share over the driver's last sample period
    mem_util_percent: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    temperature_c: float | None

    def summary(self) -> str:
        """One short cell, "GPU0 97% 45/140G 520W 1980MHz 41C"; "-" where the driver gave
        nothing (a missing reading must not show as 0)."""

        def num(value: float | None, unit: str) -> str:
            return "-" if value is None else f"{value:.0f}{unit}"

        mem = (
            f"{self.memory_used_mib / 1024:.0f}/{self.memory_total_mib / 1024:.0f}G"
            if self.memory_used_mib is not None and self.memory_total_mib is not None
            else "-"
        )
        return (
            f"GPU{self.index} {num(self.util_percent, '%')} {mem} {num(self.power_w, 'W')} "
            f"{num(self.sm_clock_mhz, 'MHz')} {num(self.temperature_c, 'C')}"
        )


@dataclass(frozen=True, slots=True)
class GpuTelemetry:
    taken_at: float
    gpus: tuple[GpuSample, ...] = ()
    reason: str | None = None  # why `gpus` is empty (no NVML, no GPU)

    def to_json(self) -> dict[str, Any]:
        return {
            "taken_at": self.taken_at,
            "reason": self.reason,
            "gpus": [asdict(g) for g in self.gpus],
        }


@dataclass
class _Nvml:
    module: Any = None
    error: str | None = None
    handles: list[Any] = field(default_factory=list)


_state = _Nvml()


def _init() -> _Nvml:
    if _state.module is not None or _state.error is not None:
        return _state
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as exc:
        _state.error = f"pynvml is not installed ({exc}); install nvidia-ml-py"
        return _state
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        _state.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    except pynvml.NVMLError as exc:
        _state.error = f"NVML unavailable: {exc} (no NVIDIA driver or GPU on this machine)"
        return _state
    except OSError as exc:  # libnvidia-ml.so missing on some builds
        _state.error = f"NVML library not found: {exc}"
        return _state
    _state.module = pynvml
    if not _state.handles:
        _state.error = "NVML found no GPU"
    return _state


def _query(func: Callable[..., Any], *args: Any) -> Any:
    try:
        return func(*args)
    except Exception:  # NVMLError_NotSupported and friends: one field lost, not the device
        return None


def _memory(p: Any, handle: Any) -> Any:
    """Memory info v2: its `used` leaves out what the driver reserves (v1 counts it: 615 MiB on
    an idle H200 with driver 580 where nvidia-smi shows 0 MiB). v1 on drivers without v2."""
    v2 = getattr(p, "nvmlMemory_v2", None)
    if v2 is not None:
        mem = _query(p.nvmlDeviceGetMemoryInfo, handle, v2)
        if mem is not None:
            return mem
    return _query(p.nvmlDeviceGetMemoryInfo, handle)


def sample_gpus() -> GpuTelemetry:
    """Read every local GPU once. Cheap enough for 1 Hz (a handful of NVML calls per GPU)."""
    nv = _init()
    now = time.time()
    if nv.module is None or not nv.handles:
        return GpuTelemetry(now, (), nv.error or "NVML found no GPU")
    p = nv.module
    out = []
    for i, h in enumerate(nv.handles):
        name = _query(p.nvmlDeviceGetName, h)
        util = _query(p.nvmlDeviceGetUtilizationRates, h)
        mem = _memory(p, h)
        power = _query(p.nvmlDeviceGetPowerUsage, h)
        limit = _query(p.nvmlDeviceGetEnforcedPowerLimit, h)
        sm = _query(p.nvmlDeviceGetClockInfo, h, p.NVML_CLOCK_SM)
        mclk = _query(p.nvmlDeviceGetClockInfo, h, p.NVML_CLOCK_MEM)
        temp = _query(p.nvmlDeviceGetTemperature, h, p.NVML_TEMPERATURE_GPU)
        out.append(
            GpuSample(
                index=i,
                name=name.decode() if isinstance(name, bytes) else name,
                util_percent=float(util.gpu) if util is not None else None,
                mem_util_percent=float(util.memory) if util is not None else None,
                memory_used_mib=mem.used / 2**20 if mem is not None else None,
                memory_total_mib=mem.total / 2**20 if mem is not None else None,
                power_w=power / 1000.0 if power is not None else None,
                power_limit_w=limit / 1000.0 if limit is not None else None,
                sm_clock_mhz=float(sm) if sm is not None else None,
                mem_clock_mhz=float(mclk) if mclk is not None else None,
                temperature_c=float(temp) if temp is not None else None,
            )
        )
    return GpuTelemetry(now, tuple(out), None)


def shutdown() -> None:
    if _state.module is not None:
        _query(_state.module.nvmlShutdown)
    _state.module = None
    _state.error = None
    _state.handles = []
