"""Per-kernel overheads from a layer measured on this node, in place of the fitted ones.

The model's `kernels` term is kernels_per_layer x kernel_overhead_us_<path>, and both overheads are
fitted to published GB300 figures (params.PARAMS). A node that has measured the dense part of a K3
decode layer (`kimictl kernels layer --save`, from lab/bench/layer_h200.py) knows them better for
its own GPU. At M = 1 each measured layer time is its kernels' overhead plus its weight bytes at
the model's bandwidth for that path, so

    overhead = (layer_us - weight_bytes / (peak x hbm_efficiency_<path>)) / graph kernel nodes

with stock = cuBLAS under torch.compile and specialized = the fastest fused kimictl variant,
averaged over the layer kinds measured. Used only when the record's GPU is the system modelled.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from kimictl.runtime.tuning.model import PATHS, _hbm_bytes_per_us
from kimictl.runtime.tuning.params import PARAMS
from kimictl.runtime.tuning.systems import System, system_for_gpu_name

__all__ = ["measured_overheads", "overheads_applied"]


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


@contextmanager
def overheads_applied(values: dict[str, float], source: str) -> Iterator[None]:
    """PARAMS with `values` in place (marked measured, not fitted) for the block, then restored."""
    saved = dict(PARAMS)
    try:
        for name, value in values.items():
            PARAMS[name] = replace(PARAMS[name], value=value, source=source, fitted=False)
        yield
    finally:
        PARAMS.clear()
        PARAMS.update(saved)
