"""Weight-streaming GEMM with the RMSNorm of x folded in (experimental, not shipped).

y[m, n] = rmsnorm(x[m]) . (w[n] * g) = (x[m] . w'[n]) * rsqrt(mean(x[m]^2) + eps) (+ r[m, n]),
with the norm weight g folded into w' = w * g once, when weights are loaded. The kernel is
`wstream`'s (same C ABI, same PDL, fp32 accumulation): each CTA already streams every element of
its x rows, so it sums their squares on the way and scales its outputs at the end. That removes
the RMSNorm launch in front of a projection whose input is already materialized (the residual
sum from o_proj's residual epilogue; the routed experts' latent output).
Built only on request: `build('sm_90a', configs=wsnorm_gemm.NORM_CONFIGS)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimictl.kernels.gemm.wstream_gemm import WStreamConfig

__all__ = ["EPS", "NORM_CONFIGS", "WsNormConfig", "wsnorm_gemm_ref"]

EPS = 1e-6  # compile-time: one build per checkpoint eps (K3's rms_norm_eps)


@dataclass(frozen=True)
class WsNormConfig(WStreamConfig):
    kernel = "wsnorm_gemm"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ctas:
            raise ValueError("wsnorm has no persistent variant (x's norm is summed once per CTA)")

    @property
    def name(self) -> str:
        return "wsnorm" + super().name.removeprefix("wstream")


def _configs() -> tuple[WsNormConfig, ...]:
    out: list[WsNormConfig] = []
    for m in (1, 2, 4, 8):
        for residual in (False, True):
            for threads, unroll, rows in ((128, 7, 1), (64, 7, 2), (128, 7, 2)):
                out.append(WsNormConfig(m, threads, unroll, rows, residual=residual, early=True))
    return tuple(out)


NORM_CONFIGS: tuple[WsNormConfig, ...] = _configs()


def _compile_wsnorm(cfg: WsNormConfig, arch: str = "sm_90a") -> Any:
    from kimictl.kernels.gemm.aot import compile_gemm
    from lab.kernels.wsnorm_gemm_dsl import WsNormGemm

    return compile_gemm(WsNormGemm(cfg), cfg.m, arch)


def wsnorm_gemm_ref(x: Any, w_folded: Any, residual: Any = None) -> Any:
    """fp64 reference of what the kernel computes (w_folded = w * g)."""
    xd = x.double()
    y = (xd @ w_folded.double().T) * (xd.pow(2).mean(-1, keepdim=True) + EPS).rsqrt()
    return y if residual is None else y + residual.double()
