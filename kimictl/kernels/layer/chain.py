"""The dense part of a K3 decode layer as three persistent kernels: no launch floor between GEMMs.

The layer budget (lab/bench/layer_budget.py) shows what per-kernel layers cannot do: every launch
pays a ramp and a tail, and the GEMMs of a 10-kernel dense layer stream 3.3-3.5 TB/s against
4.4-4.5 for one large wstream GEMM. Here each part of the layer between two stand-ins is ONE
kernel: a persistent grid of one 512-thread CTA per SM runs the part's GEMMs as stages, with a
grid-wide barrier between dependent stages. Before a stage waits (on `griddepcontrol.wait` for the
first, on the barrier after that) every group has its first weight blocks in flight, so the ramp
a kernel pays is paid once per segment, not once per GEMM.

The segments (cat layer: latent_up and shared_down as one GEMM over their concatenated K):
- a: add + RMSNorm -> qkv_a/gate (MLA) or the packed KDA projection -> barrier -> q/kv norms and
  q_b (MLA) or f_b on f_a (KDA);
- b: the output gate (MLA) folded into o_proj's x, o_proj + residual -> barrier -> RMSNorm and the
  front GEMM (router | latent_down | shared_gate_up);
- c: RMSNorm of the routed output and SiTU * mul -> [latent_up | shared_down];
- f (the one vLLM's forward runs, kimictl.kernels.vllm.layer_route): a without its prologue, from
  the normed input vLLM's AttnRes (or RMSNorm) hands the attention.
The stand-ins run between the segments as benchmark-owned PDL copies (layer_elem `copy`).

The math (`math` "simt"), fp32-accumulating, bf16 in and out: wstream's SIMT weight stream,
M = 1 and 2 only: at M = 2 its FMAs already cost the segments part of their M = 1 rate
(docs/results.md, row "chain SIMT form at M = 2"). A CTA holds 4 groups of 128 threads; a group
owns a block of weight rows at a time (as many as one ring slot holds) and splits K over its
threads. Two partial sums per output halve the FMA chain. (A tensor-core form, "mma", lost to it
at M = 1 and 2 and to per-GEMM kernels at M = 4; it is the lab's: lab/kernels/layer_chain.py.)
Each thread cp.asyncs its own 16-byte weight vectors into its slots of a `ring`-slot
ring in shared memory, ring - 1 slots ahead, and reads back only what it copied (so the ring needs
no CTA barrier). Each stage first builds its whole x (norms, gate, SiTU: every CTA computes the
per-token sums itself) in shared memory, so the warps read x from there.

ABI (build.py's four pointers, all flat bf16, shapes static per variant):
- X: the segment's input from the previous kernel (a: h; b: the attention stand-in's output;
  c: the routed stand-in's output; f: the normed input);
- R: the second input (a: the residual; b: segment a's Y; c: segment b's Y; f: none, unread);
- W: the segment's weights, one flat buffer (norm weights and GEMM weights at the offsets of
  `ChainStage`), then 8 elements that hold the grid barrier's word. That word must start at zero
  and is left at a multiple of 2^31 after every barrier (the arrival of CTA 0 adds
  2^31 - (ctas - 1), the others 1: the top bit flips when the last one arrives), so it needs no
  reset between launches or graph replays.
- Y: the segment's outputs, flat (a: new residual | qkv_a_g or kda_in output | q or g1 | kv_c;
  f: a's without the residual;
  b: new residual | front GEMM output; c: the layer's output).
All CTAs must be resident at once (the barrier spins): one CTA per SM of `ctas`, 132 on the H200.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

__all__ = [
    "BUILT_TP",
    "CHAIN_SHIPPED",
    "COUNTER",
    "ROUTED",
    "ChainStage",
    "LayerChainConfig",
    "SERVED_MS",
    "SHIPPED_RINGS",
    "arrive_add",
    "segment",
    "segment_ref",
    "shipped_configs",
]

SIMT_MS = (1, 2)  # the SIMT stream serves these (see above)
BUILT_TP = 8  # ops.dense_layer_ops' default: the tensor parallelism the segments' shapes are of
SEGMENTS = ("a", "b", "c")  # the whole dense part, between the two stand-ins
# what the plugin routes into vLLM's forward (kimictl.kernels.vllm.layer_route): segment a cut
# where vLLM's AttnRes ends, so it starts from the normed input
ROUTED = ("f",)
THREADS = 512
GROUP = 128  # simt: threads splitting K for one row block
COUNTER = 8  # bf16 elements after the weights: the barrier word (16 bytes, aligned)
# shared memory one CTA may hold on the H200. One CTA per SM, on purpose: with two (256 threads,
# <= 113 KB each) the next segment's CTAs became resident early, but the layer ran slower
# (docs/results.md, row "chain with two CTAs per SM"), the tail of a segment could then place
# two of the next segment's CTAs on one SM, and the grid barrier waits for the slowest SM
SMEM = 227 * 1024


def arrive_add(first: bool, ctas: int) -> int:
    """What a CTA adds to the barrier word on arriving (int32, wrapping): CTA 0 2^31 - (ctas - 1),
    every other CTA 1. All `ctas` arrivals sum to 2^31, so the word's top bit flips exactly when
    the last one lands, and its low 31 bits come back to zero (no reset between barriers)."""
    return 2**31 - (ctas - 1) if first else 1


@dataclass(frozen=True)
class ChainStage:
    """One GEMM of a segment and how its x is built. Sources are (buffer, flat base, row
    stride) with buffer one of "x", "r", "y"; offsets count bf16 elements."""

    n: int
    k: int
    w_off: int  # the GEMM's weight [n, k] in W
    pro: str  # addrms | rms | gate | plain | rmssitu
    src: tuple[str, int, int]
    src2: tuple[str, int, int] = ("x", 0, 0)  # addrms: residual; gate: gate; rmssitu: gate_up
    g_off: int = 0  # norm weight in W (addrms, rms, rmssitu)
    width: int = 0  # rmssitu: columns normed (the rest, k - width, is SiTU * mul)
    res_out: int = -1  # addrms: flat base in Y of the new residual (row stride k)
    out: tuple[int, int] = (0, 0)  # (flat base in Y, row stride)
    epi_res: tuple[str, int, int] | None = None  # add this (bf16) to the rounded GEMM output
    side: tuple[int, int, int, int] = (0, 0, 0, 0)  # MLA kv_c norm: (src base in Y, width, g_off,
    # out base in Y), row stride of the source = out[1] of the stage before; done by the last CTA

    @property
    def unroll(self) -> int:
        """16-byte weight vectors per thread per row (the group's 128 threads split K)."""
        return -(-self.k // (8 * GROUP))


@dataclass(frozen=True)
class LayerChainConfig:
    layer: str  # mla | kda
    seg: str  # a | b | c
    m: int
    ctas: int = 132  # one CTA per SM (H200); all resident for the grid barrier
    ring: int = 3  # slots of each group's cp.async ring (ring - 1 blocks in flight)
    slot: int = 7  # 16-byte weight vectors per thread in one slot (7: one row of K = 7168)
    beta: float = 0.0  # SiTU beta (segment c)
    lbeta: float = 0.0  # SiTU linear-part beta
    pdl: bool = True
    math: str = "simt"  # the GEMM math's form (see the module docstring)
    kernel: str = "layer_chain"
    rows: int = 1  # manifest field every family carries

    def __post_init__(self) -> None:
        if self.layer not in ("mla", "kda") or self.seg not in SEGMENTS + ROUTED:
            raise ValueError(f"no chain segment {self.layer}/{self.seg}")
        self._check_form()
        if self.smem_bytes > SMEM:
            raise ValueError(f"{self.smem_bytes} bytes of shared memory: more than {SMEM}")

    def _check_form(self) -> None:
        """The math form's own limits: simt serves SIMT_MS, and a slot holds one row of every
        stage."""
        if self.math != "simt":
            raise ValueError(f"math must be simt, got {self.math!r}")
        if self.m not in SIMT_MS:
            raise ValueError(f"m must be one of {SIMT_MS} for simt, got {self.m}")
        if any(st.unroll > self.slot for st in self.stages):
            raise ValueError(f"a slot of {self.slot} vectors cannot hold one row of every stage")

    def rows_of(self, st: ChainStage) -> int:
        """simt: weight rows per block of stage `st`, as many as one ring slot holds."""
        return self.slot // st.unroll

    @property
    def acc_shape(self) -> tuple[int, ...]:
        """The cross-warp partial sums in shared memory: two parities, per group, warp of the
        group, and token and row of a block."""
        rows = max(self.rows_of(st) for st in self.stages)
        return (2, THREADS // GROUP, GROUP // 32, self.m * rows)

    @property
    def smem_bytes(self) -> int:
        """x (every token row of the widest stage), the rings, the reduction slots."""
        kmax = max(st.k for st in self.stages)
        red = 4 * (2 * self.m * THREADS // 32 + prod(self.acc_shape))
        return 2 * self.m * kmax + THREADS * self.ring * self.slot * 16 + red

    @property
    def name(self) -> str:
        ring = f"_r{self.ring}s{self.slot}" if (self.ring, self.slot) != (3, 7) else ""
        form = "" if self.math == "simt" else f"_{self.math}"
        tail = ("" if self.pdl else "_nopdl") + form + ring
        return f"chain_{self.layer}_{self.seg}_m{self.m}{tail}"

    @property
    def stages(self) -> tuple[ChainStage, ...]:
        return segment(self.layer, self.seg, self.m)[0]

    @property
    def sizes(self) -> dict[str, int]:
        """Flat lengths of X, R, W (with the barrier word) and Y."""
        return segment(self.layer, self.seg, self.m)[1]


def _dims(layer: str) -> dict[str, int]:
    from kimictl.deployment.k3 import K3_SHAPES
    from kimictl.kernels.layer.ops import dense_layer_ops

    ops = {op.name: op for op in dense_layer_ops(layer)}
    s = K3_SHAPES
    d = {"h": s["hidden_size"], "core": ops["attention_core"].n, "lat": ops["routed_experts"].n}
    d.update(router=ops["router"].n, gu=ops["shared_gate_up"].n, o_k=ops["o_proj"].k)
    d["front"] = d["router"] + d["lat"] + d["gu"]
    if layer == "mla":
        d.update(n1=ops["qkv_a_g"].n, q_a=s["q_lora_rank"], kv=s["kv_lora_rank"],
                 q_n=ops["q_b"].n, gate=s["q_lora_rank"] + s["kv_lora_rank"]
                 + s["qk_rope_head_dim"])  # fmt: skip
    else:
        d.update(n1=ops["kda_in"].n, fa=4 * d["core"], fa_w=ops["f_b"].k, g1=ops["f_b"].n)
    return d


def segment(layer: str, seg: str, m: int) -> tuple[tuple[ChainStage, ...], dict[str, int]]:
    """The stages and flat buffer sizes of one segment at M tokens (see the module docstring)."""
    d = _dims(layer)
    h = d["h"]
    stages: tuple[ChainStage, ...]
    if seg in ("a", "f"):  # f: a from vLLM's normed input (no add + RMSNorm, no residual)
        n1 = d["n1"]
        y0, w0 = (m * h, h) if seg == "a" else (0, 0)  # a's new residual and norm weight first
        if seg == "a":
            s1 = ChainStage(n1, h, w0, "addrms", ("x", 0, h), ("r", 0, h), g_off=0, res_out=0,
                            out=(y0, n1))  # fmt: skip
        else:
            s1 = ChainStage(n1, h, w0, "plain", ("x", 0, h), out=(y0, n1))
        w1 = w0 + n1 * h
        if layer == "mla":
            g2, w2 = w1, w1 + d["q_a"] + d["kv"]
            q_base, kv_base = y0 + m * n1, y0 + m * (n1 + d["q_n"])
            s2 = ChainStage(d["q_n"], d["q_a"], w2, "rms", ("y", y0, n1), g_off=g2,
                            out=(q_base, d["q_n"]),
                            side=(y0 + d["q_a"], d["kv"], g2 + d["q_a"], kv_base))  # fmt: skip
            w_len, y_len = w2 + d["q_n"] * d["q_a"], kv_base + m * d["kv"]
        else:
            s2 = ChainStage(d["g1"], d["fa_w"], w1, "plain", ("y", y0 + d["fa"], n1),
                            out=(y0 + m * n1, d["g1"]))  # fmt: skip
            w_len, y_len = w1 + d["g1"] * d["fa_w"], y0 + m * (n1 + d["g1"])
        # f reads no R: one vector keeps the ABI's four pointers
        stages, x_len, r_len = (s1, s2), m * h, (m * h if seg == "a" else 8)
    elif seg == "b":
        ok = d["o_k"]
        n1 = d["n1"]
        if layer == "mla":  # x = a * sigmoid(gate), the gate columns of segment a's qkv_a_g
            s1 = ChainStage(h, ok, 0, "gate", ("x", 0, ok), ("r", m * h + d["gate"], n1),
                            out=(0, h), epi_res=("r", 0, h))  # fmt: skip
            r_len = m * (h + n1 + d["q_n"] + d["kv"])
        else:
            s1 = ChainStage(h, ok, 0, "plain", ("x", 0, ok), out=(0, h), epi_res=("r", 0, h))
            r_len = m * (h + n1 + d["g1"])
        g = h * ok
        s2 = ChainStage(d["front"], h, g + h, "rms", ("y", 0, h), g_off=g,
                        out=(m * h, d["front"]))  # fmt: skip
        stages, x_len = (s1, s2), m * ok
        w_len, y_len = g + h + d["front"] * h, m * (h + d["front"])
    else:
        lat, half = d["lat"], d["gu"] // 2
        k = lat + half
        s1 = ChainStage(h, k, lat, "rmssitu", ("x", 0, lat),
                        ("r", m * h + d["router"] + lat, d["front"]), g_off=0, width=lat,
                        out=(0, h))  # fmt: skip
        stages, x_len, r_len = (s1,), m * lat, m * (h + d["front"])
        w_len, y_len = lat + h * k, m * h
    return stages, {"x": x_len, "r": r_len, "w": w_len + COUNTER, "y": y_len}


# What ships: per (kind, segment, M) the (ring, slot) the H200 layer search picked (SIMT, M = 1
# and 2, where the chain is the fastest dense layer measured; at M = 4 the tensor-core chain lost
# to per-GEMM kernels). Recorded in lab/tests/fixtures/layer_h200_chain_run6.json ("picks").
SERVED_MS = SIMT_MS
SHIPPED_RINGS: dict[tuple[str, str, int], tuple[int, int]] = {
    ("mla", "a", 1): (2, 7), ("mla", "b", 1): (2, 10), ("mla", "c", 1): (2, 10),
    ("mla", "a", 2): (2, 10), ("mla", "b", 2): (2, 10), ("mla", "c", 2): (2, 10),
    ("kda", "a", 1): (2, 7), ("kda", "b", 1): (2, 10), ("kda", "c", 1): (4, 5),
    ("kda", "a", 2): (2, 7), ("kda", "b", 2): (2, 10), ("kda", "c", 2): (2, 10),
}  # fmt: skip
# the routed front takes segment a's pick: the same GEMMs, less a prologue
SHIPPED_RINGS |= {(k, "f", m): SHIPPED_RINGS[(k, "a", m)] for k in ("mla", "kda") for m in SIMT_MS}


def shipped_configs() -> tuple[LayerChainConfig, ...]:
    """The shipped segments, one per (kind, segment, M) of SHIPPED_RINGS."""
    from kimictl.deployment.k3 import K3_MOE_CONFIG

    beta = float(K3_MOE_CONFIG["activation_situ_beta"])  # type: ignore[arg-type]
    lbeta = float(K3_MOE_CONFIG["activation_situ_linear_beta"])  # type: ignore[arg-type]
    return tuple(
        LayerChainConfig(kind, seg, m, ring=ring, slot=slot, beta=beta, lbeta=lbeta)
        for (kind, seg, m), (ring, slot) in SHIPPED_RINGS.items()
    )


CHAIN_SHIPPED: tuple[LayerChainConfig, ...] = shipped_configs()


def _compile_chain(cfg: LayerChainConfig, arch: str) -> Any:
    """cute.compile one segment against static flat fake tensors."""
    import cuda.bindings.driver as cuda  # noqa: F401  (the DSL resolves the stream type)
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16

    from kimictl.kernels.layer.chain_dsl import LayerChain

    def t(n: int) -> Any:
        return cute.runtime.make_fake_compact_tensor(BFloat16, (n,), assumed_align=16)

    sz = cfg.sizes
    stream = cutlass.runtime.make_fake_stream()
    return cute.compile(LayerChain(cfg), t(sz["x"]), t(sz["w"]), t(sz["y"]), t(sz["r"]), stream,
                        options=f"--gpu-arch {arch}")  # fmt: skip


def segment_ref(cfg: LayerChainConfig, x: Any, r: Any, w: Any) -> Any:
    """Torch model of one segment on the flat ABI tensors, stage by stage as the kernel runs it
    (bf16 roundings at the same places); y comes back flat in x's dtype. The CPU tests run the
    layer through it against the fp64 layer, which checks every offset of `segment`."""
    import torch

    from kimictl.kernels.layer.elem import EPS

    dt = x.dtype
    sizes = cfg.sizes
    y = torch.zeros(sizes["y"], dtype=dt, device=x.device)
    bufs = {"x": x.reshape(-1), "r": r.reshape(-1), "y": y}

    def rows(src: tuple[str, int, int], width: int, col: int = 0) -> Any:
        buf, base, ld = src
        return torch.stack([bufs[buf][base + i * ld + col : base + i * ld + col + width]
                            for i in range(cfg.m)]).double()  # fmt: skip

    def norm(v: Any, g_off: int) -> Any:
        g = w[g_off : g_off + v.shape[1]].double()
        return (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + EPS) * g).to(dt).double()

    for st in cfg.stages:
        if st.pro == "addrms":
            s = (rows(st.src, st.k) + rows(st.src2, st.k)).to(dt).double()
            y[st.res_out : st.res_out + cfg.m * st.k] = s.reshape(-1).to(dt)
            xs = norm(s, st.g_off)
        elif st.pro == "rms":
            xs = norm(rows(st.src, st.k), st.g_off)
        elif st.pro == "gate":
            xs = (rows(st.src, st.k) * torch.sigmoid(rows(st.src2, st.k))).to(dt).double()
        elif st.pro == "plain":
            xs = rows(st.src, st.k)
        else:  # rmssitu
            half = st.k - st.width
            g, u = rows(st.src2, half), rows(st.src2, half, half)
            act = cfg.beta * torch.tanh(g / cfg.beta) * torch.sigmoid(g) * cfg.lbeta * torch.tanh(
                u / cfg.lbeta)  # fmt: skip
            xs = torch.cat([norm(rows(st.src, st.width), st.g_off), act.to(dt).double()], 1)
        wt = w[st.w_off : st.w_off + st.n * st.k].reshape(st.n, st.k).double()
        out = xs @ wt.T
        if st.epi_res is not None:
            out = out.to(dt).double() + rows(st.epi_res, st.n)
        base, ld = st.out
        for i in range(cfg.m):
            y[base + i * ld : base + i * ld + st.n] = out[i].to(dt)
        if st.side[1]:
            s_base, s_w, s_g, s_out = st.side
            kv = norm(rows(("y", s_base, st.src[2]), s_w), s_g)
            y[s_out : s_out + cfg.m * s_w] = kv.reshape(-1).to(dt)
    return y
