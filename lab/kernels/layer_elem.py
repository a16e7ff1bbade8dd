"""The layer_elem family's sweep (lab only): the elementwise variants the benchmark's
`kimictl_elem` layers launch, their compile function, their fp64 reference and random ABI
tensors. The ops and their config are shipped (kimictl/kernels/layer/elem.py, elem_dsl.py: the
fused layer's segments reuse their row helpers); no shipped path builds them as kernels of their
own. Built through lab.kernels.families (`layer_h200.py --make-build`)."""

from __future__ import annotations

from typing import Any

from kimictl.kernels.layer.elem import EPS, LayerElemConfig

__all__ = ["ELEM_CONFIGS", "LAYER_MS", "elem_configs", "elem_ref", "elem_tensors"]

LAYER_MS = (1, 2, 4, 8, 16, 32, 64)


def elem_configs(kinds: tuple[str, ...] = ("mla", "kda"), ms: tuple[int, ...] = LAYER_MS
                 ) -> tuple[LayerElemConfig, ...]:  # fmt: skip
    """Every elementwise variant the benchmark's `kimictl_elem` layers launch."""
    from kimictl.deployment.k3 import K3_MOE_CONFIG, K3_SHAPES
    from kimictl.kernels.layer.ops import dense_layer_ops

    out: dict[str, LayerElemConfig] = {}
    s, h = K3_SHAPES, K3_SHAPES["hidden_size"]
    beta = float(K3_MOE_CONFIG["activation_situ_beta"])  # type: ignore[arg-type]
    lbeta = float(K3_MOE_CONFIG["activation_situ_linear_beta"])  # type: ignore[arg-type]
    for kind in kinds:
        ops = {op.name: op for op in dense_layer_ops(kind)}
        router, lat, gu = ops["router"].n, ops["latent_down"].n, ops["shared_gate_up"].n
        core, routed = ops["attention_core"].n, ops["routed_experts"].n
        src = ops["q_b" if kind == "mla" else "kda_in"].n  # the attention stand-in's input rows
        for m in ms:
            cfgs = [
                LayerElemConfig("addrms", m, h),
                LayerElemConfig("rms", m, h),
                LayerElemConfig("rms", m, ops["latent_norm"].k),
                LayerElemConfig(
                    "situ",
                    m,
                    gu // 2,
                    x_w=router + lat + gu,
                    off=router + lat,
                    aux_w=router,
                    beta=beta,
                    lbeta=lbeta,
                ),  # fmt: skip
                LayerElemConfig(
                    "rmssitu",
                    m,
                    ops["latent_norm"].k,
                    seg2=gu // 2,
                    off=router + lat,
                    aux_w=router + lat + gu,
                    beta=beta,
                    lbeta=lbeta,
                ),  # fmt: skip
            ]
            if kind == "mla":
                qkv = ops["qkv_a_g"].n
                q_a, kv_a, rope = s["q_lora_rank"], s["kv_lora_rank"], s["qk_rope_head_dim"]
                cfgs += [
                    LayerElemConfig("qkvnorm", m, q_a, x_w=qkv, seg2=kv_a),
                    LayerElemConfig(
                        "gate", m, ops["out_gate"].n, off=q_a + kv_a + rope, aux_w=qkv
                    ),  # fmt: skip
                ]
            # the stand-in copies: each input at the row stride the layer hands it (a GEMM's
            # output or a column slice of the front GEMM's), and contiguous (a fallback); each
            # with the early and the late trigger
            cfgs += [LayerElemConfig("copy", m, w, x_w=x, late=late) for w, x in
                     ((core, src), (core, 0), (routed, router + lat + gu), (routed, 0))
                     for late in (False, True)]  # fmt: skip
            out.update((c.name, c) for c in cfgs)
    return tuple(out.values())


ELEM_CONFIGS: tuple[LayerElemConfig, ...] = ()  # built on request (layer_h200.py --make-build)


def _compile_elem(cfg: LayerElemConfig, arch: str) -> Any:
    """cute.compile one variant against static fake tensors (no dynamic sizes in its header)."""
    import cuda.bindings.driver as cuda  # noqa: F401  (the DSL resolves the stream type)
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32

    from kimictl.kernels.layer.elem_dsl import LayerElem

    def t(shape: tuple[int, ...], dtype: Any = BFloat16) -> Any:
        order = (1, 0) if len(shape) == 2 else (0,)
        return cute.runtime.make_fake_compact_tensor(
            dtype, shape, stride_order=order, assumed_align=16
        )

    m, w = cfg.m, cfg.width
    dummy = t((8,))
    if cfg.op == "addrms":
        args = (t((m, w)), t((w,)), t((2 * m * w,)), t((m, w)))
    elif cfg.op == "rms":
        args = (t((m, w)), t((w,)), t((m * w,)), dummy)
    elif cfg.op == "qkvnorm":
        args = (t((m, cfg.x_w)), t((w + cfg.seg2,)), t((m * (w + cfg.seg2),)), dummy)
    elif cfg.op == "gate":
        args = (t((m, w)), dummy, t((m * w,)), t((m, cfg.aux_w)))
    elif cfg.op == "situ":
        args = (t((m, cfg.x_w)), dummy, t((m * w,)), t((m, cfg.aux_w), Float32))
    elif cfg.op == "copy":
        args = (t((m, cfg.x_w or w)), dummy, t((m * w,)), dummy)
    else:  # rmssitu
        args = (t((m, w)), t((w,)), t((m * (w + cfg.seg2),)), t((m, cfg.aux_w)))
    stream = cutlass.runtime.make_fake_stream()
    return cute.compile(LayerElem(cfg), *args, stream, options=f"--gpu-arch {arch}")


def elem_ref(cfg: LayerElemConfig, x: Any, w: Any, r: Any) -> tuple[Any, Any]:
    """Torch reference of one variant on the ABI's tensors (fp64 in, fp64 out): (y flat, r out
    or None). The preflight of lab/bench/layer_h200.py checks every built variant against it."""
    import torch

    def norm(v: Any, g: Any) -> Any:
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + EPS) * g

    wd = cfg.width
    if cfg.op == "addrms":
        s = (x + r).to(torch.bfloat16).double()  # the residual is stored bf16, then normed
        return torch.cat([norm(s, w).flatten(), s.flatten()]), None
    if cfg.op == "rms":
        return norm(x, w).flatten(), None
    if cfg.op == "qkvnorm":
        q = norm(x[:, :wd], w[:wd])
        kv = norm(x[:, wd : wd + cfg.seg2], w[wd:])
        return torch.cat([q.flatten(), kv.flatten()]), None
    if cfg.op == "copy":
        return x[:, :wd].flatten(), None
    if cfg.op == "gate":
        return (x * torch.sigmoid(r[:, cfg.off : cfg.off + wd])).flatten(), None

    def situ(src: Any, width: int) -> Any:
        g, u = src[:, cfg.off : cfg.off + width], src[:, cfg.off + width : cfg.off + 2 * width]
        b, lb = cfg.beta, cfg.lbeta
        return b * torch.tanh(g / b) * torch.sigmoid(g) * lb * torch.tanh(u / lb)

    if cfg.op == "rmssitu":
        return torch.cat([norm(x, w), situ(r, cfg.seg2)], 1).flatten(), None
    return situ(x, wd).flatten(), x[:, : cfg.aux_w]


def elem_tensors(cfg: LayerElemConfig, gen: Any, device: Any) -> tuple[Any, Any, Any, Any]:
    """Random ABI tensors (x, w 2-D, y NaN-filled, r) of one variant, for the preflight check."""
    import torch

    bf = torch.bfloat16
    m, wd = cfg.m, cfg.width

    def rnd(*shape: int, scale: float = 1.0) -> Any:
        return (scale * torch.randn(shape, generator=gen, device=device)).to(bf)

    dummy = torch.zeros((1, 8), dtype=bf, device=device)
    if cfg.op == "addrms":
        x, w, r, ny = rnd(m, wd), 1 + rnd(1, wd, scale=0.1), rnd(m, wd), 2 * m * wd
    elif cfg.op == "rms":
        x, w, r, ny = rnd(m, wd, scale=3.0), 1 + rnd(1, wd, scale=0.1), dummy, m * wd
    elif cfg.op == "qkvnorm":
        x, w, r = rnd(m, cfg.x_w, scale=3.0), 1 + rnd(1, wd + cfg.seg2, scale=0.1), dummy
        ny = m * (wd + cfg.seg2)
    elif cfg.op == "gate":
        x, w, r, ny = rnd(m, wd), dummy, rnd(m, cfg.aux_w, scale=3.0), m * wd
    elif cfg.op == "copy":
        x, w, r, ny = rnd(m, cfg.x_w or wd), dummy, dummy, m * wd
    elif cfg.op == "rmssitu":
        x, w = rnd(m, wd, scale=3.0), 1 + rnd(1, wd, scale=0.1)
        r, ny = rnd(m, cfg.aux_w, scale=8.0), m * (wd + cfg.seg2)
    else:
        x, w, ny = rnd(m, cfg.x_w, scale=8.0), dummy, m * wd
        r = torch.full((m, cfg.aux_w), float("nan"), device=device)
    y = torch.full((ny,), float("nan"), dtype=bf, device=device)
    return x, w, y, r
