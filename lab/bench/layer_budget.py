"""What the layer targets leave for everything but the GEMMs, from recorded H200 data.

No GPU: arithmetic on two committed measurements of the same GPU model,
- the per-GEMM table (tests/fixtures/kernels/bench_h200_table.json: every kimictl variant and
  cuBLAS per (N, K, M), back to back with PDL, weights rotated past L2), and
- a layer run (default lab/tests/fixtures/layer_h200_elem_all.json: stock, vLLM's plan and
  kimictl_elem_all, same run).
Per kind and M it prints the layer time each target allows (0.6x / 0.75x stock, stock at M <= 8
/ 16..64; vLLM's plan / 1.3 at M <= 8; the weight bytes at 85 % of the copy ceiling at M = 1),
the sum of the fastest kimictl kernel per projection alone (plain form; qkv_a_g and the fused
front GEMM scaled by bytes from their table proxies; f_b, 0.4 MB with no table point, left out,
so the sum is a lower bound), the two stand-ins as measured, and what is left: the budget for
every elementwise op, every kernel boundary and f_b. Beside it, what kimictl_elem_all spent on
them: its layer time minus the stand-ins minus its own picks' table times (n/a where a pick has
no table time: shared_down's residual form on cuBLAS at M = 32). Last, the same budget for the
cat layers (kimictl_tuned_cat): latent_up and shared_down as one GEMM over K = 3584 + 768, an
estimate, since the table has no K = 4352 point: latent_up's fastest time scaled by bytes; and
what the cat layer has left if its stand-ins cost nothing beside the GEMMs (the PDL stand-ins of
layer_h200.py's _pdlsi layers let the next GEMMs stream while a stand-in runs).

Usage: python3 lab/bench/layer_budget.py [LAYER_JSON]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kimictl.kernels.layer.ops import dense_layer_ops  # noqa: E402
from kimictl.kernels.toolchain.dispatch import DispatchTable  # noqa: E402

TABLE = ROOT / "tests" / "fixtures" / "kernels" / "bench_h200_table.json"
RUN = ROOT / "lab" / "tests" / "fixtures" / "layer_h200_elem_all.json"
COPY_CEILING_TBPS = 4.3
FRONT = ("router", "latent_down", "shared_gate_up")
# GEMM -> (table point, bytes scale): the layer's own shape where the table has it
PROXY = {"qkv_a_g": (3584, 7168), "front": (6288, 7168)}
CAT = ("latent_up", "shared_down")  # one GEMM in the cat layers, over their concatenated K


def layer_gemms(kind: str) -> dict[str, tuple[int, int]]:
    """The GEMMs kimictl's fused layers launch: the front GEMM for router + latent_down +
    shared_gate_up, everything else as in the op list (f_b left out: no table point)."""
    ops = {o.name: o for o in dense_layer_ops(kind) if o.kind == "gemm"}
    out = {name: (o.n, o.k) for name, o in ops.items() if name not in FRONT and name != "f_b"}
    out["front"] = (sum(ops[n].n for n in FRONT), 7168)
    return out


def gemm_us(table: DispatchTable, name: str, n: int, k: int, m: int, pick: str | None) -> float:
    """Table time of `pick` (or the fastest kimictl kernel) at the GEMM's point, scaled by bytes
    from its proxy when the table lacks the layer's own shape."""
    pn, pk = PROXY.get(name, (n, k))
    meas = table.measurements.get((pn, pk, m, name == "shared_down" and pick is not None))
    if meas is None:
        return math.nan
    if pick is None:
        us = min(v for v in meas.kernels.values() if v > 0)
    elif pick == "cublas":
        us = meas.cublas_us
    else:
        us = meas.kernels.get(pick, math.nan)
    return us * (n * k) / (pn * pk)


def budget(run: dict[str, Any], table: DispatchTable) -> list[dict[str, Any]]:
    rows = []
    for kind, layer in run["layers"].items():
        gemms = layer_gemms(kind)
        for row in layer["rows"]:
            m = row["m"]
            stock, vllm = row["stock"]["us"], row["vllm_plan"]["us"]
            fastest = {g: gemm_us(table, g, n, k, m, None) for g, (n, k) in gemms.items()}
            best = sum(fastest.values())
            cat_k = sum(gemms[g][1] for g in CAT)
            cat = best - sum(fastest[g] for g in CAT) + fastest[CAT[0]] * cat_k / gemms[CAT[0]][1]
            picks = run["plan"]
            ours = sum(
                gemm_us(table, g, n, k, m, picks[f"{g}@all/m{m}" + ("/res" if g == "shared_down"
                                                                      else "")])
                for g, (n, k) in gemms.items()
            )  # fmt: skip
            targets = {"stock x0.6" if m <= 8 else "stock x0.75": stock * (0.6 if m <= 8 else 0.75)}
            if m <= 8:
                targets["vLLM / 1.3"] = vllm / 1.3
            if m == 1:
                targets["85 % ceiling"] = layer["weight_bytes"] / (0.85 * COPY_CEILING_TBPS * 1e6)
            elem_all = row.get("kimictl_elem_all", {}).get("us", math.nan)
            rows.append({
                "kind": kind, "m": m, "stock": stock, "vllm": vllm, "standins": row["standins_us"],
                "gemms_best": best, "gemms_cat": cat, "targets": targets, "elem_all": elem_all,
                "elem_all_gemms": ours, "elem_all_rest": elem_all - row["standins_us"] - ours,
            })  # fmt: skip
    return rows


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else RUN
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"error: cannot read a layer run from {path}: {exc}", file=sys.stderr)
        return 1
    table = DispatchTable.load(TABLE)
    print("| kind | M | target | allows us | best GEMMs alone us | stand-ins us | left for the "
          "rest us | elem_all us | its GEMMs us | its rest us | cat: GEMMs alone us (est.) | "
          "cat: left us | cat, stand-ins hidden: left us |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in budget(run, table):
        for label, us in r["targets"].items():
            left = us - r["gemms_best"] - r["standins"]
            cat_left = us - r["gemms_cat"] - r["standins"]
            cells = (us, r["gemms_best"], r["standins"], left, r["elem_all"], r["elem_all_gemms"],
                     r["elem_all_rest"], r["gemms_cat"], cat_left, us - r["gemms_cat"])  # fmt: skip
            text = " | ".join("n/a" if math.isnan(v) else f"{v:.1f}" for v in cells)
            print(f"| {r['kind'].upper()} | {r['m']} | {label} | {text} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
