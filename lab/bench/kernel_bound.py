"""How far per-GEMM kernels can go on the lent H200, from recorded device runs (no GPU needed).

Reads the measured per-kernel floor (`kernel_floor.py`: time = floor + bytes / bandwidth for the
M = 1 kernel back to back) and the final `kernels_h200.py` bench (cuBLAS at every K3 shape x M),
and answers the two open questions of the kernel targets:

1. Geomean bound: if every grid point ran a kernel at floor + weight bytes / bandwidth (and cuBLAS
   where that is slower), what geomean speedup over cuBLAS would the grid reach? The M = 1 floor
   is a lower bound for larger M, so this is an upper bound for a per-GEMM kernel.
2. Bandwidth needed: for each shape of >= 16 MB, the streaming rate a kernel needs after the floor
   to average 3.8 TB/s, next to the best rate any kernel streamed in the bench.

    python lab/bench/kernel_bound.py [--floor F.json] [--bench B.json] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "lab" / "results"
TARGET_TBPS = 3.8  # target: on every shape of >= 16 MB at M <= 8
BIG_MB = 16.0


def main() -> int:
    from kimictl.kernels.toolchain.dispatch import geomean

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--floor", type=Path, default=RESULTS / "kernel_floor_h200.json")
    ap.add_argument("--bench", type=Path, default=RESULTS / "kernels_h200_final_bench.json")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    floor_run = json.loads(args.floor.read_text())
    bench = json.loads(args.bench.read_text())
    # exact weight megabytes (the summary's "mb" is rounded for display)
    points = [{**p, "mb": p["n"] * p["k"] * 2 / 1e6} for p in bench["summary"]["points"]]
    kernel_rows = [r for r in bench["rows"] if not r["provider"].startswith("cublas")]

    # the assumptions: the fitted floor and the lowest time measured at ~0 bytes; the fitted
    # streaming rate and the best rate any kimictl kernel reached on a K3 shape
    fit = floor_run["fits"]["pdl_early"]
    floors = {"fit": fit["floor_us"], "min": min(r["pdl_early"] for r in floor_run["rows"])}
    best_tbps = max(r["tbps"] for r in kernel_rows)
    rates = {"fit": fit["tbps"], "best": best_tbps}
    reached = bench["summary"]["geomean_speedup_dispatched"]

    bounds = []
    print(f"reached (dispatched, final run): geomean {reached:.3f}x over {len(points)} points")
    for f_label, floor in floors.items():
        for r_label, tbps in rates.items():
            speedups = [
                max(1.0, p["cublas_us"] / (floor + p["mb"] / tbps)) for p in points
            ]  # MB / (TB/s) = us
            g = geomean(speedups)
            bounds.append(
                {"floor": f_label, "floor_us": floor, "rate": r_label, "tbps": tbps, "geomean": g}
            )
            print(
                f"bound: floor {floor:.2f} us ({f_label}) + bytes / {tbps:.2f} TB/s ({r_label}): "
                f"geomean {g:.3f}x; reached = {reached / g:.0%} of it"
            )

    needs = []
    print(
        f"\n{TARGET_TBPS} TB/s at M <= 8 on shapes >= {BIG_MB:g} MB (reached: per-point bench): "
        "streaming rate needed after the floor"
    )
    for shape in dict.fromkeys(p["shape"] for p in points):
        mine = [p for p in points if p["shape"] == shape and p["m"] <= 8]
        mb = mine[0]["mb"]
        if mb < BIG_MB:
            continue
        budget_us = mb / TARGET_TBPS
        worst = min(mb / p["dispatched_us"] for p in mine)
        row = {
            "shape": shape,
            "mb": mb,
            "us_at_target": budget_us,
            "worst_tbps_reached": worst,
            "needed_tbps": {k: mb / (budget_us - f) for k, f in floors.items()},
        }
        needs.append(row)
        need = ", ".join(f"{v:.2f} ({k} floor)" for k, v in row["needed_tbps"].items())
        verdict = "met" if worst >= TARGET_TBPS else "short"
        print(
            f"  {shape:20s} {mb:6.1f} MB  {budget_us:6.2f} us  reached >= {worst:.2f} TB/s "
            f"({verdict}); needs {need} TB/s"
        )
    print(f"best streaming rate of any kimictl kernel in the bench: {best_tbps:.2f} TB/s")
    if args.json:
        doc = {"reached": reached, "bounds": bounds, "bandwidth_needed": needs,
               "best_kernel_tbps": best_tbps}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
