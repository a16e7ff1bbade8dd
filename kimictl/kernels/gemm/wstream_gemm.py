"""Weight-streaming GEMM for decode: y[M, N] = x[M, K] @ w[N, K]^T (+ residual), M = 1..8 tokens.

At decode batch sizes a projection is a stream of weight bytes: time = N*K*2 bytes / bandwidth.
Each CTA owns `rows` consecutive rows of w and splits K over its threads; every thread issues
`rows * unroll` 16-byte weight loads (L1 no-allocate, so x stays in L1) before touching x, which
keeps enough bytes in flight to cover HBM latency. With programmatic dependent launch (PDL) the
first weight loads are issued BEFORE `griddepcontrol.wait`, so they overlap the previous kernel's
tail; x, the residual and y are only touched after the wait. fp32 accumulation, bf16 in and out.

File order (quack shape): config + heuristic, kernel class, `_compile_wstream` (fake tensors only),
host wrapper, `wstream_gemm_ref` last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the DSL and torch are heavy: imported inside functions
    import torch

__all__ = [
    "CONFIGS",
    "MAX_M",
    "WStreamConfig",
    "kernel_name",
    "wstream_gemm",
    "wstream_gemm_ref",
]

MAX_M = 8  # tokens per step the fast path prepares at most (K3: q = 1 + 7 draft tokens)
VEC = 8  # bf16 elements per 16-byte load


@dataclass(frozen=True)
class WStreamConfig:
    """Compile-time facts of one variant. N and K stay runtime sizes (K % 8 == 0)."""

    m: int  # tokens (rows of x), 1..MAX_M
    threads: int  # threads per CTA, all splitting K
    unroll: int  # 16-byte weight loads per row per thread per loop trip
    rows: int  # rows of w per CTA
    residual: bool = False  # y = x @ w^T + r
    pdl: bool = True  # launched with programmatic stream serialization
    # PDL trigger at the kernel's start instead of after the weight loop: the next grid's CTAs
    # become resident and stream their weights while this grid's tail drains (its
    # griddepcontrol.wait still waits for this whole grid, so early is always correct)
    early: bool = False
    # > 0: a persistent grid of at most `ctas` CTAs looping over row blocks (all CTAs start at
    # once, so an early trigger lets the whole next grid launch at the start of this one)
    ctas: int = 0
    kernel = "wstream_gemm"

    def __post_init__(self) -> None:
        if not 1 <= self.m <= MAX_M:
            raise ValueError(f"m must be 1..{MAX_M}, got {self.m}")
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"threads must be a multiple of 32 in 32..1024, got {self.threads}")
        if self.m * self.rows > self.threads:
            raise ValueError("m * rows must not exceed threads (one thread writes each output)")

    @property
    def k_per_trip(self) -> int:
        """Elements of K one loop trip of the whole CTA covers."""
        return self.threads * self.unroll * VEC

    @property
    def name(self) -> str:
        tail = ("_res" if self.residual else "") + ("" if self.pdl else "_nopdl")
        tail += "_et" if self.early and self.pdl else ""
        tail += f"_p{self.ctas}" if self.ctas else ""
        return f"wstream_m{self.m}_t{self.threads}_u{self.unroll}_r{self.rows}{tail}"


# (threads, unroll, rows) tiles built for every M. One trip covers threads*unroll*8 elements of K:
# 128x7 = 7168 and 64x7 = 3584 fit K3's K = 7168 / 3584 in one or two trips with no idle lanes,
# 64x3 = 1536 and 32x3 = 768 fit K = 1536 / 768; 128x4 covers the rest. More rows share each x
# load between rows (x traffic falls as 1/rows) at the price of fewer CTAs for small N.
TILES: tuple[tuple[int, int, int], ...] = (
    (128, 7, 1),
    (128, 7, 2),
    (64, 7, 2),
    (64, 3, 4),
    (32, 3, 4),
    (128, 4, 2),
)


def _all_configs() -> tuple[WStreamConfig, ...]:
    out: list[WStreamConfig] = []
    for m in range(1, MAX_M + 1):
        for threads, unroll, rows in TILES:
            out.append(WStreamConfig(m, threads, unroll, rows))
        # fused residual on the two tiles that cover K3's large-K projections
        out.append(WStreamConfig(m, 128, 7, 1, residual=True))
        out.append(WStreamConfig(m, 64, 7, 2, residual=True))
    for m in (1, 8):  # measures what PDL buys in a back-to-back chain
        out.append(WStreamConfig(m, 128, 7, 1, pdl=False))
    for m in range(1, MAX_M + 1):  # early PDL trigger on the tiles that won somewhere
        for threads, unroll, rows in ((128, 7, 1), (128, 7, 2), (64, 7, 2), (64, 3, 4)):
            out.append(WStreamConfig(m, threads, unroll, rows, early=True))
        # persistent grids of 2 and 4 CTAs per SM of the H200's 132 (room left for the next grid)
        for threads, unroll, rows, ctas in ((128, 7, 2, 264), (128, 7, 2, 528), (64, 7, 2, 528)):
            out.append(WStreamConfig(m, threads, unroll, rows, early=True, ctas=ctas))
    return tuple(out)


CONFIGS: tuple[WStreamConfig, ...] = _all_configs()


def default_config(n: int, k: int, m: int, *, residual: bool = False) -> WStreamConfig:
    """Analytical pick when no measurement exists: the tile whose trip wastes the fewest lanes."""
    kv = k // VEC

    def waste(tile: tuple[int, int, int]) -> tuple[float, int]:
        threads, unroll, rows = tile
        step = threads * unroll
        trips = -(-kv // step)
        ctas = -(-n // rows)
        return ((trips * step - kv) / (trips * step), -min(ctas, 4 * 132))

    candidates = [t for t in TILES if not residual or (t in ((128, 7, 1), (64, 7, 2)))]
    threads, unroll, rows = min(candidates, key=waste)
    return WStreamConfig(m, threads, unroll, rows, residual=residual)


def kernel_name(cfg: WStreamConfig) -> str:
    return cfg.name


def _compile_wstream(cfg: WStreamConfig, arch: str = "sm_90a") -> Any:
    """Compile one variant from hashable facts only: fake tensors, dynamic N and K."""
    from kimictl.kernels.gemm.aot import compile_gemm
    from kimictl.kernels.gemm.wstream_gemm_dsl import WStreamGemm

    return compile_gemm(WStreamGemm(cfg), cfg.m, arch)


# The C entry point build.py generates for each variant (see build.C_WRAPPER):
#   int kimictl_<name>(void* x, void* w, void* y, void* r, int n, int k, void* stream)


def wstream_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    cfg: WStreamConfig | None = None,
    library: Any = None,
) -> torch.Tensor:
    """y = x @ w^T (+ residual) through `library`, the linked device library
    (kimictl.kernels.toolchain.harness.open_library)."""
    import torch

    assert x.dtype == torch.bfloat16 and w.dtype == torch.bfloat16, "x and w must be bf16"
    assert x.dim() == 2 and w.dim() == 2, "x is (M, K), w is (N, K)"
    m, k = x.shape
    n = w.shape[0]
    assert w.shape[1] == k, f"K mismatch: x has {k}, w has {w.shape[1]}"
    assert k % VEC == 0, f"K must be a multiple of {VEC} (16-byte rows), got {k}"
    assert 1 <= m <= MAX_M or m == 0, f"M must be 1..{MAX_M}, got {m}"
    assert x.is_contiguous() and w.is_contiguous(), "x and w must be contiguous"
    y = out if out is not None else torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return y
    cfg = cfg or default_config(n, k, m, residual=residual is not None)
    assert cfg.m == m, f"variant built for M={cfg.m}, called with M={m}"
    assert cfg.residual == (residual is not None), "residual variant and argument must agree"
    if residual is not None:
        assert residual.shape == (m, n) and residual.dtype == torch.bfloat16
        assert residual.is_contiguous()
    if library is None:
        raise ValueError("library is required: the device library the variant is linked in")
    library.launch(cfg.name, x, w, y, residual if residual is not None else y)
    return y


def wstream_gemm_ref(
    x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None, *, fp64: bool = False
) -> torch.Tensor:
    """Reference in fp32 (or fp64) math; returns the wide dtype so callers measure the rounding."""
    import torch

    wide = torch.float64 if fp64 else torch.float32
    y = x.to(wide) @ w.to(wide).T
    if residual is not None:
        y = y + residual.to(wide)
    return y
