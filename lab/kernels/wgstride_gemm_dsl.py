# The DSL traces this body: shapes are DSL values mypy cannot type.
# mypy: disable-error-code="arg-type,call-arg,attr-defined,index"
"""The CuTe DSL host side of wgstride (see wgstride_gemm.py): wgmma's, with x re-laid at its row
stride before the TMA descriptors are built. The kernel body is wgmma's, unchanged."""

# No `from __future__ import annotations` here: the DSL reads the annotations (cuda.CUstream).
import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import const_expr

from kimictl.kernels.gemm.wgmma_gemm_dsl import WgmmaGemm
from lab.kernels.wgstride_gemm import WgStrideConfig

__all__ = ["WgStrideGemm"]


class WgStrideGemm(WgmmaGemm):
    def __init__(self, cfg: WgStrideConfig) -> None:
        super().__init__(cfg)
        self.x_stride = cfg.x_stride

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mY: cute.Tensor,
        mR: cute.Tensor,
        stream: cuda.CUstream,
    ) -> None:
        # the ABI's x pointer with x's real row stride; M = 1 keeps wgmma's own (stride unused)
        if const_expr(self.m > 1):
            layout = cute.make_layout((self.m, mW.shape[1]), stride=(self.x_stride, 1))
            mX = cute.make_tensor(mX.iterator, layout)
        WgmmaGemm.__call__(self, mX, mW, mY, mR, stream)
