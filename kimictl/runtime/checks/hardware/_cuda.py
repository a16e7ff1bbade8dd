"""CUDA driver attribute query: does each GPU support multicast (NVLS)?

A query only: `cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)`. Nothing here
creates a multicast object, a context or an allocation. cuda-bindings is used when installed;
otherwise the same driver calls go through ctypes on libcuda.so.1 (present wherever the driver is).
"""

from __future__ import annotations

import ctypes
from typing import Any

from kimictl.runtime.checks.hardware._types import Unavailable

__all__ = ["CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED", "query_multicast"]

CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 132  # cuda.h enum CUdevice_attribute


def _nvml_uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _via_cuda_bindings() -> dict[str, Any] | None:
    """UUID -> bool via cuda-bindings; None when cuda-bindings is not installed."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python < 12.6 layout
        except ImportError:
            return None
    (err,) = driver.cuInit(0)
    if int(err) != 0:
        return {"*": Unavailable(f"cuInit failed: {err}")}
    err, count = driver.cuDeviceGetCount()
    if int(err) != 0:
        return {"*": Unavailable(f"cuDeviceGetCount failed: {err}")}
    attr = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
    result: dict[str, Any] = {"source": "cuda-bindings"}
    for ordinal in range(count):
        err, dev = driver.cuDeviceGet(ordinal)
        if int(err) != 0:
            continue
        err, uuid = driver.cuDeviceGetUuid(dev)
        if int(err) != 0:
            continue
        err, value = driver.cuDeviceGetAttribute(attr, dev)
        key = _nvml_uuid(bytes(uuid.bytes))
        result[key] = bool(value) if int(err) == 0 else Unavailable(f"cuDeviceGetAttribute: {err}")
    return result


class _CUuuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_char * 16)]


def _via_libcuda() -> dict[str, Any]:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        return {"*": Unavailable(f"libcuda.so.1 not loadable: {error}")}
    rc = lib.cuInit(0)
    if rc != 0:
        return {"*": Unavailable(f"cuInit returned CUDA error {rc}")}
    count = ctypes.c_int()
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0:
        return {"*": Unavailable(f"cuDeviceGetCount returned CUDA error {rc}")}
    get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
    result: dict[str, Any] = {"source": "libcuda.so.1 via ctypes (cuda-bindings not installed)"}
    for ordinal in range(count.value):
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            continue
        uuid = _CUuuid()
        if get_uuid(ctypes.byref(uuid), dev) != 0:
            continue
        value = ctypes.c_int()
        rc = lib.cuDeviceGetAttribute(
            ctypes.byref(value), CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, dev
        )
        key = _nvml_uuid(bytes(uuid.bytes))
        result[key] = (
            bool(value.value) if rc == 0 else Unavailable(f"cuDeviceGetAttribute: error {rc}")
        )
    return result


def query_multicast() -> dict[str, Any]:
    """Map GPU UUID (NVML spelling) -> bool | Unavailable; key "*" applies to all GPUs on failure,
    key "source" names the backend used."""
    try:
        found = _via_cuda_bindings()
        if found is not None:
            return found
        return _via_libcuda()
    except Exception as error:  # a driver-API surprise costs the multicast field only
        return {"*": Unavailable(f"CUDA driver query failed: {type(error).__name__}: {error}")}
