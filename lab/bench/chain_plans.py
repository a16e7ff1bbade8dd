"""Layer-chain plans from recorded kernels-vs-vLLM harness runs (no GPU).

    python lab/bench/chain_plans.py lab/results/kernels_vs_vllm/harness_s1.json [...]

Per M: the harness's measured 11-projection chains under vLLM's plan (`vllm_disp`), choose3 as
the run's table shipped it (`ship_disp`), kimictl's two-way picks (`kimi_disp`) and cuBLAS, and
the plan `dispatch.pick_chain_plan` keeps. Then, over the 84 cells, what the table would ship
with those plans (cell times of the same run): geomean vs vLLM's plan and vs cuBLAS, and the
cells slower than vLLM's plan. With a run whose table already had chain plans, `ship_disp`
is that shipped chain.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kimictl.kernels.toolchain.dispatch import CHAIN_KIMICTL, CHAIN_MIX, CHAIN_VLLM, pick_chain_plan

NAMES = {CHAIN_VLLM: "vllm_disp", CHAIN_MIX: "ship_disp", CHAIN_KIMICTL: "kimi_disp"}


def gm(v: list[float]) -> float:
    return math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")


def us(cell: dict, variant: str | None) -> float | None:
    rec = cell["variants"].get(variant) if variant else None
    return rec.get("us") if rec else None


def report(path: Path) -> None:
    run = json.loads(path.read_text())
    print(f"## {path.name} (kimictl source {run.get('kimi_manifest', {}).get('source_hash')})")
    print("| M | cuBLAS us | vLLM plan us | as the run shipped (ship_disp) us | kimictl two-way us "
          "| plan kept | kept x vLLM | kept x cuBLAS |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---|---:|---:|")
    plan: dict[int, str] = {}
    for ch in run["chains"]:
        im = ch["impls"]
        plans = {p: float(im[v]["us"]) for p, v in NAMES.items() if im.get(v, {}).get("us")}
        kept = plan[ch["m"]] = pick_chain_plan(plans)
        cu = float(im["cublas"]["us"])
        print(f"| {ch['m']} | {cu:.1f} | {plans[CHAIN_VLLM]:.1f} | {plans[CHAIN_MIX]:.1f} "
              f"| {plans[CHAIN_KIMICTL]:.1f} | {kept} | {plans[CHAIN_VLLM] / plans[kept]:.3f} "
              f"| {cu / plans[kept]:.3f} |")  # fmt: skip
    vs_vllm, vs_cublas, slower = [], [], []
    for c in run["cells"]:
        vd = us(c, c["vllm_disp_variant"])
        kd = us(c, "kimi" if c["kimi_choice"] != "cublas" else "cublas")
        p = plan.get(c["m"], CHAIN_MIX)
        shipped = {CHAIN_VLLM: vd, CHAIN_KIMICTL: kd, CHAIN_MIX: us(c, c["ship_variant"])}[p]
        cu = us(c, "cublas")
        if not (vd and shipped and cu):
            continue
        vs_vllm.append(vd / shipped)
        vs_cublas.append(cu / shipped)
        if vd / shipped < 1.0:
            slower.append(f"{c['shape']} M={c['m']} {vd / shipped:.3f}")
    print(f"\n{len(vs_vllm)} cells with these plans: x vLLM's plan {gm(vs_vllm):.3f}, "
          f"x cuBLAS {gm(vs_cublas):.3f}; slower than vLLM's plan at {len(slower)}: "
          + ", ".join(slower) + "\n")  # fmt: skip


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        report(Path(arg))
