"""vLLM 0.33.0's real K3 attention methods, with and without kimictl's front route, on CPU torch.

`python tests/vllm_front_src.py` (an interpreter with torch: the CPU runtime's) runs vLLM's own
attention code (tests/vllm_k3_attention.py: MLA's forward / _forward_q_lora /
_apply_q_lora_attention, KDA's forward, compiled from the wheel) at TP 8 K3 shapes on real
tensors. Its GPU kernels get stand-ins: projections are cuBLAS-like F.linear (vLLM's GEMM plan
misses), `fused_q_kv_rmsnorm` (Triton) is RMSNorm of each part in torch; the attention core and
the KDA recurrence are recorders that keep their inputs and write an output derived from them,
so o_proj's result depends on every tensor the route hands over; vLLM's KDA projection overlap
(taken under graph capture, which this run can claim) is F.linear on the same weights.

kimictl's real plugin (`patch_vllm`, layer switch on, GEMM routes off) installs the route on a
model of two decoder layers; the weights are loaded after it, in place, as vLLM's loaders do. The
op runs `chain.segment_ref` (the fp64 model of the kernel the H200 verify checks) through
`register_layer_op`'s library. Prints one JSON object: per (kind, M, capturing) the relative
error of each handed-over tensor and of the attention's output against an unrouted twin, the
GEMMs and kernels each ran, and whether vLLM's KDA overlap setting was restored.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.nn.functional as F

    from kimictl.kernels.layer.chain import CHAIN_SHIPPED, segment_ref
    from kimictl.kernels.toolchain.torch_ops import register_layer_op
    from kimictl.kernels.vllm import plugin
    from tests import vllm_k3_attention as va
    from tests.vllm_src import ensure_sources

    root, why = ensure_sources()
    if root is None:
        print(json.dumps({"skip": why}))
        return 0
    calls: list[str] = []
    seen: dict[str, Any] = {}
    state = {"capturing": False}

    def gemm(name: str, x: Any, w: Any) -> Any:
        calls.append(name)
        return F.linear(x, w)

    def rms(x: Any, g: Any, eps: float) -> Any:
        x64 = x.double()
        return (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * g.double()).to(x.dtype)

    def norm(qr: Any, kv: Any, qw: Any, kvw: Any, eps: float) -> Any:
        calls.append("fused_q_kv_rmsnorm")
        return rms(qr, qw, eps), rms(kv, kvw, eps)

    def mla_core(positions: Any, q: Any, kv_c_normed: Any, k_pe: Any, out: Any) -> None:
        seen.update(q=q.clone(), kv_c_normed=kv_c_normed.clone(), k_pe=k_pe.clone())
        m, heads = q.shape[0], q.shape[1]
        out.copy_(q[:, :, : out.shape[1] // heads].reshape(m, -1) + kv_c_normed.repeat(1, 3)
                  + k_pe.reshape(m, -1).repeat(1, 24))  # fmt: skip

    def kda_core(*, mixed_qkv: Any, g1: Any, g2: Any, beta: Any, core_attn_out: Any) -> None:
        seen.update(mixed_qkv=mixed_qkv.clone(), g1=g1.clone(), g2=g2.clone(), beta=beta.clone())
        n, shape = g1.shape[1], g1.shape[1:]
        q = mixed_qkv[:, : shape[1] * shape[2]].reshape(1, *shape)
        core_attn_out.copy_(g1 + g2.view(1, *shape) + q + beta.view(1, n, -1, 1))

    def overlap(x: Any, w_in: Any, w_fb: Any, stream: Any, events: Any) -> Any:
        calls.append("run_kda_projection_overlap")
        heads, d = va.K3_KDA_HEADS, va.K3_KDA_DIM
        proj = F.linear(x, w_in)
        qkvg = 4 * heads * d
        return (
            proj[:, :qkvg],
            F.linear(proj[:, qkvg : qkvg + d], w_fb),
            proj[:, qkvg + d : qkvg + d + heads],
        )

    kernels = va.Kernels(gemm=gemm, norm=norm, low_latency=lambda x, w: None, mla_core=mla_core,
                         kda_core=kda_core, overlap=overlap,
                         capturing=lambda: state["capturing"])  # fmt: skip
    classes = va.attention_classes(root, kernels, torch)
    kinds = ("mla", "kda")
    routed = {kind: va.make_attention(kind, classes[kind], kernels, torch) for kind in kinds}
    twins = {kind: va.make_attention(kind, classes[kind], kernels, torch) for kind in kinds}

    class CpuLayerLibrary:  # the layer build's launch, as its fp64 model
        cfgs = {c.name: c for c in CHAIN_SHIPPED}

        def launch(self, name: str, x: Any, w: Any, y: Any, r: Any, stream: Any = None) -> None:
            calls.append(name)
            ref = segment_ref(self.cfgs[name], x.double(), r.double(), w.reshape(-1).double())
            y.copy_(ref.to(y.dtype))

    logs: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logs.append(record.getMessage())

    plugin.log.setLevel(logging.INFO)  # the line a served route logs
    plugin.log.addHandler(Grab())
    every = {(c.layer, c.m): c.name for c in CHAIN_SHIPPED if c.seg == "f"}

    def hook(points: Any) -> Any:  # vLLM's install hook, wrapped by kimictl's real plugin
        llg = type("Llg", (), {"torch": torch, "enable_kimi_k3_low_latency_gemm":
                               staticmethod(lambda module, dtype: None)})  # fmt: skip
        plugin.patch_vllm(llg, gemm=False, layer=True, tp_size=lambda: va.TP, modules={},
                          layer_variants=lambda: every, layer_points=points,
                          register_layer_op=lambda: register_layer_op(CpuLayerLibrary))  # fmt: skip
        return llg.enable_kimi_k3_low_latency_gemm

    # the route at every built (kind, M), then as it ships (layer_route.SERVED)
    hook(frozenset(every))(va.Root([routed["mla"], routed["kda"]]), torch.bfloat16)
    shipped = {kind: va.make_attention(kind, classes[kind], kernels, torch) for kind in kinds}
    hook(None)(va.Root([shipped["mla"], shipped["kda"]]), torch.bfloat16)
    # the checkpoint, loaded after the install hook, in place
    gen = torch.Generator().manual_seed(0)
    shared = []
    for kind in kinds:
        va.load([routed[kind], twins[kind]], kind, gen, torch)
        flat = routed[kind]._kimictl_front.flat
        lo, hi = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
        front = va.params(routed[kind], kind)[:-1]
        shared.append(all(lo <= p.data_ptr() < hi for p in front))

    def rel(a: Any, b: Any) -> float:
        return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))

    out: dict[str, Any] = {
        "logs": logs, "weights_in_flat_buffer": shared, "cases": [],
        "shipped": {k: sorted(a._kimictl_front.variants) if hasattr(a, "_kimictl_front") else []
                    for k, a in shipped.items()},
    }  # fmt: skip
    for kind in kinds:
        for m in (1, 2, 3):
            for capturing in (False, True) if kind == "kda" else (False,):
                state["capturing"] = capturing
                x = torch.randn(m, 7168, generator=gen).to(torch.bfloat16)
                pos = torch.arange(m)
                got: dict[str, Any] = {}
                for name, attn in (("vllm", twins[kind]), ("routed", routed[kind])):
                    calls.clear()
                    seen.clear()
                    y = attn.forward(pos, x) if kind == "mla" else attn.forward(x, pos)
                    got[name] = (y, dict(seen), list(calls))
                (yv, sv, cv), (yr, sr, cr) = got["vllm"], got["routed"]
                out["cases"].append({
                    "kind": kind, "m": m, "capturing": capturing,
                    "calls": {"vllm": cv, "routed": cr},
                    "rel": {k: rel(sr[k], sv[k]) for k in sv} | {"out": rel(yr, yv)},
                    "overlap_restored": getattr(routed[kind], "_projection_overlap_max_tokens",
                                                None),
                })  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
