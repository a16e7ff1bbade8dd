"""Tensor-core weight-streaming GEMM: y[M, N] = x[M, K] @ w[N, K]^T (+ residual), M = 1..64.

The SIMT kernel (wstream_gemm.py) spends M FMAs per weight element; from M = 4 on that issue
cost, not HBM, sets its time. Here the warp's `mma.sync.m16n8k16` does the multiply: weights are
the 16-row A operand, tokens the 8-column B operand (M > 8 uses ceil(M/8) column tiles that share
each weight fragment), fp32 accumulation in the C fragment.

Loads stay 16 bytes per thread. The sum over K does not care about the order of k, so each
thread loads 8 contiguous k of its A rows (g and g+8) and of its token g, and the fragment's
"virtual" k positions {2t, 2t+1, 2t+8, 2t+9} of two consecutive MMAs are mapped onto real k
kb + 8t + {0..3} and {4..7}: A and B see the same permutation, so the product is unchanged.

One CTA owns 16 rows of w; its warps split K and reduce through shared memory. PDL as in
wstream_gemm: weight loads first, `griddepcontrol.wait` before x is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TC_CONFIGS", "TC_MS", "TcStreamConfig"]

TC_MS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)  # token batches K3 prepares
ROWS = 16  # rows of w per CTA: the MMA's M
VEC = 8


@dataclass(frozen=True)
class TcStreamConfig:
    m: int  # tokens, 1..64
    warps: int  # warps per CTA, all splitting K
    unroll: int  # 32-k groups per warp per loop trip (2 weight loads + ceil(m/8) x loads each)
    groups: int = 1  # 16-row groups per warp: each x fragment feeds `groups` MMAs
    splits: int = 1  # CTAs of one cluster splitting K, reduced through distributed smem
    residual: bool = False
    pdl: bool = True
    early: bool = False  # PDL trigger at the kernel's start (see WStreamConfig.early)
    ctas: int = 0  # > 0: persistent grid looping over row blocks (see WStreamConfig.ctas)
    kernel = "tcstream_gemm"

    def __post_init__(self) -> None:
        if not 1 <= self.m <= 64:
            raise ValueError(f"m must be 1..64, got {self.m}")
        if not 1 <= self.warps <= 16:
            raise ValueError(f"warps must be 1..16, got {self.warps}")
        if self.splits not in (1, 2, 4, 8):
            raise ValueError(f"splits must be 1, 2, 4 or 8 (a portable cluster), got {self.splits}")
        if self.ctas and self.splits > 1:
            raise ValueError("a persistent grid (ctas > 0) is built for splits = 1 only")

    @property
    def smem_bytes(self) -> int:
        """fp32 partial sums of every warp for the CTA's rows x token tiles."""
        return self.warps * self.rows * 8 * self.n_tiles * 4

    @property
    def n_tiles(self) -> int:
        return -(-self.m // 8)

    @property
    def rows(self) -> int:
        return ROWS * self.groups

    @property
    def name(self) -> str:
        tail = ("_res" if self.residual else "") + ("" if self.pdl else "_nopdl")
        tail += "_et" if self.early and self.pdl else ""
        tail += f"_p{self.ctas}" if self.ctas else ""
        split = f"_s{self.splits}" if self.splits > 1 else ""
        return f"tcstream_m{self.m}_w{self.warps}_u{self.unroll}_g{self.groups}{split}{tail}"


def _tc_configs() -> tuple[TcStreamConfig, ...]:
    out: list[TcStreamConfig] = []
    for m in TC_MS:
        if m <= 8:
            # (warps, unroll, groups, splits): 8x2 covers 512 k per trip (K3's K in whole
            # trips); unroll 4 and 7 put 2x and 3.5x the bytes in flight where N/16 CTAs leave
            # one CTA per SM; two row groups halve the x loads; a 4-CTA cluster splitting K gives
            # small-N shapes (N/16 < 132) enough CTAs.
            tiles: tuple[tuple[int, int, int, int], ...] = (
                (8, 2, 1, 1), (8, 4, 1, 1), (4, 4, 1, 1), (8, 7, 1, 1), (4, 4, 2, 1), (8, 2, 1, 4),
            )  # fmt: skip
        else:
            # x is re-read from L2 by every row group (x bytes = w bytes x M / 16 / groups):
            # more groups per warp cut that, cluster K-splits restore the CTA count.
            tiles = ((8, 2, 1, 1), (8, 2, 1, 4), (4, 2, 2, 2), (4, 2, 2, 4), (4, 2, 4, 4))
        for w, u, g, s in tiles:
            cfg = TcStreamConfig(m, w, u, g, s)
            if cfg.smem_bytes <= 48 * 1024 and not (m > 32 and g > 2):  # registers at M=64
                out.append(cfg)
    out.extend(TcStreamConfig(m, 8, 4, 1, residual=True) for m in TC_MS if m <= 8)
    # PDL off: what programmatic launch buys (or costs) inside a chain of different shapes
    out.extend(TcStreamConfig(8, w, u, 1, pdl=False) for w, u in ((8, 2), (8, 4)))
    # early PDL trigger; at M >= 16 also 2x the weight bytes in flight (unroll 4)
    for m in TC_MS:
        tiles_et = (
            ((8, 2, 1, 1), (8, 4, 1, 1), (8, 7, 1, 1)) if m <= 8 else ((8, 2, 1, 1), (8, 4, 1, 1))
        )
        out.extend(TcStreamConfig(m, w, u, g, s, early=True) for w, u, g, s in tiles_et)
        if m > 8:
            out.append(TcStreamConfig(m, 8, 4, 1, 1))
        # persistent grids of 1 and 2 CTAs per SM (132 SMs)
        out.extend(
            TcStreamConfig(m, 8, u, 1, 1, early=True, ctas=c) for u, c in ((4, 132), (4, 264))
        )
    # K = 1536 (mla_q_b) in one trip with no idle warp: 12 x 4 and 16 x 3 32-k groups, or a
    # 2-CTA cluster of 8 x 3 (N / 16 x 2 CTAs)
    for m in (4, 8):
        for w, u, s in ((12, 4, 1), (16, 3, 1), (8, 3, 2), (4, 6, 2)):
            out.append(TcStreamConfig(m, w, u, 1, s, early=True))
    return tuple(out)


TC_CONFIGS: tuple[TcStreamConfig, ...] = _tc_configs()


def _compile_tcstream(cfg: TcStreamConfig, arch: str = "sm_90a") -> Any:
    """Compile one variant from hashable facts only: fake tensors, dynamic N and K."""
    from kimictl.kernels.gemm.aot import compile_gemm
    from kimictl.kernels.gemm.tcstream_gemm_dsl import TcStreamGemm

    return compile_gemm(TcStreamGemm(cfg), cfg.m, arch)
