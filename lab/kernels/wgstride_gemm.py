"""wgmma with x read at a row stride of its own (experimental, not shipped).

KDA's f_b reads f_a, a 128-column slice of the packed q/k/v/g/f_a/beta projection's output, so x's
rows sit `x_stride` elements apart. The GEMM ABI's x is packed [M, K], so a kimictl kernel needed
a copy first (or cuBLAS, which takes the stride and breaks the PDL chain). wgmma loads x by TMA, and
a TMA descriptor takes any row stride that is a multiple of 16 bytes: this family is wgmma with x's
descriptor built at `x_stride`. Built only on request (lab/bench/layer_h200.py --make-build).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimictl.kernels.gemm.wgmma_gemm import WgmmaConfig

__all__ = ["STRIDE_CONFIGS", "WgStrideConfig", "stride_configs"]

VEC = 8


@dataclass(frozen=True)
class WgStrideConfig(WgmmaConfig):
    x_stride: int = 0  # elements between x's rows (>= K)
    kernel = "wgstride_gemm"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.x_stride <= 0 or self.x_stride % VEC:
            raise ValueError("x_stride must be a positive multiple of 8 (16-byte TMA strides)")
        if self.wn:
            raise ValueError("wgstride keeps x as wgmma's B operand (wn = 0)")

    @property
    def name(self) -> str:
        return "wgstride" + super().name.removeprefix("wgmma") + f"_x{self.x_stride}"


def stride_configs(ms: tuple[int, ...] = (2, 4, 8, 16, 32, 64)) -> tuple[WgStrideConfig, ...]:
    """KDA's f_b (1536 x 128, x = f_a in kda_in's output at TP8): wgmma's plain 4-stage tile (the
    f_b candidate at M = 1, where the slice is contiguous)."""
    from kimictl.kernels.layer.ops import dense_layer_ops

    x_stride = {op.name: op for op in dense_layer_ops("kda")}["kda_in"].n
    return tuple(WgStrideConfig(m, 1, 128, 4, 1, evict_first=m < 8, x_stride=x_stride) for m in ms)


STRIDE_CONFIGS: tuple[WgStrideConfig, ...] = ()  # built on request (layer_h200.py --make-build)


def _compile_wgstride(cfg: WgStrideConfig, arch: str = "sm_90a") -> Any:
    if arch != "sm_90a":
        raise ValueError(f"wgstride_gemm exists for sm_90a only, got {arch}")
    from kimictl.kernels.gemm.aot import compile_gemm
    from lab.kernels.wgstride_gemm_dsl import WgStrideGemm

    return compile_gemm(WgStrideGemm(cfg), cfg.m, arch)
