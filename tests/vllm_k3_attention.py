"""vLLM 0.33.0's real K3 attention methods on real torch, around stand-in modules.

Compiles, from the wheel's sources, MultiHeadLatentAttention's `forward`, `_forward_q_lora`,
`_apply_q_lora_attention` and `_unquantized_gemm` (mla.py) and KimiK3DeltaAttention's `forward`
(kda.py), as written (decorators dropped), into classes named as vLLM's, and builds one attention
of each at TP 8 K3 shapes. The caller gives what vLLM's own modules and kernels would be:
`gemm(name, x, w)` for the projections (vLLM's linear method), `norm` for fused_q_kv_rmsnorm
(a Triton kernel in vLLM), `low_latency(x, w)` for vLLM's GEMM plan (None: cuBLAS), the
attention core / KDA recurrence, vLLM's KDA projection overlap and `capturing()`.
Used by tests/vllm_front_src.py (CPU) and lab/bench/layer_front_h200.py (the H200).
"""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MLA_SRC = "vllm/models/kimi_k3/nvidia/mla.py"
KDA_SRC = "vllm/models/kimi_k3/nvidia/kda.py"
STREAMS_SRC = "vllm/utils/multi_stream_utils.py"
LLG_MODULE = "vllm.models.kimi_k3.nvidia.low_latency_gemm"  # kda.forward imports from it
CAPTURE_MODULE = "vllm.compilation.breakable_cudagraph"  # maybe_execute_in_parallel does
TP = 8
K3_KDA_HEADS, K3_KDA_DIM = 96 // TP, 128  # KDA heads per GPU and head dim (K3_SHAPES)
MLA_METHODS = ("forward", "_forward_q_lora", "_apply_q_lora_attention", "_unquantized_gemm")


def vllm_functions(path: Path, cls: str | None, names: tuple[str, ...], ns: dict) -> dict:
    """`names` of class `cls` (module level when None) in `path`, compiled as written
    (decorators dropped) with `ns` as their globals, with the module's _UPPER constants."""
    tree = ast.parse(path.read_text())
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(
            isinstance(t, ast.Name) and t.id.startswith("_") and t.id.isupper()
            for t in node.targets
        ):
            body.append(node)  # _GATE_MULTI_STREAM_TOKEN_THRESHOLD and the like
        if cls is None:
            items = [node]
        else:
            items = node.body if isinstance(node, ast.ClassDef) and node.name == cls else []
        for item in items:
            if isinstance(item, ast.FunctionDef) and item.name in names:
                item.decorator_list = []
                body.append(item)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), ns)  # vLLM's code
    missing = [n for n in names if n not in ns]
    assert not missing, f"{cls or 'module'} in {path} has no {missing}"
    return {n: ns[n] for n in names}


@dataclass
class Kernels:
    """What vLLM's modules and GPU kernels are in this run."""

    gemm: Callable[[str, Any, Any], Any]  # a projection module's forward: (name, x, w) -> y
    norm: Callable[..., Any]  # fused_q_kv_rmsnorm(qr, kv, q_w, kv_w, eps) -> (qr, kv)
    low_latency: Callable[[Any, Any], Any]  # try_low_latency_gemm(x, w) -> y | None
    mla_core: Callable[..., None]  # _attention(positions, q, kv_c_normed, k_pe, out)
    kda_core: Callable[..., None]  # _forward(mixed_qkv=, g1=, g2=, beta=, core_attn_out=)
    overlap: Callable[..., Any]  # run_kda_projection_overlap(x, w_in, w_fb, stream, events)
    capturing: Callable[[], bool]  # torch.cuda.is_current_stream_capturing, as kda.py asks


def attention_classes(root: Path, k: Kernels, torch: Any) -> dict[str, type]:
    """{"mla": class, "kda": class} with vLLM's method bodies, their globals pointing at `k`."""
    import torch.nn.functional as F
    from einops import rearrange

    llg = types.ModuleType(LLG_MODULE)
    llg.run_kda_projection_overlap = k.overlap  # type: ignore[attr-defined]
    capture = types.ModuleType(CAPTURE_MODULE)
    capture.BreakableCUDAGraphCapture = types.SimpleNamespace(is_active=k.capturing)  # type: ignore[attr-defined]
    sys.modules.setdefault(LLG_MODULE, llg)
    sys.modules.setdefault(CAPTURE_MODULE, capture)
    sys.modules[LLG_MODULE].run_kda_projection_overlap = k.overlap  # type: ignore[attr-defined]
    sys.modules[CAPTURE_MODULE].BreakableCUDAGraphCapture = capture.BreakableCUDAGraphCapture  # type: ignore[attr-defined]

    class Cuda:
        def __getattr__(self, name: str) -> Any:
            return getattr(torch.cuda, name)

        def is_current_stream_capturing(self) -> bool:
            return k.capturing()

    class Torch:  # real torch, the capture question answered by `k`
        cuda = Cuda()

        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

    streams = vllm_functions(root / STREAMS_SRC, None, ("maybe_execute_in_parallel",),
                             {"torch": torch, "Any": Any, "Callable": Callable})  # fmt: skip
    ns_mla = {"torch": torch, "F": F, "fused_q_kv_rmsnorm": k.norm,
              "try_low_latency_gemm": k.low_latency, "_gate_sigmoid_mul": lambda a, g:
              a * g.sigmoid(), **streams}  # fmt: skip
    mla = vllm_functions(root / MLA_SRC, "MultiHeadLatentAttention", MLA_METHODS, ns_mla)
    kda = vllm_functions(root / KDA_SRC, "KimiK3DeltaAttention", ("forward",),
                         {"torch": Torch(), "rearrange": rearrange})  # fmt: skip
    return {
        "mla": type("MultiHeadLatentAttention", (), dict(mla)),
        "kda": type("KimiK3DeltaAttention", (), dict(kda)),
    }


def make_attention(kind: str, cls: type, k: Kernels, torch: Any, device: Any = "cpu",
                   gate_stream: Any = None) -> Any:  # fmt: skip
    """One attention of `kind` at TP 8 with zeroed bf16 weights on `device` (load them after
    the install hook, in place, as vLLM does). `gate_stream`: MLA's aux stream for its gate
    GEMM (vLLM gives one when the weights are unquantized), None for the fused qkv_a_g GEMM."""
    from kimictl.deployment.k3 import K3_SHAPES
    from kimictl.kernels.layer.elem import EPS

    s, h, bf16 = K3_SHAPES, K3_SHAPES["hidden_size"], torch.bfloat16

    class Linear:
        def __init__(self, name: str, n: int, kk: int) -> None:
            self.name, self.return_bias = name, True
            w = torch.zeros(n, kk, dtype=bf16, device=device)
            self.weight = torch.nn.Parameter(w, requires_grad=False)

        def forward(self, x: Any) -> Any:
            return k.gemm(self.name, x, self.weight), None

        def __call__(self, x: Any) -> Any:
            return self.forward(x)

    class Norm:
        def __init__(self, n: int) -> None:
            w = torch.zeros(n, dtype=bf16, device=device)
            self.weight = torch.nn.Parameter(w, requires_grad=False)
            self.variance_epsilon = EPS

    a = cls()
    if kind == "mla":
        heads = s["mla_heads"] // TP
        lora = s["q_lora_rank"] + s["kv_lora_rank"] + s["qk_rope_head_dim"]
        events = (torch.cuda.Event(), torch.cuda.Event()) if gate_stream is not None else None
        a.__dict__.update(
            q_lora_rank=s["q_lora_rank"], kv_lora_rank=s["kv_lora_rank"],
            qk_rope_head_dim=s["qk_rope_head_dim"], num_local_heads=heads,
            qk_head_dim=s["qk_nope_head_dim"] + s["qk_rope_head_dim"], v_head_dim=s["v_head_dim"],
            rms_norm_eps=EPS, use_output_gate=True, _gate_events=events, aux_stream=gate_stream,
            fused_qkv_a_g_proj=Linear("fused_qkv_a_g_proj", lora + heads * s["v_head_dim"], h),
            q_a_layernorm=Norm(s["q_lora_rank"]), kv_a_layernorm=Norm(s["kv_lora_rank"]),
            q_b_proj=Linear("q_b_proj", heads * (s["qk_nope_head_dim"] + s["qk_rope_head_dim"]),
                            s["q_lora_rank"]),
            o_proj=Linear("o_proj", h, heads * s["v_head_dim"]), gemm_rs_ar=None,
            _attention=k.mla_core,
        )  # fmt: skip
        return a
    heads = s["kda_heads"] // TP
    proj = heads * s["kda_head_dim"]
    packed = 4 * proj + s["kda_head_dim"] + heads
    a.__dict__.update(
        hidden_size=h, local_projection_size=proj, head_dim=s["kda_head_dim"],
        local_num_heads=heads, in_proj_padding=-packed % 16,
        in_proj_qkvgfab=Linear("in_proj_qkvgfab", packed + -packed % 16, h),
        f_b_proj=Linear("f_b_proj", proj, s["kda_head_dim"]),
        o_proj=Linear("o_proj", h, proj), gemm_rs_ar=None, _forward=k.kda_core,
        _projection_overlap_max_tokens=14, _projection_events=("e0", "e1"),
        _projection_aux_stream="aux",
    )  # fmt: skip
    return a


def params(attn: Any, kind: str) -> list[Any]:
    """Segment f's parameters of `attn` (layer_route.FRONT_PARAMS), then o_proj's weight."""
    from kimictl.kernels.vllm.layer_route import FRONT_PARAMS

    out = []
    for path in FRONT_PARAMS[kind]:
        mod = attn
        for part in path.split("."):
            mod = getattr(mod, part)
        out.append(mod)
    return [*out, attn.o_proj.weight]


def load(attns: list[Any], kind: str, gen: Any, torch: Any) -> None:
    """The same random checkpoint into each of `attns`, in place (vLLM's loaders copy_):
    weights 0.02 * randn, norm weights 1 + 0.1 * randn."""
    for ps in zip(*(params(a, kind) for a in attns), strict=True):
        p0 = ps[0]
        w = torch.randn(p0.shape, generator=gen, device=p0.device)
        w = 0.02 * w if p0.dim() == 2 else 1 + 0.1 * w
        for p in ps:
            p.data.copy_(w.to(p.dtype))


class Root:
    """A model of decoder layers around `attns`, as vLLM's install hook walks one."""

    def __init__(self, attns: list[Any]) -> None:
        self.children = [types.SimpleNamespace(self_attn=a, is_moe_layer=True,
                                               input_layernorm=None, layer_idx=i)
                         for i, a in enumerate(attns)]  # fmt: skip

    def modules(self) -> Any:
        return iter([self, *self.children])
