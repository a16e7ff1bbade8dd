"""GPU, NVLink, fabric and multicast probes behind one interface.

Live: `probe_local()` (NVML through one choke point, the CUDA driver for the multicast
attribute, IMEX channel files). Recorded: `load_snapshots(paths)` merges per-node JSON snapshots
into one report that the rules check as one TP group. Nothing here raises for a missing driver or
library: the field becomes `Unavailable(reason)`.
"""

from kimictl.runtime.checks.hardware._probe import probe_local, probe_node
from kimictl.runtime.checks.hardware._snapshot import (
    check_snapshot_target,
    load_snapshot,
    load_snapshots,
    merge,
    save_snapshot,
)
from kimictl.runtime.checks.hardware._types import (
    RECORDED_ENV,
    SCHEMA_VERSION,
    FabricInfo,
    GpuInfo,
    HardwareReport,
    NodeReport,
    NvLinkInfo,
    P2PStatus,
    Source,
    Unavailable,
    known,
)

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
    "check_snapshot_target",
    "known",
    "load_snapshot",
    "load_snapshots",
    "merge",
    "probe_local",
    "probe_node",
    "save_snapshot",
]
