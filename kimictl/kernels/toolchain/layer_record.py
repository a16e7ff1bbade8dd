"""A node's measured layer figures: its decode projections back to back, from `kernels bench`.

`kimictl kernels bench` (and `install`, which runs it) times, at every benched M, a K3 layer's 11
projections back to back in one CUDA graph: cuBLAS alone (stock), vLLM's plan where vLLM is
installed, and what the dispatch table ships (its layer-chain plan, or the two-way picks). This
module turns a bench report into the node's record (no torch) and keeps it beside the dispatch
table, where `kernels layer` shows it and `tune` reads its per-kernel overheads.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from kimictl.core.outputs import atomic_write, read_json_input

__all__ = [
    "COPY_CEILING_TBPS",
    "LayerPoint",
    "LayerRecord",
    "arch_of_device",
    "layer_record_path",
    "node_layer_record",
    "read_layer_record",
    "save_layer_record",
]

COPY_CEILING_TBPS = 4.3  # an SM copy on the H200 (docs/results.md, kernels)
RECORD = "layer.json"
KIND = "projections"  # the layer's 11 projections, lm_head excluded (bench._chain)


@dataclass(frozen=True)
class LayerPoint:
    kind: str
    m: int
    weight_bytes: int
    stock_us: float  # cuBLAS alone
    stock_kernels: int | None
    vllm_us: float | None  # vLLM's plan; None when the bench ran without vLLM
    best: str  # what the table ships at this M: its chain plan, or "dispatched" (two-way)
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

    def point(self, kind: str, m: int) -> LayerPoint | None:
        return next((p for p in self.points if (p.kind, p.m) == (kind, m)), None)

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "points": [p.to_json() for p in self.points]}

    @classmethod
    def from_json(cls, raw: Any) -> LayerRecord:
        """From a `kernels bench --json` report (its `chains`) or a saved record (its `points`).
        Raises ValueError/KeyError/TypeError on anything else."""
        if "chains" in raw:
            points = [p for p in (_from_chain(c) for c in raw["chains"]) if p is not None]
        else:
            names = {f.name for f in fields(LayerPoint)}
            points = [
                LayerPoint(**{k: v for k, v in p.items() if k in names}) for p in raw["points"]
            ]
        if not points:
            raise ValueError("no layer point with a timed cuBLAS and kimictl chain")
        points.sort(key=lambda p: (p.kind, p.m))
        return cls(str(raw["device"]), tuple(points))


def _from_chain(chain: dict[str, Any]) -> LayerPoint | None:
    """One bench chain: stock = cuBLAS alone; kimictl = the table's chain plan where it has one
    (`shipped_us`), else the family set the table kept (`dispatched_us`); one launch each."""
    stock = chain["cublas_us"]
    plan = chain.get("chain_plan")
    best: str = plan or "dispatched"
    best_us: Any = chain.get("shipped_us") if plan else chain["dispatched_us"]
    if not (_finite(stock) and _finite(best_us)):
        return None
    vllm: Any = (chain.get("plans") or {}).get("vllm")
    kernels = len(chain["shapes"])
    return LayerPoint(
        KIND, int(chain["m"]), int(chain["bytes"]), float(stock), kernels,
        float(vllm) if _finite(vllm) else None, best, float(best_us), kernels,
    )  # fmt: skip


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


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
        "a layer record (a `kimictl kernels bench --json` report with layer chains)",
        LayerRecord.from_json,
    )


def save_layer_record(record: LayerRecord, arch: str) -> Path:
    path = layer_record_path(arch)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(record.to_json(), indent=1))
    return path


def node_layer_record(arch: str | None = None) -> LayerRecord | None:
    """This node's saved record (for `arch`, or the only one), None when there is none."""
    from kimictl.kernels.toolchain.node import install_dir

    found = [layer_record_path(arch)] if arch else sorted(install_dir().glob(f"*/{RECORD}"))
    found = [p for p in found if p.is_file()]
    return read_layer_record(found[0]) if len(found) == 1 else None
