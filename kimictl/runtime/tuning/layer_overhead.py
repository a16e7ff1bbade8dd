"""Per-kernel overheads from a layer measured on this node, in place of the fitted ones.

The model's `kernels` term is kernels_per_layer x kernel_overhead_us_<path>, and both overheads are
fitted to published GB300 figures (params.PARAMS). A node that has measured the dense part of a K3
decode layer (`kimictl kernels layer --save`, from lab/bench/layer_h200.py) knows them better for
its own GPU. At M = 1 each measured layer time is its kernels' overhead plus its weight bytes at
the model's bandwidth for that path, so

    overhead = (layer_us - weight_bytes / (peak x hbm_efficiency_<path>)) / graph kernel nodes

with stock = cuBLAS under torch.compile and specialized = the fastest fused kimictl variant,
averaged over the layer kinds measured. Used only when the record's GPU is the system modelled:
`with_node_overheads` returns the system carrying them (`System.overheads`), which the model reads
in place of the fitted values; no parameter changes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kimictl.runtime.tuning.model import PATHS, _hbm_bytes_per_us
from kimictl.runtime.tuning.systems import KernelOverheads, System, system_for_gpu_name

__all__ = ["FITTED_SOURCE", "measured_overheads", "overheads_report", "with_node_overheads"]

FITTED_SOURCE = "fitted to published GB300 layer times (no layer measured on this GPU here)"


def measured_overheads(record: Any, system: System) -> dict[str, float] | None:
    """{"kernel_overhead_us_stock": us, "kernel_overhead_us_specialized": us} from `record` (a
    kimictl.kernels.toolchain.layer_record.LayerRecord), or None when it was measured on another
    GPU or has no M = 1 point with kernel counts."""
    if system_for_gpu_name(record.device) != system.name:
        return None
    points = [p for p in record.points if p.m == 1 and p.stock_kernels and p.best_kernels]
    if not points:
        return None
    measured = {
        "stock": [(p.stock_us, p.stock_kernels, p.weight_bytes) for p in points],
        "specialized": [(p.best_us, p.best_kernels, p.weight_bytes) for p in points],
    }
    out: dict[str, float] = {}
    for path in PATHS:
        per = [
            (us - nbytes / _hbm_bytes_per_us(system, path)) / kernels
            for us, kernels, nbytes in measured[path]
        ]
        out[f"kernel_overhead_us_{path}"] = max(0.0, sum(per) / len(per))
    return out


def with_node_overheads(system: System) -> System:
    """`system` carrying the overheads measured on this node's layer record (`kimictl kernels
    layer --save`) when its GPU is the one modelled; else unchanged (the fitted ones)."""
    from kimictl.kernels.toolchain.layer_record import node_layer_record

    record = node_layer_record()
    values = measured_overheads(record, system) if record is not None else None
    if values is None:
        return system
    assert record is not None  # the values came from it
    shown = ", ".join(
        f"{k.removeprefix('kernel_overhead_us_')} {v:.2f} us" for k, v in values.items()
    )
    measured = KernelOverheads(
        stock_us=values["kernel_overhead_us_stock"],
        specialized_us=values["kernel_overhead_us_specialized"],
        source=f"measured from this node's layer record on {record.device}: {shown}",
    )
    return replace(system, overheads=measured)


def overheads_report(system: System) -> dict[str, Any]:
    """Which per-kernel overheads `system`'s predictions use, for `--json` (`source` in words)."""
    if system.overheads is None:
        return {"measured": False, "source": FITTED_SOURCE}
    return {"measured": True, "source": system.overheads.source, **system.overheads.values()}
