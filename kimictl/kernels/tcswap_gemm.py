"""Tensor-core GEMM for M = 16..64 with the operands swapped: tokens are the MMA's 16-row A
operand, weights its 8-column B operand.

tcstream (tcstream_gemm.py) puts 16 weight rows in A and 8 tokens in B, so at M = 64 each thread
loads 8 x vectors for every 2 weight vectors, and every 16-row block of every warp loads x again.
Here one x fragment (16 tokens) feeds the MMAs of all `blocks` 8-row weight blocks the warp owns:
per 32 k a warp loads `blocks` weight vectors and 2 x vectors per 16 tokens, cutting the x loads
per weight byte by blocks / 2. Each thread still moves 16 contiguous bytes per load; the K
permutation shared by both operands (tcstream's) maps them onto the fragment layout.

The CTA's warps split K and reduce through shared memory; `splits` CTAs of a cluster split K
further and reduce through distributed shared memory in the same kernel (no workspace, no second
launch). PDL: weight loads are issued before `griddepcontrol.wait`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SWAP_CONFIGS", "TcSwapConfig"]

VEC = 8


@dataclass(frozen=True)
class TcSwapConfig:
    m: int  # tokens, 1..64 (ceil(m / 16) A tiles)
    warps: int  # warps per CTA, all splitting K
    unroll: int  # 32-k groups per warp per loop trip
    blocks: int  # 8-row weight blocks per warp (= per CTA)
    splits: int = 1  # CTAs of one cluster splitting K, reduced through distributed smem
    prefetch: bool = False  # next trip's weights in flight while this trip's MMAs run
    residual: bool = False
    pdl: bool = True
    kernel = "tcswap_gemm"

    def __post_init__(self) -> None:
        if not 1 <= self.m <= 64:
            raise ValueError(f"m must be 1..64, got {self.m}")
        if not 1 <= self.warps <= 16:
            raise ValueError(f"warps must be 1..16, got {self.warps}")
        if self.splits not in (1, 2, 4, 8):
            raise ValueError(f"splits must be 1, 2, 4 or 8 (a portable cluster), got {self.splits}")

    @property
    def m_tiles(self) -> int:
        return -(-self.m // 16)

    @property
    def rows(self) -> int:
        return 8 * self.blocks

    @property
    def smem_bytes(self) -> int:
        """fp32 partial sums of every warp for the CTA's rows x tokens."""
        return self.warps * self.rows * 16 * self.m_tiles * 4

    @property
    def name(self) -> str:
        tail = ("_res" if self.residual else "") + ("" if self.pdl else "_nopdl")
        split = f"_s{self.splits}" if self.splits > 1 else ""
        pf = "_pf" if self.prefetch else ""
        return f"tcswap_m{self.m}_w{self.warps}_u{self.unroll}_b{self.blocks}{split}{pf}{tail}"


def _swap_configs() -> tuple[TcSwapConfig, ...]:
    out: list[TcSwapConfig] = []
    # (warps, unroll, blocks, splits)
    tiles = (
        (8, 2, 2, 1), (8, 2, 4, 1), (4, 2, 4, 1), (8, 1, 4, 1), (4, 2, 8, 1), (4, 1, 8, 1),
        (8, 2, 2, 4), (4, 2, 4, 4), (4, 2, 2, 8), (8, 1, 2, 1), (4, 1, 4, 1), (4, 1, 4, 4),
    )  # fmt: skip
    for m in (4, 8, 16, 32, 64):
        for w, u, b, s in tiles if m > 8 else tiles[:3] + tiles[6:7]:
            cfg = TcSwapConfig(m, w, u, b, s)
            regs = 4 * cfg.m_tiles * b + u * (8 * cfg.m_tiles + 4 * b)  # accum + operands
            if cfg.smem_bytes <= 48 * 1024 and regs <= 136:
                out.append(cfg)
    # weights double-buffered in registers: one more set of weight fragments per thread, so the
    # weight stream never waits for the x loads and MMAs of the trip before
    pf_tiles = ((4, 1, 4, 1), (8, 1, 2, 1), (8, 1, 4, 1), (4, 1, 8, 1), (4, 1, 4, 4), (4, 1, 2, 8))
    for m in (16, 32, 64):
        for w, u, b, s in pf_tiles:
            cfg = TcSwapConfig(m, w, u, b, s, prefetch=True)
            regs = 4 * cfg.m_tiles * b + u * (8 * cfg.m_tiles + 8 * b)
            if cfg.smem_bytes <= 48 * 1024 and regs <= 136:
                out.append(cfg)
    return tuple(out)


SWAP_CONFIGS: tuple[TcSwapConfig, ...] = _swap_configs()


def _compile_tcswap(cfg: TcSwapConfig, arch: str = "sm_90a") -> Any:
    """Compile one variant from hashable facts only: fake tensors, dynamic N and K."""
    from kimictl.kernels.aot import compile_gemm
    from kimictl.kernels.tcswap_gemm_dsl import TcSwapGemm

    return compile_gemm(TcSwapGemm(cfg), cfg.m, arch)
