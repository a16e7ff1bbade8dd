# The DSL traces this body: shapes and elements are DSL values mypy cannot type.
# mypy: disable-error-code="index,operator,union-attr,attr-defined"
"""The CuTe DSL body of wsnorm (see wsnorm_gemm.py): wstream's loop plus sum(x^2) per token."""

# No `from __future__ import annotations` here: the DSL reads the annotations (cuda.CUstream).
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, const_expr

from kimictl.kernels.gemm.wstream_gemm import VEC
from kimictl.kernels.gemm.wstream_gemm_dsl import WStreamGemm
from lab.kernels.wsnorm_gemm import EPS, WsNormConfig

__all__ = ["WsNormGemm"]


class WsNormGemm(WStreamGemm):
    def __init__(self, cfg: WsNormConfig) -> None:
        super().__init__(cfg)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mR: cute.Tensor) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if const_expr(self.pdl and self.early):
            cute.arch.griddepcontrol_launch_dependents()
        n = mW.shape[0]
        kv_total = mW.shape[1] // VEC
        gW = cute.zipped_divide(mW, (1, VEC))
        gX = cute.zipped_divide(mX, (1, VEC))
        atom_w = cute.make_copy_atom(
            cute.nvgpu.CopyG2ROp(),
            BFloat16,
            num_bits_per_copy=128,
            l1c_evict_priority=cute.nvgpu.CacheEvictionPriority.NO_ALLOCATE,
        )
        atom_x = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), BFloat16, num_bits_per_copy=128)

        tArA = cute.make_rmem_tensor((self.m, self.rows), Float32)
        tSq = cute.make_rmem_tensor((self.m,), Float32)  # this thread's sum of x^2 per token
        tWrW = cute.make_rmem_tensor((VEC, self.unroll, self.rows), BFloat16)
        tXrX = cute.make_rmem_tensor((VEC, self.m), BFloat16)
        warp = tidx // 32
        lane = tidx % 32
        n_warps = self.threads // 32
        outs = self.m * self.rows
        smem = cutlass.memory.SmemAllocator()
        sRed = smem.allocate_tensor(Float32, cute.make_layout((n_warps, outs + self.m)), 16)
        step = self.threads * self.unroll
        n_trips = cute.ceil_div(kv_total, step)
        blk = bidx
        tArA.fill(0.0)
        tSq.fill(0.0)
        for trip in cutlass.range(n_trips):
            for u in cutlass.range_constexpr(self.unroll):
                kv = trip * step + u * self.threads + tidx
                for r in cutlass.range_constexpr(self.rows):
                    row = cutlass.min(blk * self.rows + r, n - 1)
                    if kv < kv_total:
                        cute.copy(atom_w, gW[(None, (row, kv))], tWrW[None, u, r])
                    else:
                        tWrW[None, u, r].fill(0.0)
            if const_expr(self.pdl):
                if trip == 0:
                    cute.arch.griddepcontrol_wait()
            for u in cutlass.range_constexpr(self.unroll):
                kv = trip * step + u * self.threads + tidx
                kv_in = cutlass.min(kv, kv_total - 1)
                for m in cutlass.range_constexpr(self.m):
                    cute.copy(atom_x, gX[(None, (m, kv_in))], tXrX[None, m])
                    if kv < kv_total:  # the clamped re-read past K must not count twice
                        x32 = tXrX[None, m].load().to(Float32)
                        q = tSq[m]
                        for e in cutlass.range_constexpr(VEC):
                            q = q + x32[e] * x32[e]
                        tSq[m] = q
                for r in cutlass.range_constexpr(self.rows):
                    w32 = tWrW[None, u, r].load().to(Float32)
                    for m in cutlass.range_constexpr(self.m):
                        x32 = tXrX[None, m].load().to(Float32)
                        s = tArA[m, r]
                        for e in cutlass.range_constexpr(VEC):
                            s = s + w32[e] * x32[e]
                        tArA[m, r] = s

        if const_expr(self.pdl and not self.early):
            cute.arch.griddepcontrol_launch_dependents()

        for m in cutlass.range_constexpr(self.m):
            for r in cutlass.range_constexpr(self.rows):
                v = cute.arch.warp_reduction_sum(tArA[m, r])
                if lane == 0:
                    sRed[warp, m * self.rows + r] = v
            q = cute.arch.warp_reduction_sum(tSq[m])
            if lane == 0:
                sRed[warp, outs + m] = q
        cute.arch.sync_threads()
        if tidx < outs:
            m = tidx // self.rows
            r = tidx % self.rows
            row = blk * self.rows + r
            if row < n:
                s = Float32(0.0)
                q = Float32(0.0)
                for w in cutlass.range_constexpr(n_warps):
                    s = s + sRed[w, tidx]
                    q = q + sRed[w, outs + m]
                k = Float32(kv_total * VEC)
                s = s * cute.math.rsqrt(q / k + Float32(EPS))
                if const_expr(self.residual):
                    s = s + mR[m, row].to(Float32)
                mY[m, row] = s.to(BFloat16)
