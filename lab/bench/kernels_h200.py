"""One device call: link, verify and time kimictl's decode kernels against cuBLAS on the lent H200.

Run on the device, after `kimictl kernels build --arch sm_90a --out lab/_build`
here, carrying lab/_build:

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 \
        python3 lab/bench/kernels_h200.py --out $OUT

Writes under --out: verify.json (also the test fixture), bench.json (every row, the summary, the
dispatch table, the layer chains), link.txt, and prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never multicast on the lent machines
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


def main() -> int:
    ap = argparse.ArgumentParser()
    build = ROOT / "lab" / "_build"
    ap.add_argument("--build-dir", type=Path, default=build)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--quick", action="store_true", help="verify only 2 shapes, bench 3 shapes")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument(
        "--vllm-harness",
        type=Path,
        help="a kernels-vs-vllm harness folder (.kbench, its libraries linked under /tmp): time "
        "vLLM 0.33's own SM90 plan at every point too, making the dispatch table three-way",
    )
    ap.add_argument("--report", type=Path, help="render a bench.json as markdown and exit (no GPU)")
    args = ap.parse_args()
    if args.report:
        print(render_markdown(json.loads(args.report.read_text())))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)

    import torch

    from kimictl.kernels.toolchain.bench import bench
    from kimictl.kernels.toolchain.dispatch import K3_GEMM_SHAPES
    from kimictl.kernels.toolchain.harness import LinkError, arch_of, link, open_library
    from kimictl.kernels.toolchain.verify import VERIFY_SHAPES, verify

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu",
         "--format=csv,noheader"], capture_output=True, text=True, check=False,
    )  # fmt: skip
    print("gpu:", smi.stdout.strip(), "| torch", torch.__version__, flush=True)
    arch = arch_of(torch.cuda.get_device_capability())
    arch_dir = args.build_dir / str(arch)
    manifest = json.loads((arch_dir / "manifest.json").read_text())
    print(f"build: {arch} dsl {manifest['dsl_version']} src {manifest['source_hash']} "
          f"{len(manifest['kernels'])} kernels", flush=True)  # fmt: skip

    t = time.perf_counter()
    prebuilt = arch_dir / "libkimictl_kernels.prebuilt.so"
    try:
        so = link(arch_dir)
        note = f"linked {so} on this machine in {time.perf_counter() - t:.2f} s"
    except LinkError as exc:  # fall back to the library linked on the build machine
        if not prebuilt.is_file():
            raise
        shutil.copy2(prebuilt, arch_dir / "libkimictl_kernels.so")
        note = f"link failed here ({exc}); using the prebuilt library"
    (args.out / "link.txt").write_text(note + "\n")
    print("link:", note, flush=True)
    lib = open_library(arch_dir)

    t = time.perf_counter()
    shapes = VERIFY_SHAPES[:2] if args.quick else VERIFY_SHAPES
    log = (args.out / "verify_log.jsonl").open("w")

    def on_check(c: Any) -> None:
        log.write(json.dumps(asdict(c)) + "\n")
        log.flush()
        if not c.ok:
            print("  FAILED", asdict(c), flush=True)

    report = verify(lib, shapes=shapes, on_check=on_check)
    log.close()
    vj = report.to_json()
    vj["manifest"] = {k: manifest[k] for k in ("arch", "dsl_version", "source_hash")}
    vj["seconds"] = round(time.perf_counter() - t, 1)
    (args.out / "verify.json").write_text(json.dumps(vj, indent=1))
    print(f"verify: {'PASS' if report.ok else 'FAIL'} {len(report.checks)} checks, worst rel err "
          f"{report.worst_rel_err:.2e}, {vj['seconds']} s", flush=True)  # fmt: skip
    if args.skip_bench:
        return 0 if report.ok else 1

    shapes_b = K3_GEMM_SHAPES[:3] if args.quick else K3_GEMM_SHAPES
    vllm_run: Any = True  # vLLM itself when installed (none on the lent machine): two-way
    if args.vllm_harness:
        vllm_run, checks = harness_vllm_plan(args.vllm_harness, shapes_b)
        (args.out / "vllm_plan_check.json").write_text(json.dumps(checks, indent=1))
    br = bench(lib, shapes=shapes_b, log=lambda s: print(s, flush=True), vllm=vllm_run)
    bj = br.to_json()
    (args.out / "bench.json").write_text(json.dumps(bj, indent=1))
    dispatch_check(lib, br.table)
    s = bj["summary"]
    print(f"\nbench {br.seconds:.0f} s on {br.device}")
    print(f"{'shape':22s} {'MB':>6s} {'M':>3s} {'cuBLAS us':>9s} {'TB/s':>5s} {'best us':>8s} "
          f"{'TB/s':>5s} {'x':>5s}  dispatched")  # fmt: skip
    for p in s["points"]:
        if p["m"] not in (1, 2, 4, 8, 16, 64):
            continue
        bk = p["best_kernel_us"]
        print(f"{p['shape']:22s} {p['mb']:6.1f} {p['m']:3d} {p['cublas_us']:9.2f} "
              f"{p['cublas_tbps']:5.2f} {bk:8.2f} {p['best_kernel_tbps'] or 0:5.2f} "
              f"{p['speedup']:5.2f}  {p['dispatched']}")  # fmt: skip
    for c in bj["chains"]:
        print(f"chain M={c['m']}: cuBLAS {c['cublas_us']:.1f} us ({c['cublas_tbps']:.2f} TB/s), "
              f"dispatched {c['dispatched_us']:.1f} us ({c['dispatched_tbps']:.2f} TB/s), "
              f"x{c['speedup']:.2f}; kimictl-only {c['kimictl_only_us']:.1f} us; per-point "
              f"table predicts {c['dispatched_predicted_us']:.1f} us; families "
              f"{c.get('chosen_families', 'all')} of "
              + ", ".join(f"{k} {v:.1f}" for k, v in c.get("candidates", {}).items()))  # fmt: skip
        if "plans" in c:
            print(f"  three-way chain M={c['m']}: " + ", ".join(
                f"{k} {v:.1f} us" for k, v in c["plans"].items())
                + f"; kept {c['chain_plan']} ({c['shipped_us']:.1f} us)")  # fmt: skip
    print(
        f"geomean per-point rule alone: {s.get('geomean_speedup_per_point', float('nan')):.3f}; "
        f"geomean dispatched speedup (12 shapes x 7 M): {s['geomean_speedup_dispatched']:.3f}; "
        f"best kernel M<=8: {s['geomean_speedup_best_kernel_m_le_8']:.3f}"
    )
    return 0 if report.ok else 1


def harness_vllm_plan(kb: Path, shapes: Any) -> tuple[Any, list[dict[str, Any]]]:
    """vLLM 0.33.0's SM90 plan for K3 as `run(x, w) -> y`, from the kernels-vs-vllm harness's
    artifacts: its AOT CuteSkinnyGemm objects with the table's config, the wheel's
    dsv3_fused_a_gemm cubin, or cuBLAS where vLLM's table has no entry. Each plan is checked
    against fp64 on fresh inputs first; a point whose plan fails the check raises."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(kb / "harness"))
    import kbench  # type: ignore[import-not-found]

    vl = kbench.VllmLib(kb / "vllm_art", Path("/tmp/libvllm_skinny.so"))
    drv = kbench.Drv(Path("/tmp/libdrv.so"))
    drv.load_cubin(kb / "vllm_art" / vl.man["dsv3_cubin"])
    fns: dict[tuple[int, int, int], Any] = {}
    for (n, k, m), r in vl.plan.items():
        if r["dispatch"] == "cute":
            fns[(n, k, m)] = vl.launcher(r["tbl"])
        elif r["dispatch"] == "dsv3_fused_a":
            if not r["dsv3"]:
                raise RuntimeError(f"no dsv3_fused_a instance in the cubin for {n}x{k} M={m}")
            fns[(n, k, m)] = drv.dsv3_launcher(r["dsv3"], True)

    def run(x: Any, w: Any) -> Any:
        fn = fns.get((int(w.shape[0]), int(w.shape[1]), int(x.shape[0])))
        if fn is None:  # vLLM's table has no entry: UnquantizedLinearMethod
            return F.linear(x, w)
        y = torch.empty((x.shape[0], w.shape[0]), device=x.device, dtype=x.dtype)
        return fn(x, w, y)

    checks = []
    for shape, n, k in shapes:
        w = torch.randn((n, k), device="cuda").to(torch.bfloat16)
        for m in sorted({m for (n2, k2, m) in vl.plan if (n2, k2) == (n, k)}):
            x = torch.randn((m, k), device="cuda").to(torch.bfloat16)
            ref = x.double() @ w.double().t()
            y = run(x, w).double()
            rel = float((y - ref).norm() / ref.norm())
            plan = vl.plan[(n, k, m)]["dispatch"]
            checks.append({"shape": shape, "n": n, "k": k, "m": m, "plan": plan, "rel_err": rel})
            if not rel <= 1e-2:
                raise RuntimeError(f"vLLM plan {plan} at {n}x{k} M={m}: rel err {rel:.2e}")
    print(f"vLLM plan: {len(checks)} points checked against fp64, worst rel err "
          f"{max(c['rel_err'] for c in checks):.2e}", flush=True)  # fmt: skip
    return run, checks


def dispatch_check(lib: Any, table: Any) -> None:
    """decode_gemm through the fresh table on every K3 shape at M = 1, 8, 16 (+ residual at M = 1)
    against the fp64 reference: the routing itself must be numerically right."""
    import torch

    from kimictl.kernels.gemm.wstream_gemm import wstream_gemm_ref
    from kimictl.kernels.toolchain.dispatch import K3_GEMM_SHAPES, decode_gemm

    worst, routes = 0.0, {"kimictl": 0, "cublas": 0}
    for _, n, k in K3_GEMM_SHAPES:
        for m, res in ((1, False), (8, False), (16, False), (1, True)):
            x = torch.randn((m, k), device="cuda").to(torch.bfloat16)
            w = (torch.randn((n, k), device="cuda") * k**-0.5).to(torch.bfloat16)
            r = torch.randn((m, n), device="cuda").to(torch.bfloat16) if res else None
            y, choice = decode_gemm(x, w, residual=r, table=table, library=lib)
            ref = wstream_gemm_ref(x, w, r, fp64=True)
            rel = float((y.double() - ref).norm() / ref.norm())
            worst = max(worst, rel if rel == rel else float("inf"))
            routes[choice.provider] += 1
    print(f"dispatch check: {sum(routes.values())} decode_gemm calls {routes}, worst rel err "
          f"{worst:.2e}", flush=True)  # fmt: skip


def render_markdown(bj: dict[str, Any]) -> str:
    """Per-shape table (M = 1, 2, 4, 8, 16, 32, 64) and the chains (docs/results.md)."""
    s = bj["summary"]
    out = [
        "| shape | N x K | MB | M | cuBLAS us | cuBLAS TB/s | best kimictl us | TB/s | kernel "
        "| dispatched x |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    best: dict[tuple[int, int, int], tuple[float, str]] = {}
    for r in bj["rows"]:
        if r["residual"] or r["provider"] in ("cublas", "cublas_addmm"):
            continue
        key = (r["n"], r["k"], r["m"])
        if key not in best or r["us"] < best[key][0]:
            best[key] = (r["us"], r["provider"])
    for p in s["points"]:
        b = best.get((p["n"], p["k"], p["m"]))
        ours = f"{b[0]:.2f} | {p['n'] * p['k'] * 2 / b[0] / 1e6:.2f} | {b[1]}" if b else "- | - | -"
        out.append(
            f"| {p['shape']} | {p['n']}x{p['k']} | {p['mb']:.1f} | {p['m']} | {p['cublas_us']:.2f} "
            f"| {p['cublas_tbps']:.2f} | {ours} | {p['speedup']:.2f} |"
        )
    out += [
        "",
        "| chain (11 projections, lm_head excluded) | M | MB | cuBLAS us | dispatched us | x "
        "| kimictl-only us | table predicts us | families kept |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in bj["chains"]:
        out.append(
            f"| layer | {c['m']} | {c['mb']} | {c['cublas_us']:.1f} ({c['cublas_tbps']:.2f} TB/s) "
            f"| {c['dispatched_us']:.1f} ({c['dispatched_tbps']:.2f} TB/s) | {c['speedup']:.2f} "
            f"| {c.get('kimictl_only_us', float('nan')):.1f} "
            f"| {c.get('dispatched_predicted_us', float('nan')):.1f} "
            f"| {c.get('chosen_families', 'all')} |"
        )
    three = [c for c in bj["chains"] if "plans" in c]
    if three:
        out += [
            "",
            "| three-way chain | M | vLLM plan us | per-cell mix us | kimictl two-way us | kept |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for c in three:
            p = c["plans"]
            out.append(
                f"| layer | {c['m']} | {p.get('vllm', float('nan')):.1f} "
                f"| {p.get('mix', float('nan')):.1f} | {p.get('kimictl', float('nan')):.1f} "
                f"| {c['chain_plan']} |"
            )
    out += [
        "",
        f"Geometric-mean speedup of the dispatched choice over cuBLAS on the issue grid "
        f"(12 shapes x M in 1,2,4,8,16,32,64): {s['geomean_speedup_dispatched']:.3f}; "
        f"best kimictl kernel vs cuBLAS at M <= 8: {s['geomean_speedup_best_kernel_m_le_8']:.3f}.",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
