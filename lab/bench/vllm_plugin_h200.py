"""H200 proof of kimictl's vLLM plugin on a decode-step-shaped model (no vLLM server needed).

The model is the 11 projections of one K3 layer at TP8 (`K3_GEMM_SHAPES` without the LM head),
each a torch module with vLLM's linear-method interface (`layer.quant_method.apply(layer, x,
bias)`, weight [N, K] bf16). Two builds of it run:
- `vllm-fallback`: every module on the method vLLM's UnquantizedLinearMethod runs on CUDA
  (F.linear = cuBLAS). vLLM's own SM90 kernels (CuTe skinny GEMM, dsv3_fused_a) are NOT in this
  run: they need vLLM's compiled extension and the CuTe DSL JIT, absent on the lent machine.
- `plugin`: the same modules after `vllm_plugin.take_over()` (the plugin's real install logic)
  with a table measured here and now by `kimictl.kernels.toolchain.bench.bench`, three-way with
  vLLM's plan timed as that fallback; the routed modules launch `torch.ops.kimictl.decode_gemm`.
Each build is captured in a CUDA graph per M; outputs are compared with fp64 references and the
graph replay with the eager run; replays are timed interleaved (median of rounds).

Above M = 16 vLLM's plan is that same cuBLAS fallback, so `--ms 32,64` measures what the plugin
changes for a real server there.

Usage (GPU node): python lab/bench/vllm_plugin_h200.py --build DIR [--out FILE.json] [--ms 1,2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import types
from pathlib import Path
from typing import Any

from layer_h200 import m_list  # the --ms parser (this folder is on sys.path as a script)

MS = (1, 2, 4, 8, 16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, required=True, help="folder holding sm_90a/manifest.json")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ms", type=m_list, default=MS, help="comma-separated M (default 1,2,4,8,16)")
    args = ap.parse_args()
    ms = args.ms

    import torch
    import torch.nn.functional as F

    from kimictl.kernels.toolchain import harness, torch_ops
    from kimictl.kernels.toolchain.bench import bench
    from kimictl.kernels.toolchain.dispatch import K3_GEMM_SHAPES, DispatchTable, Measurement
    from kimictl.kernels.vllm import plugin as vllm_plugin

    t0 = time.perf_counter()
    lib = harness.open_library(args.build / "sm_90a", relink=True)
    layer = tuple(s for s in K3_GEMM_SHAPES if s[0] != "lm_head")
    measured = bench(lib, shapes=layer, ms=ms, chain_ms=())
    # three-way: vLLM's plan timed as what vLLM runs without its K3 kernels (its cuBLAS fallback)
    table = DispatchTable(measured.table.device, measured.table.arch)
    for meas in measured.table.measurements.values():
        table.add(
            Measurement(
                meas.n, meas.k, meas.m, meas.cublas_us, meas.kernels, meas.residual, meas.cublas_us
            )
        )

    class FallbackMethod:  # vLLM's UnquantizedLinearMethod.apply on CUDA
        def apply(self, layer: Any, x: Any, bias: Any = None) -> Any:
            return F.linear(x, layer.weight, bias)

    class Proj(torch.nn.Module):
        def __init__(self, n: int, k: int, gen: torch.Generator) -> None:
            super().__init__()
            w = torch.randn((n, k), generator=gen, device="cuda") / k**0.5
            self.weight = torch.nn.Parameter(w.to(torch.bfloat16), requires_grad=False)
            self.quant_method: Any = FallbackMethod()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.quant_method.apply(self, x)

    class DecodeStep(torch.nn.Module):
        def __init__(self, gen: torch.Generator) -> None:
            super().__init__()
            self.names = [s for s, _, _ in layer]
            self.projs = torch.nn.ModuleList(Proj(n, k, gen) for _, n, k in layer)

        def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
            return [p(x) for p, x in zip(self.projs, xs, strict=True)]

    def shim() -> Any:  # the names take_over() reads from vLLM's low_latency_gemm module
        class _Planned:
            pass

        return types.SimpleNamespace(
            torch=torch,
            envs=types.SimpleNamespace(VLLM_BATCH_INVARIANT=False),
            KimiK3LowLatencyLinearMethod=_Planned,
            KimiK3LowLatencyEmbeddingMethod=_Planned,
            LinearBase=Proj,
            UnquantizedLinearMethod=FallbackMethod,
        )

    base = DecodeStep(torch.Generator(device="cuda").manual_seed(0))
    plug = DecodeStep(torch.Generator(device="cuda").manual_seed(0))  # same weights
    report = vllm_plugin.take_over(
        shim(), plug, torch.bfloat16, table=table,
        register_ops=lambda: torch_ops.register_ops(lambda: lib),
    )  # fmt: skip
    print(report.line(), flush=True)

    def capture(model: Any, xs: list[torch.Tensor]) -> tuple[Any, list[torch.Tensor]]:
        for _ in range(2):
            model(xs)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
            outs = model(xs)
        torch.cuda.synchronize()
        return g, outs

    def replay_us(g: Any, n: int = 100) -> float:
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]  # fmt: skip
        for _ in range(5):
            g.replay()
        for a, b in ev:
            a.record()
            g.replay()
            b.record()
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) for a, b in ev) * 1e3

    results: list[dict[str, Any]] = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for m in ms:
        xs = [torch.randn((m, k), generator=gen, device="cuda").to(torch.bfloat16)
              for _, _, k in layer]  # fmt: skip
        refs = [x.double() @ p.weight.double().t() for x, p in zip(xs, base.projs, strict=True)]
        routes = {
            name: (p.quant_method._kimictl_routes[m].kernel
                   if m in getattr(p.quant_method, "_kimictl_routes", {}) else "vllm-plan")
            for name, p in zip(plug.names, plug.projs, strict=True)
        }  # fmt: skip
        eager = plug(xs)
        g_plug, out_plug = capture(plug, xs)
        g_base, out_base = capture(base, xs)
        g_plug.replay()
        g_base.replay()
        torch.cuda.synchronize()

        def rel(outs: list[torch.Tensor], refs: list[torch.Tensor] = refs) -> float:
            return max(
                float((o.double() - r).abs().max() / r.abs().max())
                for o, r in zip(outs, refs, strict=True)
            )

        graph_eq = all(torch.equal(a, b) for a, b in zip(out_plug, eager, strict=True))
        t_plug, t_base = [], []
        for _ in range(args.rounds):  # interleaved rounds: clock and thermal drift hit both
            t_plug.append(replay_us(g_plug))
            t_base.append(replay_us(g_base))
        row = {
            "m": m,
            "plugin_us": statistics.median(t_plug),
            "vllm_fallback_us": statistics.median(t_base),
            "speedup": statistics.median(t_base) / statistics.median(t_plug),
            "rel_err_plugin": rel(out_plug),
            "rel_err_vllm_fallback": rel(out_base),
            "graph_equals_eager": graph_eq,
            "routes": routes,
        }
        results.append(row)
        print(
            f"M={m:2d} step plugin {row['plugin_us']:7.1f} us  vLLM-fallback(cuBLAS) "
            f"{row['vllm_fallback_us']:7.1f} us  x{row['speedup']:.3f}  rel err "
            f"{row['rel_err_plugin']:.2e} (cuBLAS {row['rel_err_vllm_fallback']:.2e})  "
            f"graph==eager {graph_eq}",
            flush=True,
        )
        del g_plug, g_base

    compiled: dict[str, Any] = {}
    try:  # the op is opaque to torch.compile: fullgraph compiles through its fake impl
        m = 4
        xs = [torch.randn((m, k), device="cuda").to(torch.bfloat16) for _, _, k in layer]
        fn = torch.compile(plug, fullgraph=True)
        got, want = fn(xs), plug(xs)
        compiled = {"m": m, "ok": all(torch.equal(a, b) for a, b in zip(got, want, strict=True))}
    except Exception as exc:
        compiled = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    print(f"torch.compile(fullgraph=True) with the kimictl op: {compiled}", flush=True)

    doc = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "install": report.line(),
        "results": results,
        "torch_compile": compiled,
        "table": table.to_json(),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
