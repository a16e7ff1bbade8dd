"""Warp-specialised tensor-core GEMM for the `dsv3_fused_a` cells: y[M, N] = x[M, K] @
w[N, K]^T, M = 4, 8 or 16, aimed at K = 7168 / N = 1536-2112 and K = 1536 / N = 2304.

Why a new family: tcpipe has every thread issue both operands with `cp.async` and track them with
commit groups. Group completion is cumulative per thread, so the first x tile (issued after the
grid dependency wait) is only seen once every weight tile of the prologue has landed: the ring
drains to empty before the main loop refills it, one latency without bytes in flight per kernel.
vLLM's `dsv3_fused_a` avoids that by giving the two operands to different warps. Here too:
`w_warps` warps stream the weight tile, `x_warps` warps the x tile (after `griddepcontrol.wait`),
each thread's copies report to the slot's "full" mbarrier (`cp.async.mbarrier.arrive.noinc`), and
`k_warps` compute warps wait on it, run the tcpipe fragment code (16-byte `ld.shared`,
`mma.sync.m16n8k16`, the same swizzle and k permutation) and release the slot through its "empty"
mbarrier. The weight warps never wait for the previous kernel: the whole ring (`stages` tiles) is
in flight before it ends. Partials of the k-warps are reduced through shared memory as in tcpipe.

`late` moves `griddepcontrol.launch_dependents` from the kernel's start to its end (dsv3's place);
on the H200 it ran at 0.89-0.95x of the early release on the K = 7168 cells and 0.76-0.79x on
K = 1536, and won only where a shallow early ring ran slow; no candidate uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["WS_CONFIGS", "WS_MS", "WS_SHIPPED", "TcWsConfig"]

WS_MS: tuple[int, ...] = (4, 8, 16)
VEC = 8  # bf16 per 16-byte chunk
SMEM_LIMIT = 227 * 1024
BAR_BYTES = 256  # 2 mbarriers (8 B) per slot, 16 slots at most


@dataclass(frozen=True)
class TcWsConfig:
    m: int  # tokens: 4, 8 or 16 (M = 4 runs the 8-token MMA tile, x rows repeated)
    rows: int = 16  # weight rows per CTA (a multiple of 16)
    k_warps: int = 8  # compute warps over each k tile's 32-k groups
    bk: int = 256  # k per ring slot
    stages: int = 12  # ring slots
    w_warps: int = 2  # weight producer warps
    x_warps: int = 1  # x producer warps
    late: bool = False  # launch_dependents at the end instead of the start
    pdl: bool = True
    residual: bool = False  # not supported: the family serves the plain GEMM only
    kernel = "tcws_gemm"

    def __post_init__(self) -> None:
        if self.m not in WS_MS:
            raise ValueError(f"m must be one of {WS_MS}, got {self.m}")
        if self.bk not in (128, 256):
            raise ValueError(f"bk must be 128 or 256, got {self.bk}")
        if self.rows <= 0 or self.rows % 16:
            raise ValueError(f"rows ({self.rows}) must be a multiple of 16")
        if self.k_warps < 1 or (self.bk // 32) % self.k_warps:
            raise ValueError(f"k_warps ({self.k_warps}) must divide bk / 32 = {self.bk // 32}")
        if not 2 <= self.stages <= 16:
            raise ValueError(f"stages must be 2..16, got {self.stages}")
        if self.w_warps < 1 or self.x_warps < 1 or self.warps > 16:
            raise ValueError(f"1..16 warps in all, got {self.warps}")
        if self.residual:
            raise ValueError("tcws has no residual form")
        if self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"{self.smem_bytes} B of shared memory (> {SMEM_LIMIT})")

    @property
    def mt(self) -> int:
        """Tokens of the MMA tile (8-token columns)."""
        return max(self.m, 8)

    @property
    def warps(self) -> int:
        return self.k_warps + self.w_warps + self.x_warps

    @property
    def stage_bytes(self) -> int:
        return (self.rows + self.mt) * self.bk * 2

    @property
    def red_bytes(self) -> int:
        return self.k_warps * self.rows * self.mt * 4

    @property
    def smem_bytes(self) -> int:
        """Ring, then the mbarriers, then the k-warps' fp32 partials (a region of its own: a
        compute warp may finish while another still reads the ring)."""
        return self.stages * self.stage_bytes + BAR_BYTES + self.red_bytes

    @property
    def name(self) -> str:
        tail = ("_late" if self.late else "") + ("" if self.pdl else "_nopdl")
        return (
            f"tcws_m{self.m}_r{self.rows}_k{self.k_warps}_b{self.bk}_p{self.stages}"
            f"_w{self.w_warps}x{self.x_warps}{tail}"
        )


def _ws_configs() -> tuple[TcWsConfig, ...]:
    out: list[TcWsConfig] = []
    for m, stage_list in ((8, (6, 8, 12, 16)), (16, (6, 8, 10, 12))):
        xw = m // 8
        for p in stage_list:
            for late in (False, True):
                out.append(TcWsConfig(m, stages=p, x_warps=xw, late=late))
        out.append(TcWsConfig(m, k_warps=4, stages=stage_list[2], x_warps=xw))
        out.append(TcWsConfig(m, stages=stage_list[2], w_warps=4, x_warps=xw))
    # M = 4 (mla_q_b, K = 1536: 6 k tiles): dsv3 keeps all of K in flight (6 stages)
    out += [TcWsConfig(4, stages=p, late=late) for p in (4, 6) for late in (False, True)]
    return tuple(out)


# The sweep measured against dsv3_fused_a by lab/bench/dsv3_cells_h200.py (built on request).
WS_CONFIGS: tuple[TcWsConfig, ...] = _ws_configs()

# The shipped variants (build.FAMILIES): the fastest of each cell where tcws beat dsv3_fused_a,
# verified against fp64 and graph replay == eager in the same run (H200, 2026-12-01 05:35 UTC,
# tests/fixtures/runs/dsv3_cells/): 2112x7168 and 1536x7168 at M = 8 (1.035x, 1.014x) and M = 16
# (1.075x, 1.227x). The dispatch table routes a cell to one only where its bench measured it
# faster (docs/results.md, "tcws in the shipped build").
WS_SHIPPED: tuple[TcWsConfig, ...] = (
    TcWsConfig(8, stages=12, w_warps=4),
    TcWsConfig(16, stages=12, x_warps=2),
    TcWsConfig(16, k_warps=4, stages=10, x_warps=2),
)


def _compile_tcws(cfg: TcWsConfig, arch: str = "sm_90a") -> Any:
    from kimictl.kernels.gemm.aot import compile_gemm
    from kimictl.kernels.gemm.tcws_gemm_dsl import TcWsGemm

    return compile_gemm(TcWsGemm(cfg), cfg.m, arch)
