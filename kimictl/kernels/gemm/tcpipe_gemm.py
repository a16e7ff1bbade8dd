"""Pipelined tensor-core GEMM for decode batches: y[M, N] = x[M, K] @ w[N, K]^T (+ residual),
M = 8, 16, 32, 64.

tcstream loads weights straight into registers, so the bytes in flight per SM are
bounded by registers, and every warp re-reads x from global memory per k step. Here each CTA
streams a (rows x bk) weight tile and the matching (M x bk) x tile global -> shared with
16-byte `cp.async.cg` (L1 bypass) into a ring of `stages` slots: stages - 1 tiles stay in flight
whatever the registers. Warps read fragments with 16-byte `ld.shared` and the k permutation of
tcstream (each thread owns 8 contiguous k of its rows and tokens; A and B see the same
permutation, so the product is unchanged) and run `mma.sync.m16n8k16` bf16 -> fp32 with weights
as the 16-row A operand and tokens as the 8-column B operand. Each 16-byte chunk of a tile row is
stored at chunk ^ 4 * (row & 1): the 8 lanes of one shared-memory phase (rows g, g + 1 of one
32-k group) then hit 8 distinct bank quads, and the cp.async writes stay conflict free.

The CTA's warps form a `row_warps` x `k_warps` grid (rows / row_warps rows each; the tile's
32-k groups dealt round-robin over k_warps). `splits` CTAs of one cluster (grid y) take
contiguous runs of k tiles; all partial C tiles go to shared memory and each CTA of the cluster
finalises 1/splits of the outputs with 16-byte distributed-shared-memory reads.

PDL: the first stages - 1 weight tiles are issued before `griddepcontrol.wait`, x after it; the
dependents are released as soon as the prologue is in flight.

Loads in the main loop: a thread always owns the same 16-byte chunk column of its rows (threads
is a multiple of the chunks per row), so a full k tile of in-range rows costs one 64-bit add and
one cp.async per chunk; only the last k tile (K % bk) and the CTA holding the last rows of N take
the clamped, zero-filling path. Same variant on the H200 against a clamped-only loop:
1-3 % faster on the large grids, 5-12 % on the short-K shapes (o_proj, shared_down, mla_q_b), and
7-19 % slower where a few CTAs each stream all of K (router, fused_qkv_a without split-K), points
that other variants and families serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PIPE_CONFIGS", "PIPE_MS", "TcPipeConfig"]

PIPE_MS: tuple[int, ...] = (8, 16, 32, 64)
VEC = 8  # bf16 per 16-byte chunk
SMEM_LIMIT = 227 * 1024  # opt-in shared memory per CTA on sm_90 / sm_100
MAX_ACC = 128  # fp32 accumulators per thread (+ fragments) stay under 255 registers


@dataclass(frozen=True)
class TcPipeConfig:
    m: int  # tokens: 8, 16, 32 or 64
    rows: int  # weight rows per CTA (a multiple of 16 * row_warps)
    row_warps: int  # warps side by side over the rows
    k_warps: int  # warps side by side over each k tile's 32-k groups
    bk: int = 128  # k per pipeline stage
    stages: int = 4  # ring slots (stages - 1 tiles in flight)
    splits: int = 1  # CTAs of one cluster splitting K, reduced through distributed smem
    residual: bool = False
    pdl: bool = True
    kernel = "tcpipe_gemm"

    def __post_init__(self) -> None:
        if self.m not in PIPE_MS:
            raise ValueError(f"m must be one of {PIPE_MS}, got {self.m}")
        if self.bk not in (64, 128, 256):
            raise ValueError(f"bk must be 64, 128 or 256, got {self.bk}")
        if self.row_warps < 1 or self.k_warps < 1 or self.warps > 16:
            raise ValueError(f"1..16 warps, got {self.row_warps} x {self.k_warps}")
        if self.rows <= 0 or self.rows % (16 * self.row_warps):
            raise ValueError(f"rows ({self.rows}) must be a multiple of 16 x row_warps")
        if (self.bk // 32) % self.k_warps:
            raise ValueError(f"k_warps ({self.k_warps}) must divide bk / 32 = {self.bk // 32}")
        if not 2 <= self.stages <= 16:
            raise ValueError(f"stages must be 2..16, got {self.stages}")
        if self.splits not in (1, 2, 4, 8):
            raise ValueError(f"splits must be 1, 2, 4 or 8 (a portable cluster), got {self.splits}")
        if self.acc_regs > MAX_ACC:
            raise ValueError(f"{self.acc_regs} accumulators per thread (> {MAX_ACC})")
        if self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"{self.smem_bytes} B of shared memory (> {SMEM_LIMIT})")

    @property
    def warps(self) -> int:
        return self.row_warps * self.k_warps

    @property
    def warp_rows(self) -> int:
        return self.rows // self.row_warps

    @property
    def acc_regs(self) -> int:
        return (self.warp_rows // 16) * (self.m // 8) * 4

    @property
    def stage_bytes(self) -> int:
        return (self.rows + self.m) * self.bk * 2

    @property
    def red_bytes(self) -> int:
        """fp32 partials of every k-warp for the CTA's rows x tokens (reuses the ring)."""
        return self.k_warps * self.rows * self.m * 4

    @property
    def smem_bytes(self) -> int:
        return max(self.stages * self.stage_bytes, self.red_bytes)

    @property
    def name(self) -> str:
        tail = ("_res" if self.residual else "") + ("" if self.pdl else "_nopdl")
        split = f"_s{self.splits}" if self.splits > 1 else ""
        return (
            f"tcpipe_m{self.m}_r{self.rows}_w{self.row_warps}x{self.k_warps}"
            f"_k{self.bk}_p{self.stages}{split}{tail}"
        )


# The sweep, as (m, rows, row_warps, k_warps, bk, stages, splits). Grids: ceil(N / rows) * splits
# lands near 132 (one CTA per SM, ring up to ~224 KB) or 264 (two per SM, ring <= ~113 KB) on the
# K3 shapes, e.g. 12448/48 = 260, 6288/48*2 = 262, 7168/112*2 = 128, 20480/160 = 128. Kept: the
# variants that beat cuBLAS somewhere in the H200 sweep (docs/results.md), plus
# tcpipe's best M = 64 tile of each large shape, where none beats cuBLAS yet (on sm_100 tcpipe is
# the only tensor-core family for M >= 16, so every M keeps a variant).
_SWEEP: tuple[tuple[int, int, int, int, int, int, int], ...] = (
    (8, 48, 1, 4, 128, 8, 1),
    (8, 112, 1, 4, 128, 7, 2),
    (16, 48, 1, 4, 128, 7, 1),
    (16, 160, 2, 4, 128, 5, 1),
    (16, 48, 1, 8, 256, 6, 1),
    (32, 48, 1, 4, 128, 5, 1),  # kda_in_tp8
    (32, 48, 1, 8, 256, 5, 1),  # kda_in_tp16
    (32, 160, 5, 2, 128, 4, 1),  # lm_head: 128 CTAs of 10 warps
    (32, 112, 7, 1, 128, 6, 2),  # moe_latent_up: 128 CTAs
    (32, 64, 1, 4, 128, 4, 2),  # moe_latent_down
    (64, 48, 1, 4, 128, 4, 1),  # kda_in_tp8: 260 CTAs, one per SM
    (64, 48, 1, 4, 128, 3, 2),  # kda_in_tp16: 262 CTAs at two per SM (86 KB ring)
    (64, 160, 5, 2, 128, 3, 1),  # lm_head: 128 CTAs of 10 warps (32 rows each)
    (64, 32, 1, 4, 128, 4, 1),  # moe_latent_up, o_proj, shared_down: 224 CTAs at two per SM
)


# dsv3_fused_a's tile (vLLM's kernel for fused_qkv_a, shared_gate_up and mla_q_b at M <= 16): 16
# weight rows per CTA over all of K (N / 16 CTAs: 132 on N = 2112, one per SM) with 8 k-warps on
# 256-k tiles, here with the weight prologue issued before the grid dependency wait; 4 k-warps on
# 128-k tiles fit 2-3 CTAs per SM, and a 2-CTA cluster splitting K doubles the CTAs of small N.
_DSV3_TILES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (16, 1, 8, 256, 8, 1),
    (16, 1, 8, 256, 12, 1),
    (16, 1, 4, 128, 12, 1),
    (16, 1, 4, 128, 8, 2),
    (16, 1, 8, 256, 4, 2),
    (16, 1, 8, 256, 8, 2),
    (16, 1, 8, 256, 6, 1),
)


def _pipe_configs() -> tuple[TcPipeConfig, ...]:
    out = [TcPipeConfig(m, r, rw, kw, bk, p, s) for m, r, rw, kw, bk, p, s in _SWEEP]
    out += [TcPipeConfig(m, *tile) for m in (8, 16) for tile in _DSV3_TILES]
    out.append(TcPipeConfig(8, 16, 1, 8, 256, 16, 1))  # dsv3's own 16-stage ring at M <= 8
    out.append(TcPipeConfig(16, 48, 1, 4, 128, 7, 4, residual=True))  # the fused residual
    return tuple(out)


PIPE_CONFIGS: tuple[TcPipeConfig, ...] = _pipe_configs()


def _compile_tcpipe(cfg: TcPipeConfig, arch: str = "sm_90a") -> Any:
    """Compile one variant from hashable facts only: fake tensors, dynamic N and K."""
    from kimictl.kernels.gemm.aot import compile_gemm
    from kimictl.kernels.gemm.tcpipe_gemm_dsl import TcPipeGemm

    return compile_gemm(TcPipeGemm(cfg), cfg.m, arch)
