"""Typed hardware report: what one or several nodes look like to the K3 fast path.

Every field a probe can fail to read is `T | Unavailable`: a missing library, driver or permission
costs that one field (with its reason), never the report. Reports round-trip through JSON so a
snapshot taken on a GPU node can be checked anywhere (`--save-snapshot` / `--from-snapshot`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

__all__ = [
    "RECORDED_ENV",
    "SCHEMA_VERSION",
    "FabricInfo",
    "GpuInfo",
    "HardwareReport",
    "NodeReport",
    "NvLinkInfo",
    "P2PStatus",
    "Source",
    "Unavailable",
    "known",
]

SCHEMA_VERSION = 1
# The capturing process's variables that decide what vLLM sees there (multicast and
# symmetric-memory switches, visible GPUs); recorded in NodeReport.env. Nothing secret.
RECORDED_ENV = (
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "TORCH_SYMMMEM",
    "NCCL_NVLS_ENABLE",
    "NVSHMEM_DISABLE_NVLS",
    "VLLM_ALLREDUCE_USE_SYMM_MEM",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    # kimictl.kernels.vllm.plugin's switches and table override (doctor reports the plugin)
    "KIMICTL_VLLM_KERNELS",
    "KIMICTL_VLLM_KERNELS_TABLE",
    "KIMICTL_VLLM_LAYER",
)
Source = Literal["live", "recorded", "simulated"]
T = TypeVar("T")


@dataclass(frozen=True)
class Unavailable:
    """A value a probe could not read. Falsy, and prints as `unknown: <reason>`."""

    reason: str

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"unknown: {self.reason}"


def known(value: T | Unavailable) -> bool:
    """True when `value` was actually read (a False/0 reading is still known)."""
    return not isinstance(value, Unavailable)


# --- JSON helpers: an Unavailable is stored as {"unavailable": reason} -------------------------


def _dump(value: Any) -> Any:
    if isinstance(value, Unavailable):
        return {"unavailable": value.reason}
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if hasattr(value, "to_json"):
        return value.to_json()
    return value


def _is_unavailable(raw: Any) -> bool:
    return isinstance(raw, dict) and set(raw) == {"unavailable"}


def _load(raw: Any, conv: Any = None) -> Any:
    if _is_unavailable(raw):
        return Unavailable(str(raw["unavailable"]))
    return conv(raw) if conv is not None and raw is not None else raw


@dataclass(frozen=True)
class NvLinkInfo:
    """One NVLink of one GPU (nvidia-smi nvlink --status / -R)."""

    link: int
    active: bool | Unavailable
    version: str | Unavailable = Unavailable("not read")  # NVLink generation, "5.0"
    remote_pci_bus_id: str | Unavailable = Unavailable("not read")
    remote_device_type: str | Unavailable = Unavailable("not read")  # gpu | switch | ibmnpu

    def to_json(self) -> dict[str, Any]:
        return {k: _dump(getattr(self, k)) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> NvLinkInfo:
        return cls(
            link=int(raw["link"]),
            active=_load(raw.get("active"), bool),
            version=_load(raw.get("version"), str),
            remote_pci_bus_id=_load(raw.get("remote_pci_bus_id"), str),
            remote_device_type=_load(raw.get("remote_device_type"), str),
        )


@dataclass(frozen=True)
class FabricInfo:
    """nvmlDeviceGetGpuFabricInfoV: registration of the GPU with the NVLink fabric manager."""

    state: str  # not_supported | not_started | in_progress | completed
    status: str  # "success" or the NVML error the fabric manager reported
    cluster_uuid: str
    clique_id: int

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> FabricInfo:
        return cls(
            state=str(raw["state"]),
            status=str(raw["status"]),
            cluster_uuid=str(raw["cluster_uuid"]),
            clique_id=int(raw["clique_id"]),
        )


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str | Unavailable
    uuid: str | Unavailable
    compute_capability: tuple[int, int] | Unavailable
    memory_total_mib: int | Unavailable
    mig_mode: bool | Unavailable  # current MIG mode enabled
    ecc: bool | Unavailable  # current ECC mode enabled
    persistence: bool | Unavailable
    throttle_reasons: list[str] | Unavailable
    nvlinks: list[NvLinkInfo] | Unavailable
    fabric: FabricInfo | Unavailable
    multicast_supported: bool | Unavailable
    pci_bus_id: str | Unavailable = Unavailable("not read")
    lost: str | None = None  # set when NVML counts the GPU but cannot open it ("GPU is lost")

    @property
    def label(self) -> str:
        return f"GPU {self.index}"

    @property
    def active_nvlinks(self) -> int | Unavailable:
        if isinstance(self.nvlinks, Unavailable):
            return self.nvlinks
        return sum(1 for link in self.nvlinks if link.active is True)

    def to_json(self) -> dict[str, Any]:
        return {k: _dump(getattr(self, k)) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> GpuInfo:
        def cc(v: Any) -> tuple[int, int]:
            return (int(v[0]), int(v[1]))

        def links(v: Any) -> list[NvLinkInfo]:
            return [NvLinkInfo.from_json(x) for x in v]

        return cls(
            index=int(raw["index"]),
            name=_load(raw.get("name"), str),
            uuid=_load(raw.get("uuid"), str),
            compute_capability=_load(raw.get("compute_capability"), cc),
            memory_total_mib=_load(raw.get("memory_total_mib"), int),
            mig_mode=_load(raw.get("mig_mode"), bool),
            ecc=_load(raw.get("ecc"), bool),
            persistence=_load(raw.get("persistence"), bool),
            throttle_reasons=_load(raw.get("throttle_reasons"), list),
            nvlinks=_load(raw.get("nvlinks"), links),
            fabric=_load(raw.get("fabric"), FabricInfo.from_json),
            multicast_supported=_load(raw.get("multicast_supported"), bool),
            pci_bus_id=_load(raw.get("pci_bus_id", {"unavailable": "not recorded"}), str),
            lost=raw.get("lost"),
        )


@dataclass(frozen=True)
class P2PStatus:
    """nvmlDeviceGetP2PStatus(a, b, NVML_P2P_CAPS_INDEX_NVLINK) for one pair on one node."""

    a: int
    b: int
    status: str  # ok | not_supported | ... ; or "unknown: <why>"

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "status": self.status}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> P2PStatus:
        return cls(a=int(raw["a"]), b=int(raw["b"]), status=str(raw["status"]))


@dataclass(frozen=True)
class NodeReport:
    hostname: str
    captured_at: str  # ISO 8601 UTC
    driver_version: str | Unavailable
    cuda_driver_version: str | Unavailable  # "13.0"
    gpus: list[GpuInfo]
    p2p: list[P2PStatus] | Unavailable
    imex_channels: list[str] | Unavailable
    no_driver_reason: str | None = None  # set when there is no usable NVIDIA driver at all
    device_count: int | Unavailable = Unavailable("not read")  # what NVML counted
    backend: str = "nvml"  # nvml | nvidia-smi | none
    stack: dict[str, Any] | None = None  # StackReport.to_json() of this node, when recorded
    notes: list[str] = field(default_factory=list)
    # RECORDED_ENV as the capturing process had them (set ones only); None: not recorded
    env: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: _dump(getattr(self, k)) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> NodeReport:
        return cls(
            hostname=str(raw["hostname"]),
            captured_at=str(raw["captured_at"]),
            driver_version=_load(raw.get("driver_version"), str),
            cuda_driver_version=_load(raw.get("cuda_driver_version"), str),
            gpus=[GpuInfo.from_json(g) for g in raw.get("gpus", [])],
            p2p=_load(raw.get("p2p"), lambda v: [P2PStatus.from_json(x) for x in v]),
            imex_channels=_load(raw.get("imex_channels"), list),
            no_driver_reason=raw.get("no_driver_reason"),
            device_count=_load(raw.get("device_count", {"unavailable": "not recorded"}), int),
            backend=str(raw.get("backend", "nvml")),
            stack=raw.get("stack"),
            notes=list(raw.get("notes", [])),
            env=_load_env(raw.get("env")),
        )


def _load_env(raw: Any) -> dict[str, str] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"env must be an object of strings, not {type(raw).__name__}")
    return {str(k): str(v) for k, v in raw.items()}


@dataclass(frozen=True)
class HardwareReport:
    """One or several nodes, checked together as one TP group."""

    nodes: list[NodeReport]
    source: Source = "live"

    @property
    def gpus(self) -> list[GpuInfo]:
        return [gpu for node in self.nodes for gpu in node.gpus]

    @property
    def has_driver(self) -> bool:
        return any(node.no_driver_reason is None for node in self.nodes)

    def with_source(self, source: Source) -> HardwareReport:
        return replace(self, source=source)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "source": self.source,
            "nodes": [node.to_json() for node in self.nodes],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> HardwareReport:
        source = raw.get("source", "recorded")
        if source not in ("live", "recorded", "simulated"):
            raise ValueError(f"source must be live, recorded or simulated, not {source!r}")
        return cls(nodes=[NodeReport.from_json(n) for n in raw["nodes"]], source=source)
