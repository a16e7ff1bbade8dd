"""Issue 35 on the H200: the routed segment f inside vLLM 0.33.0's own K3 attention code, one run.

vLLM's real MLA and KDA attention methods (tests/vllm_k3_attention.py, compiled from the wheel's
sources, carried in VLLM_SRC) run at TP 8 K3 shapes per M, three ways, interleaved round by round:
- `vllm_plan`: the projections through vLLM 0.33.0's SM90 GEMM plan (its CuteSkinnyGemm units and
  dsv3_fused_a cubin built from the wheel into .kbench, cuBLAS where its table says so), as its
  linear method and `try_low_latency_gemm` run them; MLA's gate on the path vLLM takes under its
  breakable CUDA-graph capture (qkv_a and gate as two GEMMs, one stream);
- `kimictl_gemm`: the same with the plugin's GEMM routes: each projection module runs the
  fastest of {vLLM's plan, kimictl, cuBLAS} per the recorded H200 dispatch table (choose3, as
  `plugin.take_over` installs it); MLA's two sliced GEMMs stay vLLM's, as in vLLM;
- `kimictl_layer`: the plugin's layer switch (`plugin.patch_vllm(layer=True)`) on the same
  model: segment f from the node's layer build at every built (kind, M), M = 1, 2 (this run
  decides layer_route.SERVED); o_proj on vLLM's plan.
Not in it: the attention core and the KDA recurrence (no-ops for the timing; deterministic fills
for the correctness check), vLLM's KDA two-stream projection overlap (its kda_skinny_gemm units are
not built here: the eager form runs, both GEMMs on vLLM's plan), `fused_q_kv_rmsnorm` (Triton in
vLLM; here torch.compile of the same two RMSNorms).
Each variant is a CUDA graph of 8 calls over 4 weight copies (past the 60 MB L2), the median of
7 replays per round, the median over rounds; kernel nodes counted from the graph. Correctness:
each variant's attention output (eager, fill cores) vs an fp64 model of the same math, and graph
replay vs eager. One JSON object to OUT/front.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

VARIANTS = ("vllm_plan", "kimictl_gemm", "kimictl_layer")
COPIES = 4
TOL = 2e-2


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm-src", type=Path, default=ROOT / ".kbench" / "vllm_src")
    ap.add_argument("--vllm-art", type=Path, default=ROOT / ".kbench" / "vllm_art")
    ap.add_argument("--vllm-manifest", default="manifest.json")
    ap.add_argument("--vllm-shim", type=Path, default=ROOT / ".kbench" / "drv_shim.cpp")
    ap.add_argument("--out", type=Path, default=ROOT / "out")
    ap.add_argument("--ms", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sweep-build", type=Path, help="a layer build of candidate segment f "
                    "variants (`--make-sweep`): each is checked against fp64 and timed alone, the "
                    "fastest per (kind, M) joins the run beside the node's build")  # fmt: skip
    ap.add_argument("--make-sweep", type=Path, help="CPU: build the tensor-core segment f "
                    "at M = 4 in every (ring, slot) of lab.kernels.layer_chain.RINGS into "
                    "this folder")  # fmt: skip
    args = ap.parse_args()
    if args.make_sweep:
        return make_sweep(args.make_sweep)

    import torch
    import torch.nn.functional as F

    from kimictl.kernels.layer.chain import CHAIN_SHIPPED
    from kimictl.kernels.toolchain.dispatch import CUBLAS, DispatchTable
    from kimictl.kernels.toolchain.torch_ops import register_layer_op, register_ops
    from kimictl.kernels.vllm import plugin
    from lab.bench.layer_h200 import TABLE, count_kernel_nodes, load_vllm_plan, replay_us
    from tests import vllm_k3_attention as va

    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    dev = torch.device("cuda")
    plan_mm, plan_info = load_vllm_plan(args.vllm_art, args.vllm_shim, Path("/tmp/frontbench"),
                                        manifest=args.vllm_manifest)  # fmt: skip
    table = DispatchTable.load(TABLE)
    decode_gemm = register_ops()
    routes: dict[tuple[int, int], dict[int, Any]] = {}

    def routed_gemm(x: Any, w: Any) -> Any:  # the plugin's GEMM route of one module
        key = (int(w.shape[0]), int(w.shape[1]))
        if key not in routes:
            routes[key] = plugin.module_plan(table, *key)
        r = routes[key].get(int(x.shape[0]))
        if r is None:
            return plan_mm(x, w)
        return F.linear(x, w) if r.provider == CUBLAS else decode_gemm(x, w, r.kernel)

    def rms_pair(qr: Any, kv: Any, qw: Any, kvw: Any, eps: float) -> Any:
        def one(x: Any, g: Any) -> Any:
            x32 = x.float()
            return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * g.float()).to(
                x.dtype
            )

        return one(qr, qw), one(kv, kvw)

    norm = torch.compile(rms_pair, dynamic=False)
    state = {"gemm": "vllm_plan", "fill": False, "capture": False}

    def gemm(name: str, x: Any, w: Any) -> Any:
        return routed_gemm(x, w) if state["gemm"] == "kimictl_gemm" else plan_mm(x, w)

    def mla_core(positions: Any, q: Any, kv_c_normed: Any, k_pe: Any, out: Any) -> None:
        if state["fill"]:  # every handed tensor reaches the output (o_proj's input)
            m, heads = q.shape[0], q.shape[1]
            out.copy_(q[:, :, : out.shape[1] // heads].reshape(m, -1)
                      + kv_c_normed.repeat(1, 3) + k_pe.reshape(m, -1).repeat(1, 24))  # fmt: skip

    def kda_core(*, mixed_qkv: Any, g1: Any, g2: Any, beta: Any, core_attn_out: Any) -> None:
        if state["fill"]:
            n, shape = g1.shape[1], g1.shape[1:]
            q = mixed_qkv[:, : shape[1] * shape[2]].reshape(1, *shape)
            core_attn_out.copy_(g1 + g2.view(1, *shape) + q + beta.view(1, n, -1, 1))

    def no_overlap(*a: Any) -> Any:
        raise AssertionError("vLLM's KDA overlap is not in this plan")

    kernels = va.Kernels(gemm=gemm, norm=norm, low_latency=lambda x, w: plan_mm(x, w),
                         mla_core=mla_core, kda_core=kda_core, overlap=no_overlap,
                         capturing=lambda: state["capture"])  # fmt: skip
    classes = va.attention_classes(args.vllm_src, kernels, torch)
    gate_stream = torch.cuda.Stream()
    llg = type("Llg", (), {"torch": torch, "enable_kimi_k3_low_latency_gemm":
                           staticmethod(lambda module, dtype: None)})  # fmt: skip
    variants = plugin._node_layer_variants() or {}
    library: Any = None
    sweep: list[dict[str, Any]] = []
    if args.sweep_build:  # candidates beside the node's build, one library launching both
        from kimictl.kernels.toolchain import torch_ops
        from kimictl.kernels.toolchain.harness import open_library
        from kimictl.kernels.toolchain.torch_ops import default_layer_library
        from lab.kernels.layer_chain import chain_config

        cand = open_library(args.sweep_build / "sm_90a")
        picks, sweep = sweep_segments(cand, torch)
        variants |= picks
        for name in cand.names:  # the op's output length per variant (shipped ones it knows)
            cfg = chain_config(**cand.entry(name))
            torch_ops._layer_y[name] = cfg.sizes["y"]
        node = default_layer_library()
        library = type("Both", (), {"launch": staticmethod(lambda name, *a: (
            cand if name in cand.names else node).launch(name, *a))})  # fmt: skip

    # every built (kind, M), not only the SERVED ones: this run is what decides SERVED
    def layer_op() -> Any:
        return register_layer_op((lambda: library) if library is not None else None)

    plugin.patch_vllm(llg, gemm=False, layer=True, tp_size=lambda: va.TP, modules={},
                      layer_variants=lambda: variants, layer_points=frozenset(variants),
                      register_layer_op=layer_op)  # fmt: skip
    gen = torch.Generator(device=dev).manual_seed(35)
    ms = [int(m) for m in args.ms.split(",")]
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "ms": ms,
        "copies": COPIES, "rounds": args.rounds, "vllm_manifest": args.vllm_manifest,
        "front_variants": sorted(c.name for c in CHAIN_SHIPPED if c.seg == "f"), "kinds": {},
        "variants": {f"{k}/{m}": v for (k, m), v in sorted(variants.items())}, "sweep": sweep,
    }  # fmt: skip

    def capture(calls: list[Any]) -> Any:
        g = torch.cuda.CUDAGraph(keep_graph=True)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        state["capture"] = True  # vLLM's breakable capture: MLA's gate on the main stream
        try:
            with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
                for call in calls:
                    call()
        finally:
            state["capture"] = False
        torch.cuda.synchronize()
        return g

    def point(kind: str, m: int, stock: list[Any], routed: list[Any]) -> dict[str, Any]:
        xs = [torch.randn(m, 7168, generator=gen, device=dev).to(torch.bfloat16)
              for _ in range(COPIES)]  # fmt: skip
        pos = torch.arange(m, device=dev)

        def call(attn: Any, x: Any) -> Any:
            return attn.forward(pos, x) if kind == "mla" else attn.forward(x, pos)

        def setup(variant: str) -> list[Any]:
            state["gemm"] = "kimictl_gemm" if variant == "kimictl_gemm" else "vllm_plan"
            return routed if variant == "kimictl_layer" else stock

        # correctness: eager with fill cores vs an fp64 model of vLLM's math; graph vs eager
        state["fill"] = True
        ref = fp64_attention(kind, stock[0], xs[0], pos, torch)
        row: dict[str, Any] = {"m": m}
        for v in VARIANTS:
            attns = setup(v)
            eager = call(attns[0], xs[0])
            outs: list[Any] = []
            g = capture([functools.partial(lambda o, a: o.append(call(a, xs[0])), outs, attns[0])])
            g.replay()
            torch.cuda.synchronize()
            err = rel(eager, ref)
            row[v] = {"rel_err": err, "graph_equals_eager": bool(torch.equal(outs[0], eager)),
                      "ok": err <= TOL}  # fmt: skip
        state["fill"] = False
        graphs = {}
        for v in VARIANTS:
            attns = setup(v)
            calls = [functools.partial(call, attns[i % COPIES], xs[i % COPIES])
                     for i in range(2 * COPIES)]  # fmt: skip
            graphs[v] = (capture(calls), len(calls))
            row[v]["nodes"] = count_kernel_nodes(graphs[v][0])
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(args.rounds):  # interleaved: a slow stretch hits every variant
            for v in VARIANTS:
                setup(v)
                times[v].append(replay_us(*graphs[v]))
        for v in VARIANTS:
            row[v]["us"] = statistics.median(times[v])
            row[v]["us_rounds"] = times[v]
            row[v]["vs_vllm_plan"] = row[v]["us"] / statistics.median(times["vllm_plan"])
        return row

    for kind in ("mla", "kda"):
        gates = gate_stream if kind == "mla" else None
        stock = [va.make_attention(kind, classes[kind], kernels, torch, dev, gate_stream=gates)
                 for _ in range(COPIES)]  # fmt: skip
        routed = [va.make_attention(kind, classes[kind], kernels, torch, dev, gate_stream=gates)
                  for _ in range(COPIES)]  # fmt: skip
        for a in (*stock, *routed):  # vLLM's KDA two-stream overlap: not built here (above)
            if kind == "kda":
                a._projection_overlap_max_tokens = 0
        llg.enable_kimi_k3_low_latency_gemm(va.Root(routed), torch.bfloat16)
        for i in range(COPIES):
            va.load([stock[i], routed[i]], kind, gen, torch)
        rows = []
        for m in ms:
            rows.append(point(kind, m, stock, routed))
            print(json.dumps({"kind": kind, **rows[-1]}), flush=True)
        served = all(hasattr(a, "_kimictl_front") for a in routed)
        result["kinds"][kind] = {"served": served, "rows": rows}
    result["vllm_plan_used"] = plan_info["used"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "front.json").write_text(json.dumps(result, indent=1))
    return 0


def make_sweep(out: Path) -> int:
    from kimictl.deployment.k3 import K3_MOE_CONFIG
    from kimictl.kernels.toolchain.build import build
    from lab.kernels.families import ALL_FAMILIES
    from lab.kernels.layer_chain import RINGS, LayerChainMmaConfig

    beta = float(K3_MOE_CONFIG["activation_situ_beta"])  # type: ignore[arg-type]
    lbeta = float(K3_MOE_CONFIG["activation_situ_linear_beta"])  # type: ignore[arg-type]
    cfgs = []
    for kind in ("mla", "kda"):
        for ring, slot in RINGS["mma"]:
            try:
                cfgs.append(LayerChainMmaConfig(kind, "f", 4, ring=ring, slot=slot, beta=beta,
                                                lbeta=lbeta))  # fmt: skip
            except ValueError:  # does not fit
                continue
    res = build("sm_90a", out, configs=cfgs, families=ALL_FAMILIES)
    print(f"built {len(res.kernels)} segment f candidates into {res.out_dir}")
    return 0


def sweep_segments(lib: Any, torch: Any) -> tuple[dict[tuple[str, int], str], list[Any]]:
    """Each segment of `lib` alone: vs its fp64 model (chain.segment_ref) and timed in a graph
    of 10 back-to-back launches; the fastest within TOL per (kind, M)."""
    import functools

    from kimictl.kernels.layer.chain import COUNTER, segment_ref
    from lab.bench.layer_h200 import graph_us
    from lab.kernels.layer_chain import chain_config

    gen = torch.Generator(device="cuda").manual_seed(4)
    best: dict[tuple[str, int], tuple[float, str]] = {}
    rows = []
    for name in lib.names:
        cfg = chain_config(**lib.entry(name))
        sz = cfg.sizes
        x, r = (torch.randn(sz[b], generator=gen, device="cuda").to(torch.bfloat16)
                for b in ("x", "r"))  # fmt: skip
        w = (0.02 * torch.randn(sz["w"], generator=gen, device="cuda")).to(torch.bfloat16)
        w[-COUNTER:] = 0
        y = torch.empty(sz["y"], device="cuda", dtype=torch.bfloat16)
        us = graph_us([functools.partial(lib.launch, name, x, w.view(1, -1), y, r)] * 10)
        err = rel(y, segment_ref(cfg, x.double(), r.double(), w.double()))
        rows.append({"name": name, "us": us, "rel_err": err})
        print(json.dumps(rows[-1]), flush=True)
        if err <= TOL:
            best[(cfg.layer, cfg.m)] = min(best.get((cfg.layer, cfg.m), (us, name)), (us, name))
    return {key: name for key, (_, name) in best.items()}, rows


def rel(got: Any, ref: Any) -> float:
    diff = got.double() - ref
    return float(diff.norm() / ref.norm().clamp_min(1e-30))


def fp64_attention(kind: str, attn: Any, x: Any, pos: Any, torch: Any) -> Any:
    """vLLM's attention math with the fill cores, in fp64 from the bf16 weights: an independent
    model (no vLLM method, no kimictl kernel) every variant is held against."""
    from tests import vllm_k3_attention as va

    w = [p.double() for p in va.params(attn, kind)]
    x64 = x.double()
    eps = 1e-6

    def rms(v: Any, g: Any) -> Any:
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * g

    m = x.shape[0]
    if kind == "mla":
        w_qkv, g_q, g_kv, w_qb, w_o = w
        qkv = x64 @ w_qkv.T
        q_c, kv_c, k_pe = qkv[:, :1536], qkv[:, 1536:2048], qkv[:, 2048:2112]
        gate = qkv[:, 2112:]
        q = (rms(q_c, g_q) @ w_qb.T).view(m, 12, 192)
        out = q[:, :, :128].reshape(m, -1) + rms(kv_c, g_kv).repeat(1, 3) + k_pe.repeat(1, 24)
        return (out * torch.sigmoid(gate)) @ w_o.T
    w_in, w_fb, w_o = w
    proj = x64 @ w_in.T
    mixed, g2, fa, beta = proj[:, :4608], proj[:, 4608:6144], proj[:, 6144:6272], proj[:, 6272:6284]
    g1 = fa @ w_fb.T
    core = (g1.view(m, 12, 128) + g2.view(m, 12, 128) + mixed[:, :1536].view(m, 12, 128)
            + beta.view(m, 12, 1))  # fmt: skip
    return core.reshape(m, -1) @ w_o.T


if __name__ == "__main__":
    sys.exit(main())
