"""Hopper warpgroup-MMA weight-streaming GEMM: y[M, N] = x[M, K] @ w[N, K]^T (+ residual) for
decode batches M = 1..8, 16, 32, 64 on sm_90a.

The operands are swapped against a textbook GEMM: the weight tile is wgmma's A operand (64 rows
of w per warpgroup x `bk` of k, K-major in shared memory) and the tokens are wgmma's N (x rows are
K-contiguous, so x is a K-major B operand); accumulators stay fp32 in registers. One instruction
`wgmma.m64nMk16` covers 64 weight rows x all M tokens, so no token is loaded into registers at
all (the register-operand family tcstream spends most of its issue slots on that).

Both operands arrive by TMA (`cp.async.bulk.tensor`) into a ring of `stages` shared-memory
buffers, each guarded by a full/empty mbarrier pair; warp 0 issues the copies, every warp of the
CTA's warpgroups issues wgmma. The weight tiles of the first stages are issued BEFORE
`griddepcontrol.wait` (PDL: only x, r and y depend on the previous kernel), the x tiles of those
stages right after it. TMA descriptors are built by the host function from the runtime tensors,
so N and K stay runtime sizes; TMA zero-fills rows past N and k past K.

`ws` specialises the warps: a fifth warp issues every TMA (it refills a stage as soon as
the MMA warps release it) and the MMA warpgroup keeps one wgmma group in flight
(`wgmma.wait_group 1`): it issues stage s's MMAs, then releases stage s - 1, whose MMAs are now
known complete, and goes on to wait for stage s + 1 while stage s's MMAs run. Without `ws` the
loop waits for each stage's MMAs (`wait_group 0`) before releasing and refilling it from warp 0,
so a refill never starts before that stage's MMAs finish. With `ws` the MMA warps hold two
stages, so it pays with deep rings (6-12 stages, one CTA per SM); on 4-stage rings it measured
no better than the plain loop.

M = 1..7 use wgmma's smallest token extent, N = 8: the x tile is a TMA box of 8 rows over a
tensor of M rows, so TMA zero-fills rows M..7 (and the tx count is the full box either way); an
output column only ever depends on its own token, and the epilogue stores only the M real rows.
At M = 1 the host function gives x a runtime row count of 1: with a static size-1 mode the DSL
drops that mode and emits a 1-d TMA copy for the 8-row box (an illegal instruction on the H200).

M = 64 can put x in wgmma's A operand instead (`wn` > 0: the 64 tokens are wgmma's M and `wn` =
128 or 256 weight rows its N): one instruction then reads the x tile once for 128-256 weight rows,
where the swapped form re-reads a 64 x bk x tile for every 64 weight rows (shared-memory bytes
written + read per weight byte, counted: 4x swapped, 3x at wn = 128, 2.5x at wn = 256). Measured
on the H200 it was slower on every shape (fewer, larger CTAs; docs/results.md), so
no `wn` variant is in the sweep.

PDL: `early_trigger` issues `griddepcontrol.launch_dependents` as the kernel's first instruction
instead of after the grid dependency wait, so the next grid may launch (and start its weight
loads) while this one still waits on its own predecessor. Always correct: the dependent's wait
still waits for this grid to complete.

Small-N shapes split K over `splits` CTAs of one thread-block cluster (grid y); each CTA writes
its fp32 partial tile to shared memory and finalises 1/splits of the outputs by reading its
peers' tiles through distributed shared memory (16-byte `ld.shared::cluster`), in the same
kernel: no workspace, no second launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["WGMMA_CONFIGS", "WGMMA_MS", "WgmmaConfig"]

WGMMA_MS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)
MMA_MIN_N = 8  # wgmma's smallest N: M = 1..7 run the N = 8 tile with the rows past M unstored
ROWS_PER_WG = 64  # wgmma's M
X_AS_A_ROWS = (128, 256)  # wgmma N (weight rows) when x is the A operand (M = 64 only)
VEC = 8
SMEM_LIMIT = 227 * 1024  # sm_90 opt-in maximum per CTA


@dataclass(frozen=True)
class WgmmaConfig:
    m: int  # tokens = wgmma N
    wgs: int  # warpgroups per CTA, 64 weight rows each
    bk: int  # k per pipeline stage
    stages: int  # shared-memory ring depth
    splits: int = 1  # CTAs of one cluster splitting K, reduced through distributed smem
    evict_first: bool = False  # weight TMA loads carry an L2 evict-first policy
    residual: bool = False
    pdl: bool = True
    early_trigger: bool = False  # launch_dependents first thing instead of after the wait
    wn: int = 0  # > 0: x is wgmma's A (64 tokens), wn weight rows are its N (one warpgroup)
    ws: bool = False  # a producer warp issues the TMA, MMA warps keep one wgmma group in flight
    kernel = "wgmma_gemm"

    def __post_init__(self) -> None:
        if self.m not in WGMMA_MS:
            raise ValueError(f"m must be one of {WGMMA_MS}, got {self.m}")
        if self.wgs not in (1, 2):
            raise ValueError(f"wgs must be 1 or 2, got {self.wgs}")
        if self.bk not in (64, 128, 256):
            raise ValueError(f"bk must be 64, 128 or 256, got {self.bk}")
        if not 2 <= self.stages <= 12:
            raise ValueError(f"stages must be 2..12, got {self.stages}")
        if self.splits not in (1, 2, 4, 8):
            raise ValueError(f"splits must be 1, 2, 4 or 8 (a portable cluster), got {self.splits}")
        if self.early_trigger and not self.pdl:
            raise ValueError("early_trigger needs pdl")
        if self.wn and (self.wn not in X_AS_A_ROWS or self.m != 64 or self.wgs != 1):
            raise ValueError(f"wn (x as the A operand) must be one of {X_AS_A_ROWS} at m=64, wgs=1")
        if self.ws and self.stages < 3:
            raise ValueError("ws keeps two stages with the MMA warps: it needs stages >= 3")
        if (self.rows // 4 * self.m) % self.splits:
            raise ValueError(f"{self.name}: the output chunks do not divide among the splits")
        if self.smem_bytes > SMEM_LIMIT:
            raise ValueError(
                f"{self.name} needs {self.smem_bytes} B of shared memory (limit {SMEM_LIMIT})"
            )

    @property
    def rows(self) -> int:
        """Weight rows per CTA."""
        return self.wn or ROWS_PER_WG * self.wgs

    @property
    def mma_tokens(self) -> int:
        """Token rows of the x tile and of the accumulator (>= m: rows past m are not stored)."""
        return max(self.m, MMA_MIN_N)

    @property
    def mma_threads(self) -> int:
        """Threads that issue wgmma (whole warpgroups)."""
        return 128 * self.wgs

    @property
    def threads(self) -> int:
        """Threads per CTA: the MMA warpgroups, plus the producer warp with `ws`."""
        return self.mma_threads + (32 if self.ws else 0)

    @property
    def stage_bytes(self) -> int:
        """Bytes one ring stage receives: the weight tile and the x tile."""
        return (self.rows + self.mma_tokens) * self.bk * 2

    @property
    def smem_bytes(self) -> int:
        """Ring + mbarriers + alignment slack. The fp32 partial tile (rows x tokens x 4 B) reuses
        the weight ring (stages x rows x bk x 2 B): it fits for every allowed knob (tokens <= 64,
        stages >= 2, bk >= 64)."""
        return self.stages * self.stage_bytes + 16 * self.stages + 1024

    @property
    def ctas_per_sm(self) -> int:
        """How many CTAs fit one SM's 228 KB shared memory (1 KB reserved per CTA)."""
        return max(1, (228 * 1024) // (self.smem_bytes + 1024))

    @property
    def name(self) -> str:
        tail = ("_res" if self.residual else "") + ("" if self.pdl else "_nopdl")
        split = f"_s{self.splits}" if self.splits > 1 else ""
        ef = ("_ef" if self.evict_first else "") + ("_et" if self.early_trigger else "")
        ef += "_ws" if self.ws else ""
        tile = f"n{self.wn}" if self.wn else f"g{self.wgs}"
        return f"wgmma_m{self.m}_{tile}_k{self.bk}_st{self.stages}{split}{ef}{tail}"


def _wgmma_configs() -> tuple[WgmmaConfig, ...]:
    """The 45 variants that were the fastest kernel (any family, or cuBLAS) at one or more
    (shape, M) points in the H200 sweep (docs/results.md).

    - M = 8..64: the producer warp (`ws`) with the deepest ring that fits one CTA per
      SM (st12 / st10 / st8 / st6 at M = 8 / 16 / 32 / 64), unsplit for N >= 6288 and split
      2 / 4 / 8 for the smaller N; at M = 32 and 64 a k64 x 8-stage ring also won points.
    - M = 8 and 16 keep three plain-loop tiles (4 stages, two or three CTAs per SM) that won
      a point (shared_down, kda_in_tp8 at M = 8; shared_down at M = 16).
    - M = 1..7 run the N = 8 tile with the evict-first weight stream; M = 1 keeps only the one
      that won a point. M = 2..7 also get the M = 8 producer-warp ring (measured in the combined
      H200 run).
    - The fused residual: the producer-warp tile at M = 16 and 64 (local reduction) and the
      split-4 cluster tile at M = 16 (cluster reduction).
    - x as the A operand (`wn`) measured slower than the swapped tile on every shape: no variant
      ships it.
    """

    def ws(m: int, bk: int, stages: int, splits: int = 1, residual: bool = False) -> WgmmaConfig:
        return WgmmaConfig(m, 1, bk, stages, splits, True, residual, ws=True)

    deep = {8: 12, 16: 10, 32: 8, 64: 6}  # stages of the one-CTA-per-SM ring (bk = 128)
    out = [ws(m, 128, st, sp) for m, st in deep.items() for sp in (1, 2, 4, 8)]
    out += [ws(8, 128, 4, 8), ws(32, 128, 4, 8), ws(32, 64, 8), ws(64, 64, 8)]
    out += [
        WgmmaConfig(8, 1, 128, 4),
        WgmmaConfig(8, 1, 128, 4, 2, early_trigger=True),
        WgmmaConfig(16, 1, 128, 4),
    ]
    # the fused residual (y = x @ w^T + r), through both epilogues (local and cluster reduction)
    out += [
        ws(16, 128, 10, residual=True),
        ws(64, 128, 6, residual=True),
        WgmmaConfig(16, 1, 128, 4, 4, residual=True),
    ]
    # M = 1..7 on the N = 8 tile
    out += [WgmmaConfig(1, 1, 128, 4, 1, evict_first=True)]
    out += [
        WgmmaConfig(m, 1, 128, 4, sp, evict_first=True) for m in range(2, 8) for sp in (1, 2, 8)
    ]
    # M = 2..7 on the producer-warp ring that wins M = 8 (same 8-row x tile, same smem)
    out += [ws(m, 128, deep[8], sp) for m in range(2, 8) for sp in (1, 2, 4, 8)]
    # cluster-4 K-splits on rings small enough for two CTAs per SM: at one CTA per SM a GPC of
    # 16-18 SMs holds only four 4-CTA clusters (32 on the H200, 128 CTAs), so 33 or 36 clusters
    # (N = 2112, 2304) ran in two waves
    out += [ws(m, 128, st, 4) for m, st in ((8, 5), (8, 6), (16, 4), (16, 5))]
    out += [WgmmaConfig(m, 1, 128, 4, 4, evict_first=True) for m in (4, 8)]
    out += [ws(4, 128, 6, 4), ws(4, 64, 8, 4)]
    return tuple(out)


WGMMA_CONFIGS: tuple[WgmmaConfig, ...] = _wgmma_configs()


def _compile_wgmma(cfg: WgmmaConfig, arch: str = "sm_90a") -> Any:
    """Compile one variant from hashable facts only: fake tensors, dynamic N and K."""
    if arch != "sm_90a":
        raise ValueError(f"wgmma_gemm exists for sm_90a only, got {arch}")
    from kimictl.kernels.gemm.aot import compile_gemm
    from kimictl.kernels.gemm.wgmma_gemm_dsl import WgmmaGemm

    return compile_gemm(WgmmaGemm(cfg), cfg.m, arch)
