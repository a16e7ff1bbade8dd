"""Hardware descriptions the performance model reads: one `System` per GPU platform.

Figures are vendor datasheet values (per GPU). Where a vendor publishes no figure (NVLink latency),
the value is an assumption and says so in `sources`. The model reads only these fields; it never
guesses from a GPU name elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kimictl.core.errors import InputError

if TYPE_CHECKING:
    from kimictl.runtime.tuning.commcurve import CommCurve

__all__ = [
    "SYSTEMS",
    "KernelOverheads",
    "System",
    "get_system",
    "system_for_gpu_name",
    "system_from_report",
]

# No vendor publishes a GPU-to-GPU NVLink round-trip latency. 1 us is the order of magnitude of a
# flag write to a peer through an NVSwitch plus the memory fences around it; used only for the
# synchronisation cost of an all-reduce (model.py `_allreduce_us`).
_NVLINK_LATENCY_NOTE = "NVLink latency: no vendor figure; 1 us assumed (peer flag write + fences)"


@dataclass(frozen=True)
class KernelOverheads:
    """Per-kernel overheads measured on this node's layer (tuning.layer_overhead), used in place
    of the fitted `kernel_overhead_us_<path>` parameters; `source` says where they come from."""

    stock_us: float
    specialized_us: float
    source: str

    def values(self) -> dict[str, float]:
        """By parameter name, as params.PARAMS names the fitted ones they replace."""
        return {
            "kernel_overhead_us_stock": self.stock_us,
            "kernel_overhead_us_specialized": self.specialized_us,
        }


@dataclass(frozen=True)
class System:
    """One GPU platform, per-GPU figures."""

    name: str
    gpu: str
    compute_capability: tuple[int, int]
    sm_count: int
    hbm_gib: float
    hbm_tb_s: float  # peak HBM bandwidth, TB/s (1e12 B/s)
    nvlink_gb_s: float  # NVLink bandwidth per GPU per direction, GB/s (1e9 B/s)
    nvlink_latency_us: float
    nvlink_domain: int  # GPUs in one NVLink domain (TP ranks must share one)
    bf16_tflops: float  # dense BF16 tensor-core peak, TFLOP/s
    sources: tuple[str, ...] = field(default_factory=tuple)
    # a measured all-reduce curve (`kimictl tune --comm-curve`); None: the spec-sheet constants
    comm: CommCurve | None = None
    # per-kernel overheads measured on this node (`kimictl tune` reads the node's layer record);
    # None: the fitted ones
    overheads: KernelOverheads | None = None

    def communication(self, tp: int | None = None) -> str:
        """Where the all-reduce term comes from, in words (the output says which)."""
        if self.comm is not None:
            return self.comm.describe(self.name, tp)
        return (
            f"spec-sheet constants ({self.name}: NVLink {self.nvlink_gb_s:g} GB/s per direction, "
            f"{self.nvlink_latency_us:g} us latency assumed)"
        )

    @property
    def specialized_supported(self) -> bool:
        """vLLM rule 1: the specialized decode needs compute capability 10.x (SM100/SM103)."""
        return self.compute_capability[0] == 10

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpu": self.gpu,
            "compute_capability": list(self.compute_capability),
            "sm_count": self.sm_count,
            "hbm_gib": self.hbm_gib,
            "hbm_tb_s": self.hbm_tb_s,
            "nvlink_gb_s": self.nvlink_gb_s,
            "nvlink_latency_us": self.nvlink_latency_us,
            "nvlink_domain": self.nvlink_domain,
            "bf16_tflops": self.bf16_tflops,
            "sources": list(self.sources),
            "communication": self.comm.to_json() if self.comm is not None else "spec sheet",
        }


SYSTEMS: dict[str, System] = {
    "gb300": System(
        name="gb300",
        gpu="NVIDIA GB300 (Blackwell Ultra, GB300 NVL72)",
        compute_capability=(10, 3),
        sm_count=160,
        hbm_gib=268.0,  # 288 GB HBM3e
        hbm_tb_s=8.0,
        nvlink_gb_s=900.0,  # NVLink 5: 1.8 TB/s bidirectional per GPU
        nvlink_latency_us=1.0,
        nvlink_domain=72,
        bf16_tflops=2500.0,
        sources=(
            "NVIDIA GB300 NVL72 datasheet: 288 GB HBM3e and 8 TB/s per GPU, NVLink 5 1.8 TB/s "
            "per GPU, 72 GPUs in one NVLink domain",
            "NVIDIA technical blog 'Inside NVIDIA Blackwell Ultra' (2025): 160 SMs",
            "BF16 dense: NVIDIA Blackwell Ultra datasheet (~2.5 PFLOPS dense per GPU)",
            _NVLINK_LATENCY_NOTE,
        ),
    ),
    "b300": System(
        name="b300",
        gpu="NVIDIA B300 (Blackwell Ultra, HGX B300)",
        compute_capability=(10, 3),
        sm_count=160,
        hbm_gib=268.0,  # 288 GB HBM3e
        hbm_tb_s=8.0,
        nvlink_gb_s=900.0,
        nvlink_latency_us=1.0,
        nvlink_domain=8,  # HGX board: one NVSwitch domain of 8 GPUs
        bf16_tflops=2250.0,
        sources=(
            "NVIDIA HGX B300 datasheet: 288 GB HBM3e and 8 TB/s per GPU, NVLink 5 1.8 TB/s per "
            "GPU, 8 GPUs per NVLink domain",
            "NVIDIA technical blog 'Inside NVIDIA Blackwell Ultra' (2025): 160 SMs",
            _NVLINK_LATENCY_NOTE,
        ),
    ),
    "b200": System(
        name="b200",
        gpu="NVIDIA B200 (Blackwell, HGX B200)",
        compute_capability=(10, 0),
        sm_count=148,
        hbm_gib=167.6,  # 180 GB HBM3e
        hbm_tb_s=8.0,
        nvlink_gb_s=900.0,
        nvlink_latency_us=1.0,
        nvlink_domain=8,
        bf16_tflops=2250.0,
        sources=(
            "NVIDIA HGX B200 / DGX B200 datasheet: 180 GB HBM3e and 8 TB/s per GPU, NVLink 5 "
            "1.8 TB/s per GPU, 8 GPUs per NVLink domain, 2.25 PFLOPS dense BF16",
            "148 SMs: CUDA deviceQuery on B200 (multiProcessorCount)",
            _NVLINK_LATENCY_NOTE,
        ),
    ),
    "h200": System(
        name="h200",
        gpu="NVIDIA H200 SXM (Hopper)",
        compute_capability=(9, 0),
        sm_count=132,
        hbm_gib=131.3,  # 141 GB HBM3e
        hbm_tb_s=4.8,
        nvlink_gb_s=450.0,  # NVLink 4: 900 GB/s bidirectional per GPU
        nvlink_latency_us=1.0,
        nvlink_domain=8,
        bf16_tflops=989.0,
        sources=(
            "NVIDIA H200 datasheet: 141 GB HBM3e, 4.8 TB/s, NVLink 900 GB/s, 989 TFLOPS dense BF16",
            "132 SMs: the lent H200's multiProcessorCount",
            "Measured on that H200: 4.30-4.4 TB/s achievable HBM read (docs/results.md)",
            _NVLINK_LATENCY_NOTE,
        ),
    ),
}


def get_system(name: str) -> System:
    """The `System` called `name` (case-insensitive); InputError naming the allowed values."""
    key = name.strip().lower()
    if key not in SYSTEMS:
        raise InputError(
            f"--system {name!r} is not a known system; allowed: {', '.join(SYSTEMS)}.",
            hint="or pass --from-snapshot with a `kimictl doctor --save-snapshot` JSON",
        )
    return SYSTEMS[key]


# GPU product-name fragments -> system, most specific first ("GB300" also contains "B300").
_NAME_FRAGMENTS: tuple[tuple[str, str], ...] = (
    ("GB300", "gb300"),
    ("B300", "b300"),
    ("GB200", "b200"),
    ("B200", "b200"),
    ("H200", "h200"),
)


def system_for_gpu_name(name: str) -> str | None:
    """The system a GPU product name belongs to ("NVIDIA H200" -> "h200"), or None."""
    for fragment, system_name in _NAME_FRAGMENTS:
        if fragment in name.upper():
            return system_name
    return None


def system_from_report(report: Any) -> tuple[System, int]:
    """(system, GPU count) from a hardware report (kimictl.runtime.checks.hardware.HardwareReport).

    Raises InputError when the report has no GPUs or a GPU this model does not describe.
    """
    gpus = list(getattr(report, "gpus", []) or [])
    if not gpus:
        raise InputError(
            "the hardware snapshot lists no GPUs, so there is nothing to model.",
            hint="pass --system gb300|b300|b200|h200 and --gpus N instead",
        )
    names = {str(getattr(gpu, "name", "")) for gpu in gpus}
    found = {system_for_gpu_name(name) for name in names}
    if len(found) == 1 and None not in found:
        return SYSTEMS[str(found.pop())], len(gpus)
    raise InputError(
        f"the hardware snapshot's GPUs ({', '.join(sorted(names))}) are not a system this model "
        f"describes; allowed: {', '.join(SYSTEMS)}.",
        hint="pass --system explicitly to model one of the described systems",
    )
