"""NVML backend. Every NVML call goes through `_query()`: it imports pynvml and starts NVML on first
use, and turns any failure (no library, no driver, no permission, old driver without the symbol)
into `Unavailable(reason)`. A failed call costs one field, never the report.
"""

from __future__ import annotations

import ctypes
from typing import Any

from kimictl.runtime.checks.hardware._types import (
    FabricInfo,
    GpuInfo,
    NvLinkInfo,
    P2PStatus,
    Unavailable,
)

__all__ = ["nvml_status", "probe_gpus", "probe_p2p", "query_driver"]

_state: dict[str, Any] = {}  # "nvml" -> module once started; "error" -> Unavailable when it cannot

_FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
_P2P_STATUS = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "ioh_topology_not_supported",
    4: "disabled_by_regkey",
    5: "not_supported",
    6: "unknown",
}
# nvmlNvlinkVersion_t -> NVLink generation.
_NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
_REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch", 0xFF: "unknown"}
# Bit -> name of nvmlClocksEventReasons (nvidia-smi -q -d PERFORMANCE names them the same way).
_THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
_MAX_LINKS = 18  # NVLink 4 (H100/H200) and NVLink 5 (B200/GB300) expose 18 links per GPU


def _start() -> Any:
    """Import pynvml and nvmlInit() once; an Unavailable explains why NVML cannot be used."""
    if "nvml" in _state:
        return _state["nvml"]
    if "error" in _state:
        return _state["error"]
    try:
        import pynvml
    except ImportError:
        _state["error"] = Unavailable("nvidia-ml-py (pynvml) is not installed")
        return _state["error"]
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        _state["error"] = Unavailable("no NVIDIA driver: libnvidia-ml.so.1 was not found")
    except pynvml.NVMLError_DriverNotLoaded:
        _state["error"] = Unavailable("no NVIDIA driver: the kernel module is not loaded")
    except pynvml.NVMLError_NoPermission:
        _state["error"] = Unavailable("NVML refused access (no permission on /dev/nvidia*)")
    except pynvml.NVMLError as error:
        _state["error"] = Unavailable(f"NVML could not start: {error}")
    except OSError as error:  # a broken libnvidia-ml.so surfaces as OSError from ctypes
        _state["error"] = Unavailable(f"no NVIDIA driver: {error}")
    else:
        _state["nvml"] = pynvml
        return pynvml
    return _state["error"]


def _decode(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _query(func: str, *args: Any) -> Any:
    """The one NVML choke point: call pynvml.<func>(*args) or return Unavailable(reason)."""
    nvml = _start()
    if isinstance(nvml, Unavailable):
        return nvml
    fn = getattr(nvml, func, None)
    if fn is None:
        return Unavailable(f"this nvidia-ml-py has no {func}")
    try:
        return _decode(fn(*args))
    except nvml.NVMLError_NotSupported:
        return Unavailable(f"{func}: not supported on this GPU/driver")
    except nvml.NVMLError_FunctionNotFound:
        return Unavailable(f"{func}: the driver is too old for this call")
    except nvml.NVMLError as error:
        return Unavailable(f"{func}: {error}")
    except (OSError, AttributeError, TypeError, ValueError) as error:
        return Unavailable(f"{func}: {type(error).__name__}: {error}")


def nvml_status() -> Unavailable | None:
    """None when NVML started, else why it could not."""
    nvml = _start()
    return nvml if isinstance(nvml, Unavailable) else None


def query_driver() -> tuple[Any, Any, Any]:
    """(driver version, CUDA driver version "13.0", device count), each possibly Unavailable."""
    driver = _query("nvmlSystemGetDriverVersion")
    cuda = _query("nvmlSystemGetCudaDriverVersion_v2")
    if isinstance(cuda, Unavailable):
        cuda = _query("nvmlSystemGetCudaDriverVersion")
    if isinstance(cuda, int):
        cuda = f"{cuda // 1000}.{(cuda % 1000) // 10}"
    count = _query("nvmlDeviceGetCount")
    return driver, cuda, count


def _mode(value: Any) -> Any:
    """NVML (current, pending) pairs and plain ints become one bool of the current state."""
    if isinstance(value, Unavailable):
        return value
    if isinstance(value, (list, tuple)):
        value = value[0]
    return bool(value)


def _throttle(handle: Any) -> list[str] | Unavailable:
    mask = _query("nvmlDeviceGetCurrentClocksEventReasons", handle)
    if isinstance(mask, Unavailable):
        mask = _query("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    if isinstance(mask, Unavailable):
        return mask
    names = [name for bit, name in _THROTTLE_BITS.items() if mask & bit]
    rest = mask & ~sum(_THROTTLE_BITS)
    if rest:
        names.append(f"other_0x{rest:x}")
    return names


def _nvlinks(handle: Any) -> list[NvLinkInfo] | Unavailable:
    links: list[NvLinkInfo] = []
    first_error: Unavailable | None = None
    for link in range(_MAX_LINKS):
        state = _query("nvmlDeviceGetNvLinkState", handle, link)
        if isinstance(state, Unavailable):
            # Links past the last one answer "invalid argument"/"not supported": stop there.
            first_error = first_error or state
            break
        active = bool(state)
        version: Any = Unavailable("link inactive")
        if active:
            raw = _query("nvmlDeviceGetNvLinkVersion", handle, link)
            version = raw if isinstance(raw, Unavailable) else _NVLINK_VERSIONS.get(raw, str(raw))
        remote_bus: Any = Unavailable("link inactive")
        remote_type: Any = Unavailable("link inactive")
        if active:
            pci = _query("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            remote_bus = pci if isinstance(pci, Unavailable) else _decode(pci.busId)
            kind = _query("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            remote_type = (
                kind if isinstance(kind, Unavailable) else _REMOTE_TYPES.get(kind, str(kind))
            )
        links.append(NvLinkInfo(link, active, version, remote_bus, remote_type))
    if not links and first_error is not None:
        return first_error
    return links


def _fabric(handle: Any) -> FabricInfo | Unavailable:
    nvml = _start()
    if isinstance(nvml, Unavailable):
        return nvml
    struct_type = getattr(nvml, "c_nvmlGpuFabricInfoV_t", None)
    if struct_type is not None:
        info = struct_type()
        result = _query("nvmlDeviceGetGpuFabricInfoV", handle, ctypes.byref(info))
    else:
        info = nvml.c_nvmlGpuFabricInfo_t()
        result = _query("nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info))
    if isinstance(result, Unavailable):
        return result
    status = int(info.status)
    if status == 0:
        status_text = "success"
    else:
        try:
            status_text = str(nvml.NVMLError(status))
        except Exception:  # an unknown code still gets a name
            status_text = f"nvml error {status}"
    return FabricInfo(
        state=_FABRIC_STATES.get(int(info.state), f"state {int(info.state)}"),
        status=status_text,
        cluster_uuid=_uuid_text(bytes(info.clusterUuid)),
        clique_id=int(info.cliqueId),
    )


def _uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def probe_gpus(count: int, multicast: dict[str, Any]) -> tuple[list[GpuInfo], list[Any]]:
    """GpuInfo for NVML indices 0..count-1 and their handles (None where the GPU is lost).

    `multicast` maps GPU UUID -> bool | Unavailable (from the CUDA driver), or has key "*" holding
    the Unavailable that applies to every GPU.
    """
    gpus: list[GpuInfo] = []
    handles: list[Any] = []
    for index in range(count):
        handle = _query("nvmlDeviceGetHandleByIndex", index)
        if isinstance(handle, Unavailable):
            lost = Unavailable(f"GPU {index} could not be opened: {handle.reason}")
            gpus.append(
                GpuInfo(
                    index,
                    lost,
                    lost,
                    lost,
                    lost,
                    lost,
                    lost,
                    lost,
                    lost,
                    lost,
                    lost,
                    lost,
                    lost,
                    lost=handle.reason,
                )
            )
            handles.append(None)
            continue
        uuid = _query("nvmlDeviceGetUUID", handle)
        cc = _query("nvmlDeviceGetCudaComputeCapability", handle)
        memory = _query("nvmlDeviceGetMemoryInfo", handle)
        pci = _query("nvmlDeviceGetPciInfo", handle)
        mc = (
            multicast.get(uuid, multicast.get("*")) if isinstance(uuid, str) else multicast.get("*")
        )
        if mc is None:
            mc = Unavailable("the CUDA driver did not list this GPU")
        gpus.append(
            GpuInfo(
                index=index,
                name=_query("nvmlDeviceGetName", handle),
                uuid=uuid,
                compute_capability=cc if isinstance(cc, Unavailable) else (int(cc[0]), int(cc[1])),
                memory_total_mib=memory
                if isinstance(memory, Unavailable)
                else int(memory.total // (1024 * 1024)),
                mig_mode=_mode(_query("nvmlDeviceGetMigMode", handle)),
                ecc=_mode(_query("nvmlDeviceGetEccMode", handle)),
                persistence=_mode(_query("nvmlDeviceGetPersistenceMode", handle)),
                throttle_reasons=_throttle(handle),
                nvlinks=_nvlinks(handle),
                fabric=_fabric(handle),
                multicast_supported=mc,
                pci_bus_id=pci if isinstance(pci, Unavailable) else _decode(pci.busId),
            )
        )
        handles.append(handle)
    return gpus, handles


def probe_p2p(handles: list[Any]) -> list[P2PStatus] | Unavailable:
    """NVLink P2P status for every pair of GPUs of this node."""
    nvml = _start()
    if isinstance(nvml, Unavailable):
        return nvml
    index = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2)
    pairs: list[P2PStatus] = []
    for a in range(len(handles)):
        for b in range(a + 1, len(handles)):
            if handles[a] is None or handles[b] is None:
                pairs.append(P2PStatus(a, b, "unknown: a GPU of the pair is lost"))
                continue
            status = _query("nvmlDeviceGetP2PStatus", handles[a], handles[b], index)
            text = (
                str(status)
                if isinstance(status, Unavailable)
                else _P2P_STATUS.get(status, str(status))
            )
            pairs.append(P2PStatus(a, b, text))
    return pairs
