# The DSL traces this body: shapes and elements are DSL values mypy cannot type.
# mypy: disable-error-code="index,operator,union-attr"
"""The CuTe DSL body of the weight-streaming GEMM (see wstream_gemm.py for the design).

Kept apart because the DSL rewrites kernel source against this module's globals: it imports
cutlass at the top, so only the build step (never the device harness or the CLI) imports it.
"""

# No `from __future__ import annotations` here: the DSL reads the annotations (cuda.CUstream).
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, const_expr

from kimictl.kernels.gemm.rowblock_dsl import RowBlockGemm
from kimictl.kernels.gemm.wstream_gemm import VEC, WStreamConfig

__all__ = ["WStreamGemm"]


class WStreamGemm(RowBlockGemm):
    def __init__(self, cfg: WStreamConfig) -> None:
        self.m = cfg.m
        self.threads = cfg.threads
        self.unroll = cfg.unroll
        self.rows = cfg.rows
        self.residual = cfg.residual
        self.pdl = cfg.pdl
        self.early = cfg.early
        self.ctas = cfg.ctas

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mR: cute.Tensor) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if const_expr(self.pdl and self.early):
            cute.arch.griddepcontrol_launch_dependents()
        n = mW.shape[0]
        kv_total = mW.shape[1] // VEC
        # (1, 8) tiles: one 16-byte vector of a row; K % 8 == 0 keeps each one aligned
        gW = cute.zipped_divide(mW, (1, VEC))
        gX = cute.zipped_divide(mX, (1, VEC))
        # weights are read once: no L1 allocation, so the x vectors stay resident
        atom_w = cute.make_copy_atom(
            cute.nvgpu.CopyG2ROp(),
            BFloat16,
            num_bits_per_copy=128,
            l1c_evict_priority=cute.nvgpu.CacheEvictionPriority.NO_ALLOCATE,
        )
        atom_x = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), BFloat16, num_bits_per_copy=128)

        tArA = cute.make_rmem_tensor((self.m, self.rows), Float32)
        tWrW = cute.make_rmem_tensor((VEC, self.unroll, self.rows), BFloat16)
        tXrX = cute.make_rmem_tensor((VEC, self.m), BFloat16)
        warp = tidx // 32
        lane = tidx % 32
        n_warps = self.threads // 32
        smem = cutlass.memory.SmemAllocator()
        sRed = smem.allocate_tensor(Float32, cute.make_layout((n_warps, self.m * self.rows)), 16)
        step = self.threads * self.unroll
        n_trips = cute.ceil_div(kv_total, step)
        # one row block per CTA, or (persistent, ctas > 0) a grid-stride loop over row blocks
        n_blocks = cute.ceil_div(n, self.rows)
        stride = n_blocks
        if const_expr(self.ctas > 0):
            stride = cute.arch.grid_dim()[0]
        for blk in cutlass.range(bidx, n_blocks, stride):
            tArA.fill(0.0)
            for trip in cutlass.range(n_trips):
                # 1) every weight load of this trip in flight first (rows past N re-read N-1)
                for u in cutlass.range_constexpr(self.unroll):
                    kv = trip * step + u * self.threads + tidx
                    for r in cutlass.range_constexpr(self.rows):
                        row = cutlass.min(blk * self.rows + r, n - 1)
                        if kv < kv_total:
                            cute.copy(atom_w, gW[(None, (row, kv))], tWrW[None, u, r])
                        else:
                            tWrW[None, u, r].fill(0.0)
                # 2) PDL: x is the previous kernel's output; wait only now, weights moving
                if const_expr(self.pdl):
                    if trip == 0:
                        cute.arch.griddepcontrol_wait()
                # 3) acc[m, r] += sum_e w[r, e] * x[m, e]
                for u in cutlass.range_constexpr(self.unroll):
                    kv = trip * step + u * self.threads + tidx
                    kv_in = cutlass.min(kv, kv_total - 1)
                    for m in cutlass.range_constexpr(self.m):
                        cute.copy(atom_x, gX[(None, (m, kv_in))], tXrX[None, m])
                    for r in cutlass.range_constexpr(self.rows):
                        w32 = tWrW[None, u, r].load().to(Float32)
                        for m in cutlass.range_constexpr(self.m):
                            x32 = tXrX[None, m].load().to(Float32)
                            s = tArA[m, r]
                            for e in cutlass.range_constexpr(VEC):
                                s = s + w32[e] * x32[e]
                            tArA[m, r] = s

            if const_expr(self.pdl and not self.early):
                # all of this CTA's weight bytes are read: the next kernel may start its prologue
                cute.arch.griddepcontrol_launch_dependents()

            # CTA reduction: shuffle within warps, then one smem row per warp
            for m in cutlass.range_constexpr(self.m):
                for r in cutlass.range_constexpr(self.rows):
                    v = cute.arch.warp_reduction_sum(tArA[m, r])
                    if lane == 0:
                        sRed[warp, m * self.rows + r] = v
            cute.arch.sync_threads()
            if tidx < self.m * self.rows:
                m = tidx // self.rows
                r = tidx % self.rows
                row = blk * self.rows + r
                if row < n:
                    s = Float32(0.0)
                    for w in cutlass.range_constexpr(n_warps):
                        s = s + sRed[w, tidx]
                    if const_expr(self.residual):
                        s = s + mR[m, row].to(Float32)
                    mY[m, row] = s.to(BFloat16)
            if const_expr(self.ctas > 0):
                cute.arch.sync_threads()  # sRed is reused by the next block
