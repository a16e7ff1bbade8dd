"""A node's measured dense-layer figures (issue 17): what `lab/bench/layer_h200.py` recorded.

That script times the dense part of one K3 decode layer (`layer_ops.dense_layer_ops`) on the GPU
in one CUDA graph per (variant, M): stock torch.compile + cuBLAS, vLLM 0.33's SM90 plan, and the
kimictl variants. This module reads its JSON (no torch), keeps per (kind, M) the stock time, the
vLLM plan's and the fastest kimictl variant that passed its checks, and stores a record as the
node's (`kimictl kernels layer --from FILE --save`), where `kernels bench` and `tune` find it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kimictl.runtime.outputs import atomic_write, read_json_input

__all__ = [
    "COPY_CEILING_TBPS",
    "KIMICTL_VARIANTS",
    "LayerPoint",
    "LayerRecord",
    "arch_of_device",
    "layer_record_path",
    "node_layer_record",
    "read_layer_record",
    "save_layer_record",
]

KIMICTL_VARIANTS = (
    "kimictl",
    "kimictl_hfused",
    "kimictl_norm",
    "kimictl_elem",
    "kimictl_elemnorm",
    "kimictl_elem_all",
    "kimictl_tuned",
    "kimictl_tuned_fold",
    "kimictl_tuned_cat",
    "kimictl_tuned_catfold",
)
COPY_CEILING_TBPS = 4.3  # an SM copy on the H200 (../shared/notes/cutedsl-aot.md)
RECORD = "layer.json"


@dataclass(frozen=True)
class LayerPoint:
    kind: str  # "mla" | "kda"
    m: int
    weight_bytes: int
    stock_us: float
    stock_kernels: int | None
    vllm_us: float | None  # vLLM's SM90 plan; None when the run had no vLLM kernels
    best: str  # fastest kimictl variant that passed its checks
    best_us: float
    best_kernels: int | None

    @property
    def vs_stock(self) -> float:
        return self.best_us / self.stock_us

    @property
    def vs_vllm(self) -> float | None:
        """How many times faster than vLLM's plan (> 1: kimictl faster)."""
        return None if self.vllm_us is None else self.vllm_us / self.best_us

    @property
    def tbps(self) -> float:
        return self.weight_bytes / self.best_us / 1e6

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            vs_stock=round(self.vs_stock, 4),
            vs_vllm=None if self.vs_vllm is None else round(self.vs_vllm, 4),
            tbps=round(self.tbps, 3),
            pct_of_copy_ceiling=round(100 * self.tbps / COPY_CEILING_TBPS, 1),
        )
        return out


@dataclass(frozen=True)
class LayerRecord:
    device: str
    points: tuple[LayerPoint, ...]
    raw: dict[str, Any]  # the script's JSON as read (what --save stores)

    def point(self, kind: str, m: int) -> LayerPoint | None:
        return next((p for p in self.points if (p.kind, p.m) == (kind, m)), None)

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "points": [p.to_json() for p in self.points]}

    @classmethod
    def from_json(cls, raw: Any) -> LayerRecord:
        """Raises ValueError/KeyError/TypeError on a document that is not the script's JSON."""
        points: list[LayerPoint] = []
        for kind, layer in raw["layers"].items():
            wb = int(layer["weight_bytes"])
            for row in layer["rows"]:
                stock = row["stock"]
                if not stock.get("ok") or not _finite(stock["us"]):
                    continue  # no valid stock time: nothing to compare against
                ours = [
                    (float(row[v]["us"]), v)
                    for v in KIMICTL_VARIANTS
                    if v in row and row[v].get("ok") and _finite(row[v].get("us"))
                ]
                if not ours:
                    continue
                us, best = min(ours)
                vllm = row.get("vllm_plan")
                vllm_ok = vllm is not None and vllm.get("ok") and _finite(vllm.get("us"))
                points.append(
                    LayerPoint(
                        str(kind), int(row["m"]), wb, float(stock["us"]), _kernels(stock),
                        float(vllm["us"]) if vllm_ok else None, best, us, _kernels(row[best]),
                    )
                )  # fmt: skip
        if not points:
            raise ValueError("no layer point with a checked stock and kimictl time")
        points.sort(key=lambda p: (p.kind, p.m))
        return cls(str(raw["device"]), tuple(points), raw)


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def _kernels(variant: dict[str, Any]) -> int | None:
    nodes = variant.get("nodes") or {}
    return int(nodes["kernel"]) if "kernel" in nodes else None


def arch_of_device(device: str) -> str | None:
    """The build arch of a recorded device name (the record names the GPU, not its arch)."""
    name = device.upper()
    for fragment, arch in (("GB300", "sm_103a"), ("B300", "sm_103a"), ("B200", "sm_100a"),
                           ("H200", "sm_90a"), ("H100", "sm_90a")):  # fmt: skip
        if fragment in name:
            return arch
    return None


def layer_record_path(arch: str) -> Path:
    from kimictl.kernels.toolchain.node import install_dir

    return install_dir() / arch / RECORD


def read_layer_record(path: Path) -> LayerRecord:
    """The record in `path`; InputError (one sentence) when it cannot be read or is not one."""
    return read_json_input(
        path,
        "a layer record from lab/bench/layer_h200.py (with checked rows)",
        LayerRecord.from_json,
    )


def save_layer_record(record: LayerRecord, arch: str) -> Path:
    path = layer_record_path(arch)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(record.raw, indent=1))
    return path


def node_layer_record(arch: str | None = None) -> LayerRecord | None:
    """This node's saved record (for `arch`, or the only one), None when there is none."""
    from kimictl.kernels.toolchain.node import install_dir

    found = [layer_record_path(arch)] if arch else sorted(install_dir().glob(f"*/{RECORD}"))
    found = [p for p in found if p.is_file()]
    return read_layer_record(found[0]) if len(found) == 1 else None
