"""Measured inputs of the model from `kimictl kernels bench` results.

Fit t = a + bytes / BW through the M=1 GEMMs of the K3 shapes, once for cuBLAS (the stock path's
kind of kernel) and once for the best kimictl CuTe DSL kernel per shape (the specialized path's
kind): the slope gives the achievable HBM bandwidth (efficiency = BW / the GPU's peak), the
intercept the per-kernel overhead. `hbm_efficiency_*` in params.PARAMS come from this fit on the
lent H200 (tests/fixtures/runs/kernels_h200_bench.json); the intercepts cross-check the fitted
per-kernel overheads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimictl.core.errors import InputError
from kimictl.runtime.tuning.systems import SYSTEMS

__all__ = ["KernelFit", "fit_kernel_bench", "least_squares"]


@dataclass(frozen=True)
class KernelFit:
    kind: str  # "stock" (cuBLAS) | "specialized" (best kimictl kernel per shape)
    intercept_us: float
    tb_s: float
    efficiency: float  # tb_s / the device's peak HBM bandwidth
    shapes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "intercept_us": round(self.intercept_us, 3),
            "tb_s": round(self.tb_s, 3),
            "efficiency": round(self.efficiency, 3),
            "shapes": self.shapes,
        }


def least_squares(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the points."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        raise ValueError("need two distinct x values")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


def _peak_for(device: str) -> float:
    for fragment, name in (
        ("GB300", "gb300"),
        ("B300", "b300"),
        ("B200", "b200"),
        ("H200", "h200"),
    ):
        if fragment in device.upper():
            return SYSTEMS[name].hbm_tb_s
    raise InputError(
        f"kernel bench device {device!r} is not a described system; allowed: {', '.join(SYSTEMS)}."
    )


def fit_kernel_bench(path: str | Path) -> dict[str, KernelFit]:
    """Fit both kinds of kernel from a `kimictl kernels bench` JSON (rows of shape/n/k/m/us)."""
    target = Path(path)
    try:
        doc = json.loads(target.read_text())
        rows = [r for r in doc["rows"] if r.get("m") == 1 and not r.get("residual")]
        peak = _peak_for(str(doc.get("device", "")))
    except FileNotFoundError:
        raise InputError(f"kernel bench file {target} does not exist.") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"kernel bench file {target} is not `kimictl kernels bench` JSON ({exc})."
        ) from exc
    stock: dict[str, dict[str, Any]] = {}
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.get("provider") == "cublas":
            stock[row["shape"]] = row
        elif not str(row.get("provider", "cublas")).startswith("cublas"):  # kimictl's kernels
            if row["shape"] not in best or row["us"] < best[row["shape"]]["us"]:
                best[row["shape"]] = row
    fits: dict[str, KernelFit] = {}
    for kind, chosen in (("stock", stock), ("specialized", best)):
        xs = [r["n"] * r["k"] * 2 / 1e6 for r in chosen.values()]  # MB of BF16 weights
        ys = [float(r["us"]) for r in chosen.values()]
        try:
            intercept, slope = least_squares(xs, ys)
        except ValueError:
            raise InputError(
                f"kernel bench file {target} has fewer than two M=1 {kind} shapes to fit."
            ) from None
        tb_s = 1.0 / slope  # MB/us = TB/s
        fits[kind] = KernelFit(kind, intercept, tb_s, tb_s / peak, len(chosen))
    return fits
