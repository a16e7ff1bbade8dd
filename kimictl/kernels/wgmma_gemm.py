"""Hopper warpgroup-MMA weight-streaming GEMM: y[M, N] = x[M, K] @ w[N, K]^T (+ residual) for
decode batches M = 8, 16, 32, 64 on sm_90a.

The operands are swapped against a textbook GEMM: the weight tile is wgmma's A operand (64 rows
of w per warpgroup x `bk` of k, K-major in shared memory) and the tokens are wgmma's N (x rows are
K-contiguous, so x is a K-major B operand); accumulators stay fp32 in registers. One instruction
`wgmma.m64nMk16` covers 64 weight rows x all M tokens, so no token is loaded into registers at
all (the register-operand families tcstream/tcswap spend most of their issue slots on that).

Both operands arrive by TMA (`cp.async.bulk.tensor`) into a ring of `stages` shared-memory
buffers, each guarded by a full/empty mbarrier pair; warp 0 issues the copies, every warp of the
CTA's warpgroups issues wgmma. The weight tiles of the first stages are issued BEFORE
`griddepcontrol.wait` (PDL: only x, r and y depend on the previous kernel), the x tiles of those
stages right after it. TMA descriptors are built by the host function from the runtime tensors,
so N and K stay runtime sizes; TMA zero-fills rows past N and k past K.

Small-N shapes split K over `splits` CTAs of one thread-block cluster (grid y); each CTA writes
its fp32 partial tile to shared memory and finalises 1/splits of the outputs by reading its
peers' tiles through distributed shared memory (16-byte `ld.shared::cluster`), in the same
kernel: no workspace, no second launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["WGMMA_CONFIGS", "WGMMA_MS", "WgmmaConfig"]

WGMMA_MS: tuple[int, ...] = (8, 16, 32, 64)  # wgmma's N: a multiple of 8
ROWS_PER_WG = 64  # wgmma's M
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
        if self.smem_bytes > SMEM_LIMIT:
            raise ValueError(
                f"{self.name} needs {self.smem_bytes} B of shared memory (limit {SMEM_LIMIT})"
            )

    @property
    def rows(self) -> int:
        return ROWS_PER_WG * self.wgs

    @property
    def threads(self) -> int:
        return 128 * self.wgs

    @property
    def stage_bytes(self) -> int:
        """Bytes one ring stage receives: the weight tile and the x tile."""
        return (self.rows + self.m) * self.bk * 2

    @property
    def smem_bytes(self) -> int:
        """Ring + mbarriers + alignment slack (the fp32 partial tile reuses the weight ring)."""
        return self.stages * self.stage_bytes + 16 * self.stages + 1024

    @property
    def ctas_per_sm(self) -> int:
        """How many CTAs fit one SM's 228 KB shared memory (1 KB reserved per CTA)."""
        return max(1, (228 * 1024) // (self.smem_bytes + 1024))

    @property
    def name(self) -> str:
        tail = ("_res" if self.residual else "") + ("" if self.pdl else "_nopdl")
        split = f"_s{self.splits}" if self.splits > 1 else ""
        ef = "_ef" if self.evict_first else ""
        return f"wgmma_m{self.m}_g{self.wgs}_k{self.bk}_st{self.stages}{split}{ef}{tail}"


def _wgmma_configs() -> tuple[WgmmaConfig, ...]:
    """A small sweep chosen from the 12 K3 shapes (N 448..20480, K 768..7168).

    - N >= 6288 (kda_in, o_proj, moe_latent_up, shared_down, lm_head): N / 64 >= 99 row tiles,
      no split. Depth: an SM needs ~35-50 KB of weights in flight at 4.3 TB/s; a 64 x 128 bf16
      tile is 16 KB, so 4-6 stages; a CTA under ~113 KB lets two share an SM, so 195 or 320
      tiles stay resident together (no second wave).
    - N 1536..3584 (shared_gate_up, fused_qkv_a, mla_q_b, moe_latent_down): 24..56 row tiles,
      split 2 or 4 to reach ~100-200 CTAs.
    - N 448 / 896 (moe_latent_down_tp8, router): 7 / 14 row tiles, split 8 (the portable cluster
      limit) gives 56 / 112 CTAs.
    - Two warpgroups (128 rows) halve the x bytes re-read from L2 per weight byte (matters at
      M = 64, where x's tile is as large as a 64-row weight tile).
    """
    # (wgs, bk, stages, splits)
    plan: dict[int, tuple[tuple[int, int, int, int], ...]] = {
        8: ((1, 128, 4, 1), (1, 128, 4, 2), (1, 128, 4, 4), (1, 128, 4, 8)),
        16: (
            (1, 128, 4, 1), (1, 128, 10, 1), (1, 128, 4, 2), (1, 128, 5, 2), (1, 128, 4, 4),
            (1, 128, 4, 8), (2, 128, 3, 1),
        ),
        32: (
            (1, 128, 4, 1), (1, 128, 8, 1), (1, 128, 4, 2), (1, 128, 4, 4), (1, 128, 4, 8),
            (2, 64, 5, 1),
        ),
        64: (
            (1, 128, 3, 1), (1, 128, 6, 1), (1, 128, 3, 2), (1, 128, 3, 4), (1, 128, 3, 8),
            (2, 64, 4, 1), (2, 64, 6, 1), (2, 64, 4, 2),
        ),
    }  # fmt: skip
    out = [
        WgmmaConfig(m, wgs, bk, st, sp) for m, tiles in plan.items() for wgs, bk, st, sp in tiles
    ]
    # the L2 evict-first hint on the weight stream, A/B against the same tiles
    out += [
        WgmmaConfig(16, 1, 128, 4, 2, evict_first=True),
        WgmmaConfig(64, 1, 128, 6, 1, evict_first=True),
        WgmmaConfig(64, 2, 64, 4, 1, evict_first=True),
    ]
    # the fused residual (y = x @ w^T + r), through both epilogues (local and cluster reduction)
    out += [WgmmaConfig(16, 1, 128, 4, 4, residual=True), WgmmaConfig(64, 1, 128, 3, residual=True)]
    return tuple(out)


WGMMA_CONFIGS: tuple[WgmmaConfig, ...] = _wgmma_configs()


def _compile_wgmma(cfg: WgmmaConfig, arch: str = "sm_90a") -> Any:
    """Compile one variant from hashable facts only: fake tensors, dynamic N and K."""
    if arch != "sm_90a":
        raise ValueError(f"wgmma_gemm exists for sm_90a only, got {arch}")
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16

    from kimictl.kernels.wgmma_gemm_dsl import WgmmaGemm

    n = cute.sym_int()
    k = cute.sym_int(divisibility=VEC)
    mX = cute.runtime.make_fake_compact_tensor(
        BFloat16, (cfg.m, k), stride_order=(1, 0), assumed_align=16
    )
    mW = cute.runtime.make_fake_compact_tensor(
        BFloat16, (n, k), stride_order=(1, 0), assumed_align=16
    )
    mY = cute.runtime.make_fake_compact_tensor(
        BFloat16, (cfg.m, n), stride_order=(1, 0), assumed_align=16
    )
    mR = cute.runtime.make_fake_compact_tensor(
        BFloat16, (cfg.m, n), stride_order=(1, 0), assumed_align=16
    )
    stream = cutlass.runtime.make_fake_stream()
    return cute.compile(WgmmaGemm(cfg), mX, mW, mY, mR, stream, options=f"--gpu-arch {arch}")
