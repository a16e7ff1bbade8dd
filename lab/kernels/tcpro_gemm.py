"""tcstream with an elementwise op applied to x as it is loaded (experimental, not
shipped): the op that sat in its own kernel in front of the GEMM moves into the GEMM's loads.

- `gate` (MLA's o_proj): y = (a * sigmoid(g)) . w, with a = x (the attention core's output) and g
  the gate columns of the fused qkv_a/gate GEMM's output, passed as the ABI's r pointer and read as
  [M, x_w] from column `off`. No residual (r carries the gate).
- `situ` (shared_down): y = act . w (+ r), act = beta tanh(g / beta) sigmoid(g) * lbeta tanh(u /
  lbeta), with g and u the two halves of shared gate_up, read from the fused front GEMM's output
  passed as x and read as [M, x_w]: g from column `off`, u from `off` + K.
Each x vector is rounded to bf16 after the op, as the separate elementwise kernel rounds it, so
the MMAs see the same operand. Built only on request (lab/bench/layer_h200.py --make-build).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimictl.kernels.gemm.tcstream_gemm import TcStreamConfig

__all__ = ["PRO_CONFIGS", "PRO_OPS", "TcProConfig", "pro_configs", "pro_operand"]

VEC = 8
PRO_OPS = ("gate", "situ")


@dataclass(frozen=True)
class TcProConfig(TcStreamConfig):
    op: str = "gate"
    x_w: int = 0  # row width of the tensor the op reads (gate: r; situ: x)
    off: int = 0  # column of the op's first input in that tensor
    beta: float = 0.0  # situ: SiTU beta
    lbeta: float = 0.0  # situ: linear-part beta
    kernel = "tcpro_gemm"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.op not in PRO_OPS:
            raise ValueError(f"op must be one of {', '.join(PRO_OPS)}, got {self.op!r}")
        if self.op == "gate" and self.residual:
            raise ValueError("the gate op has no residual: r carries the gate")
        if self.op == "situ" and not (self.beta > 0 and self.lbeta > 0):
            raise ValueError("situ needs beta and lbeta > 0")
        if self.x_w <= 0 or self.x_w % VEC or self.off % VEC:
            raise ValueError("x_w (> 0) and off must be multiples of 8 (16-byte vectors)")
        if self.splits != 1 or self.ctas:
            raise ValueError("tcpro launches one CTA per row block: splits = 1, ctas = 0")

    @property
    def name(self) -> str:
        base = super().name.removeprefix("tcstream")
        return f"tcpro_{self.op}{base}_x{self.x_w}_o{self.off}"


def pro_configs(ms: tuple[int, ...] = (1, 2, 4, 8, 16)) -> tuple[TcProConfig, ...]:
    """K3 at TP8: o_proj's gated variants (MLA) and shared_down's SiTU variants with the
    residual (the tuned layer's shared_down adds latent_up's output), on the tcstream tiles that
    measured fastest on those shapes at M <= 8 on the H200 (8 warps, unroll 2 and 4, early
    trigger)."""
    from kimictl.deployment.k3 import K3_MOE_CONFIG
    from kimictl.kernels.layer.ops import dense_layer_ops

    mla = {op.name: op for op in dense_layer_ops("mla")}
    qkv_w = mla["qkv_a_g"].n
    front = ("router", "latent_down", "shared_gate_up")
    front_w = sum(mla[n].n for n in front)
    beta = float(K3_MOE_CONFIG["activation_situ_beta"])  # type: ignore[arg-type]
    lbeta = float(K3_MOE_CONFIG["activation_situ_linear_beta"])  # type: ignore[arg-type]
    gate = dict(op="gate", x_w=qkv_w, off=qkv_w - mla["out_gate"].n)  # gate: the last segment
    situ = dict(op="situ", x_w=front_w, off=front_w - mla["shared_gate_up"].n, beta=beta,
                lbeta=lbeta, residual=True)  # fmt: skip
    return tuple(
        TcProConfig(m, 8, u, 1, early=True, **kw)  # type: ignore[arg-type]
        for kw in (gate, situ)
        for m in ms
        for u in (2, 4)
    )


PRO_CONFIGS: tuple[TcProConfig, ...] = ()  # built on request (layer_h200.py --make-build)


MIN_CTAS = 4  # CTAs per SM the launch bounds ask for: tcstream's 62-63 registers of 256 threads


def _compile_tcpro(cfg: TcProConfig, arch: str = "sm_90a") -> Any:
    from kimictl.kernels.gemm.aot import compile_gemm
    from lab.kernels.tcpro_gemm_dsl import TcProGemm

    return compile_gemm(TcProGemm(cfg), cfg.m, arch)


def pro_operand(cfg: TcProConfig, x: Any, r: Any, k: int) -> Any:
    """What the kernel's MMAs multiply (torch, any device): the op on the ABI's x and r, in fp32,
    rounded to bf16 [M, K]. y = pro_operand(...) @ w^T (+ r for situ with the residual)."""
    import torch

    if cfg.op == "gate":
        out = x.float() * torch.sigmoid(r[:, cfg.off : cfg.off + k].float())
    else:
        g = x[:, cfg.off : cfg.off + k].float()
        u = x[:, cfg.off + k : cfg.off + 2 * k].float()
        out = cfg.beta * torch.tanh(g / cfg.beta) * torch.sigmoid(g)
        out = out * cfg.lbeta * torch.tanh(u / cfg.lbeta)
    return out.to(torch.bfloat16)
