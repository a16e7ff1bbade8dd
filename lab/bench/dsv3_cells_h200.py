"""vLLM's `dsv3_fused_a` cells, side by side in one run on the H200.

Times, on each cell where vLLM 0.33's plan runs `dsv3_fused_a` (M = 8, 16 on K = 7168 / N = 2112,
1536 and M = 4, 8 on K = 1536 / N = 2304): cuBLAS, `dsv3_fused_a` (= vLLM's plan there, with and
without PDL), kimictl's best pre-tcws variants on these cells (BASELINES) and the tcws sweep
(`WS_CONFIGS`; its three winners ship as `WS_SHIPPED`), with the shared harness's method
(`.kbench/harness/kbench.py`: CUDA graphs of back-to-back calls on weights rotated past L2, graphs
interleaved round by round). Every variant is checked
against fp64 on fresh inputs (eager), on the timed graph's last output, graph replay against an
eager call (bitwise), and the tcws variants also on shapes with row and k tails.

Device side (from the worktree root, after linking the harness's driver shim to /tmp/libdrv.so):
    python3 lab/bench/dsv3_cells_h200.py --out $OUT
Build side (CPU, nvidia-cutlass-dsl): `python3 lab/bench/dsv3_cells_h200.py --compile` writes
WS_CONFIGS + BASELINES to `.kbench/dsv3/sm_90a`; carry `.kbench` (the kernels-vs-vLLM harness,
kept outside this repo, vLLM's manifest and the dsv3 cubin) and this file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

BASELINES: tuple[str, ...] = (
    "tcpipe_m8_r16_w1x8_k256_p12",
    "tcpipe_m8_r16_w1x8_k256_p16",
    "tcpipe_m8_r16_w1x8_k256_p6",
    "tcstream_m8_w12_u4_g1_et",
    "tcstream_m4_w12_u4_g1_et",
    "wgmma_m8_g1_k128_st12_s4_ef_ws",
    "tcpipe_m16_r16_w1x8_k256_p8",
    "tcpipe_m16_r16_w1x8_k256_p12",
    "wgmma_m16_g1_k128_st10_s4_ef_ws",
)
CELLS: tuple[tuple[str, int, int, tuple[int, ...]], ...] = (
    ("fused_qkv_a", 2112, 7168, (8, 16)),
    ("shared_gate_up", 1536, 7168, (8, 16)),
    ("mla_q_b", 2304, 1536, (4, 8)),
)
TAILS: tuple[tuple[int, int], ...] = ((2100, 1000), (40, 7168), (2304, 1544))


def _m_of(name: str) -> int:
    return int(name.split("_")[1][1:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kbench", default=".kbench")
    ap.add_argument("--build", default=".kbench/dsv3/sm_90a")
    ap.add_argument("--out", default="/tmp/dsv3_out")
    ap.add_argument("--drv-so", default="/tmp/libdrv.so")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--rot-mb", type=float, default=1024.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tails-only", action="store_true", help="the tail checks alone (a probe)")
    ap.add_argument("--compile", action="store_true", help="build the variants here (no GPU)")
    args = ap.parse_args()
    if args.compile:
        from kimictl.kernels.gemm.tcws_gemm import WS_CONFIGS
        from kimictl.kernels.toolchain.build import ALL_CONFIGS, build

        base = [c for c in ALL_CONFIGS if c.name in BASELINES]
        print(build("sm_90a", Path(args.build).parent, configs=[*WS_CONFIGS, *base]).to_json())
        return 0
    kb_dir = Path(args.kbench).resolve()
    sys.path.insert(0, str(kb_dir / "harness"))
    import kbench as kb  # the shared harness: its timing, checks and dsv3 launcher
    import torch

    from kimictl.kernels.toolchain.harness import open_library

    torch.cuda.init()
    torch.zeros(1, device="cuda")  # a context before the driver shim loads dsv3's cubin
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    man = json.loads((kb_dir / "vllm_art" / "manifest.json").read_text())
    plan = {(r["n"], r["k"], r["m"]): r for r in man["plan"]}
    drv = kb.Drv(Path(args.drv_so))
    drv.load_cubin(kb_dir / "vllm_art" / man["dsv3_cubin"])
    build = Path(args.build)
    klib = open_library(build)
    names = [k["name"] for k in json.loads((build / "manifest.json").read_text())["kernels"]]
    src = json.loads((build / "manifest.json").read_text())["source_hash"]
    res: dict[str, Any] = {"env": kb.env_info(), "args": vars(args), "build_source": src,
                           "cells": [], "failures": [], "tails": []}  # fmt: skip

    def fail(msg: str) -> None:
        res["failures"].append(msg)
        kb.log("FAIL " + msg)

    # tails: row clamp (N % 16), k zero-fill (K % 256), few CTAs
    for n, k in TAILS:
        w = torch.randn(n, k, device="cuda", dtype=kb.BF)
        for name in names:
            if not name.startswith("tcws_"):
                continue
            m = _m_of(name)
            rec = kb.fresh_check(kb.kimi_launcher(klib, name), n, k, m, w)
            res["tails"].append({"n": n, "k": k, "variant": name, **rec})
            if not rec["ok"]:
                fail(f"tail {n}x{k} {name}: {rec}")
    if args.tails_only:
        kb.log(f"tails: {len(res['tails'])} checks, {len(res['failures'])} failures")
        return 1 if res["failures"] else 0
    t0 = time.time()
    for shape, n, k, ms in CELLS:
        nc = max(2, math.ceil(args.rot_mb * 1e6 / (n * k * 2)))
        ws = [torch.randn(n, k, device="cuda", dtype=kb.BF) for _ in range(nc)]
        w2 = torch.randn(n, k, device="cuda", dtype=kb.BF)
        for m in ms:
            inst = plan[(n, k, m)]["dsv3"]
            vs: dict[str, Any] = {
                "cublas": kb.cublas,
                "dsv3": drv.dsv3_launcher(inst, True),
                "dsv3_nopdl": drv.dsv3_launcher(inst, False),
            }
            for name in names:
                if _m_of(name) == m:
                    vs[name] = kb.kimi_launcher(klib, name)
            cell: dict[str, Any] = {"shape": shape, "n": n, "k": k, "m": m, "copies": nc,
                                    "vllm_plan": plan[(n, k, m)]["dispatch"],
                                    "variants": {}}  # fmt: skip
            x = torch.randn(m, k, device="cuda", dtype=kb.BF)
            y = torch.full((m, n), kb.NAN, device="cuda", dtype=kb.BF)
            graphs, lasts = {}, {}
            for name, fn in vs.items():
                rec: dict[str, Any] = {}
                cell["variants"][name] = rec
                rec["fresh"] = kb.fresh_check(fn, n, k, m, w2)
                if not rec["fresh"]["ok"]:
                    fail(f"{shape} M={m} {name}: fresh {rec['fresh']}")
                    continue
                g, last, stats = kb.capture([partial(fn, x, w, y) for w in ws], drv)
                graphs[name], lasts[name] = g, last
                rec["graph"] = stats
            per = kb.time_graphs(graphs, args.rounds, args.reps, args.warm)
            ref = kb.ref64(x, ws[-1])
            for name, g in graphs.items():
                rec = cell["variants"][name]
                rec.update(kb.summarize(per[name], nc))
                lasts[name].fill_(kb.NAN)
                g.replay()
                torch.cuda.synchronize()
                rec["timed_path"] = kb.errs(lasts[name], ref)
                replayed = lasts[name].clone()
                ye = torch.full((m, n), kb.NAN, device="cuda", dtype=kb.BF)
                ye = vs[name](x, ws[-1], ye)
                torch.cuda.synchronize()
                rec["graph_eq_eager"] = bool(torch.equal(replayed, ye))
                if not rec["timed_path"]["ok"] or not (rec["graph_eq_eager"] or name == "cublas"):
                    eq = rec["graph_eq_eager"]
                    fail(f"{shape} M={m} {name}: timed {rec['timed_path']} graph==eager {eq}")
                    rec["us_invalid"] = rec.pop("us")
            del graphs, lasts
            res["cells"].append(cell)
            timed = {nm: r["us"] for nm, r in cell["variants"].items() if "us" in r}
            nan = float("nan")
            best = [min(((u, nm) for nm, u in timed.items() if nm.startswith(fam)), default=None)
                    for fam in ("tcws_", "tcpipe_", "tcstream_", "wgmma_")]  # fmt: skip
            kb.log(f"{shape} {n}x{k} M={m}: dsv3 {timed.get('dsv3', nan):.2f} "
                   f"nopdl {timed.get('dsv3_nopdl', nan):.2f} "
                   f"cublas {timed.get('cublas', nan):.2f} "
                   + " ".join(f"{b[1]}={b[0]:.2f}" for b in best if b))  # fmt: skip
            for nm in sorted(timed, key=timed.__getitem__):
                r = cell["variants"][nm]
                kb.log(f"    {nm:40s} {timed[nm]:7.2f} us  spread {r['spread']:.3f}  "
                       f"x dsv3 {timed.get('dsv3', nan) / timed[nm]:.3f}")  # fmt: skip
        del ws, w2
        torch.cuda.empty_cache()
    res["seconds"] = time.time() - t0
    (out / "dsv3_cells.json").write_text(json.dumps(res, indent=1))
    kb.log(f"failures: {len(res['failures'])}; tails checked {len(res['tails'])}; "
           f"{res['seconds']:.1f} s; median of round medians, us per call")  # fmt: skip
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
