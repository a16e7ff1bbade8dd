"""The per-kernel floor on the lent H200: how long one decode GEMM takes in a back-to-back graph
when it moves (almost) no bytes, with and without programmatic dependent launch (PDL).

Run on the device after `kimictl kernels build --arch sm_90a --out lab/_build` here, carrying
lab/_build:

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python3 lab/bench/kernel_floor.py

Same method as kimictl/kernels/toolchain/bench.py (graph of >= 16 launches, median of
replays). For each weight size it times: cuBLAS (torch.nn.functional.linear), kimictl's M = 1
weight-streaming kernel
with PDL triggered early (`_et`), the same tile with PDL off (`_nopdl`), and fits
time = floor + bytes / bandwidth over the sizes. The floor is what every GEMM of a layer pays at
its boundary (wait for the previous grid, read x, reduce, store) however early its weights stream.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never multicast on the lent machines
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

# (N, K): from one CTA's worth of rows to a mid-size K3 projection; K = 7168 like most of K3
SIZES = ((2, 7168), (132, 7168), (528, 7168), (1056, 7168), (2112, 7168), (4224, 7168))
VARIANTS = {
    "pdl_early": "wstream_m1_t128_u7_r2_et",
    "pdl_late": "wstream_m1_t128_u7_r2",
    "no_pdl": "wstream_m1_t128_u7_r1_nopdl",
}


def main() -> int:
    import torch
    import torch.nn.functional as F

    from kimictl.kernels.toolchain.bench import MIN_LAUNCHES, time_graph
    from kimictl.kernels.toolchain.dispatch import geomean
    from kimictl.kernels.toolchain.harness import open_library
    from kimictl.runtime.tuning.calibration import least_squares

    lib = open_library(ROOT / "lab" / "_build" / "sm_90a")
    missing = [v for v in VARIANTS.values() if v not in lib.names]
    if missing:
        rebuild = "kimictl kernels build --arch sm_90a --out lab/_build"
        print(f"the build lacks {missing}: rebuild with `{rebuild}`")
        return 1
    dev = torch.device("cuda")
    x = torch.randn((1, 7168), device=dev).to(torch.bfloat16)
    rows: list[dict[str, float | int | str]] = []
    for n, k in SIZES:
        copies = max(MIN_LAUNCHES, -(-(256 << 20) // (n * k * 2)))  # rotate past the 60 MB L2
        copies = min(copies, 256)
        ws = [torch.randn((n, k), device=dev).to(torch.bfloat16) for _ in range(copies)]
        y = torch.empty((1, n), device=dev, dtype=torch.bfloat16)
        times = {"cublas": time_graph([partial(F.linear, x, w) for w in ws])}
        for label, name in VARIANTS.items():
            times[label] = time_graph([partial(lib.launch, name, x, w, y, y) for w in ws])
        rows.append({"n": n, "k": k, "mb": n * k * 2 / 1e6, **times})
        print(f"N={n:5d} K={k} {n * k * 2 / 1e6:6.2f} MB  " + "  ".join(
            f"{lab} {us:6.2f} us" for lab, us in times.items()), flush=True)  # fmt: skip
        del ws
    fits = {}
    for label in ("cublas", *VARIANTS):
        mb = [float(r["mb"]) for r in rows]
        us = [float(r[label]) for r in rows]
        floor, us_per_mb = least_squares(mb, us)
        fits[label] = {"floor_us": floor, "tbps": 1.0 / us_per_mb}
        print(f"fit {label:10s}: floor {floor:5.2f} us + bytes / {1.0 / us_per_mb:4.2f} TB/s")
    print("geomean pdl_early / no_pdl:",
          f"{geomean([float(r['no_pdl']) / float(r['pdl_early']) for r in rows]):.3f}")  # fmt: skip
    out = Path(os.environ.get("OUT", "."))
    (out / "kernel_floor.json").write_text(json.dumps({"rows": rows, "fits": fits}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
