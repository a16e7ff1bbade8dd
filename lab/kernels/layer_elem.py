"""The elementwise ops of a K3 decode layer's dense part as kimictl kernels that chain with PDL
(lab only: the layer_elem family, its sweep, compile function, fp64 reference and random ABI
tensors; the fused segments that ship reuse the ops' row helpers, kimictl/kernels/layer/).

The layer profile: inductor's Triton kernels between the GEMMs (add + RMSNorm, RMSNorm, the MLA
sigmoid output gate, SiTU * mul) took 6-16 us per layer and, having no programmatic dependent
launch, made every kimictl GEMM after one of them start only when it had finished. These kernels
launch with PDL, load what the previous kernel does not write (norm weights) and trigger their
dependents before `griddepcontrol.wait`, then read the previous kernel's output.

Each op is one CTA per token row, shapes static per variant (M, widths), so the exported header
has no dynamic sizes and the GEMM ABI's four pointers carry any tensors (build.py's wrapper).
Built through lab.kernels.families (`layer_h200.py --make-build`); kernel: layer_elem_dsl.py.
The ops:
- addrms: X = h [M, K], W = norm weight [K], R = residual [M, K]; Y = flat [2M * K]: rows 0..M-1
  the normed x, rows M..2M-1 the new residual bf16(h + r) (what the norm reads, as vLLM does).
- rms: X [M, K], W [K]; Y = flat [M * K] (R unused).
- qkvnorm (MLA): X = qkv_a_g output [M, x_w]; q_c = X[:, :width] and kv_c = X[:, width:width +
  seg2] normed each with its own part of W [width + seg2]; Y = flat: q_c [M, width] then
  kv_c [M, seg2], both contiguous for the GEMM that reads them.
- gate (MLA): X = core output a [M, width], R = qkv_a_g output [M, x_w] whose columns from `off`
  are the gate; Y = flat [M * width] = a * sigmoid(gate).
- situ: X = the horizontally fused front GEMM's output [M, x_w] (router logits | latent | gate_up
  from `off`); Y = flat [M * width] = SiTU(g) * lin(u); R = fp32 logits [M, aux_w] (GateLinear's
  out_dtype), so no cast kernel is left between the GEMMs.
- rmssitu: X = the routed output [M, width], W = latent norm weight [width], R = the front GEMM's
  output [M, aux_w] with gate_up from `off`; Y = flat [M, width + seg2]: per row rms(X) * W, then
  SiTU(g) * lin(u) (seg2 columns). That row is the x of latent_up and shared_down run as one GEMM
  over their concatenated K (both write the same hidden rows, and the layer adds them).
- copy: X [M, x_w or width] (a view at its row stride x_w); Y = flat [M * width] = X[:, :width].
  The benchmark's stand-in for the attention core and the routed experts in its `_pdlsi` layers:
  the same bytes as the torch copy, but in the PDL chain like the real kernels it stands for.
  `late`: it triggers its dependents after its stores instead of first (a kernel that lets the
  next one launch only as it ends).
All math in fp32, outputs rounded once to bf16 (logits: exact fp32 of the bf16 GEMM output).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimictl.kernels.layer.elem import EPS

__all__ = [
    "ELEM_CONFIGS",
    "LAYER_MS",
    "OPS",
    "LayerElemConfig",
    "elem_configs",
    "elem_ref",
    "elem_tensors",
]

OPS = ("addrms", "rms", "qkvnorm", "gate", "situ", "rmssitu", "copy")
LAYER_MS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class LayerElemConfig:
    op: str
    m: int
    width: int  # elements per row the op writes (first segment for qkvnorm)
    x_w: int = 0  # row width of X when it is wider than `width` (a fused GEMM's output, a view)
    seg2: int = 0  # qkvnorm: width of the second normed segment; rmssitu: act columns
    off: int = 0  # gate: column of the gate in R; situ: of gate_up in X; rmssitu: in R
    aux_w: int = 0  # gate, rmssitu: row width of R; situ: fp32 logits written to R
    beta: float = 0.0  # situ: SiTU beta
    lbeta: float = 0.0  # situ: linear-part beta
    threads: int = 128
    pdl: bool = True
    late: bool = False  # copy: trigger the dependents at the end instead of first
    kernel: str = "layer_elem"
    rows: int = 1  # manifest field every family carries (one token row per CTA)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"op must be one of {', '.join(OPS)}, got {self.op!r}")
        for v in (self.width, self.x_w, self.seg2, self.off, self.aux_w):
            if v % 8:
                raise ValueError("widths and offsets must be multiples of 8 (16-byte vectors)")
        if self.late and (self.op != "copy" or not self.pdl):
            raise ValueError("late applies to the PDL copy only")

    @property
    def name(self) -> str:
        extra = "".join(
            f"_{tag}{v}"
            for tag, v in (("x", self.x_w), ("s", self.seg2), ("o", self.off), ("a", self.aux_w))
            if v
        )
        tail = ("" if self.pdl else "_nopdl") + ("_late" if self.late else "")
        return f"elem_{self.op}_m{self.m}_w{self.width}{extra}{tail}"


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

    from lab.kernels.layer_elem_dsl import LayerElemOps

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
    return cute.compile(LayerElemOps(cfg), *args, stream, options=f"--gpu-arch {arch}")


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
