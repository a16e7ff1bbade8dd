# The DSL traces this body: shapes and elements are DSL values mypy cannot type.
# mypy: disable-error-code="index,operator,union-attr,arg-type,call-arg,attr-defined"
"""The CuTe DSL body of the swapped-operand tensor-core GEMM (design in tcswap_gemm.py).

Imports cutlass at the top (the DSL rewrites kernel source against this module's globals), so
only the build step imports it.
"""

# No `from __future__ import annotations` here: the DSL reads the annotations (cuda.CUstream).
import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, const_expr

from kimictl.kernels.tcstream_gemm_dsl import load_peer_f32, mma_bf16_16816
from kimictl.kernels.tcswap_gemm import VEC, TcSwapConfig

__all__ = ["TcSwapGemm"]


class TcSwapGemm:
    def __init__(self, cfg: TcSwapConfig) -> None:
        self.m = cfg.m
        self.m_tiles = cfg.m_tiles
        self.warps = cfg.warps
        self.threads = 32 * cfg.warps
        self.unroll = cfg.unroll
        self.blocks = cfg.blocks
        self.splits = cfg.splits
        self.rows = cfg.rows
        self.residual = cfg.residual
        self.pdl = cfg.pdl
        self.prefetch = cfg.prefetch

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mY: cute.Tensor,
        mR: cute.Tensor,
        stream: cuda.CUstream,
    ) -> None:
        grid = (cute.ceil_div(mW.shape[0], self.rows), self.splits, 1)
        if const_expr(self.splits > 1):
            self.kernel(mX, mW, mY, mR).launch(
                grid=grid,
                block=(self.threads, 1, 1),
                cluster=(1, self.splits, 1),
                stream=stream,
                use_pdl=self.pdl,
            )
        else:
            self.kernel(mX, mW, mY, mR).launch(
                grid=grid, block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl
            )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mR: cute.Tensor) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        bidx, crank, _ = cute.arch.block_idx()  # crank: this CTA's K slice within the cluster
        lane = tidx % 32
        warp = tidx // 32
        g = lane // 4  # A row (token) group and B column (weight row) group
        t = lane % 4  # fragment k pair
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

        # C[.., i, b]: tokens 16i + {g, g+8} x weight rows 8b + {2t, 2t+1}
        tCrC = cute.make_rmem_tensor((4, self.m_tiles, self.blocks), Float32)
        tCrC.fill(0.0)
        tWrW = cute.make_rmem_tensor((VEC, self.unroll, self.blocks), BFloat16)
        tXlo = cute.make_rmem_tensor((VEC, self.m_tiles, self.unroll), BFloat16)
        tXhi = cute.make_rmem_tensor((VEC, self.m_tiles, self.unroll), BFloat16)
        vwarps = self.splits * self.warps
        vwarp = crank * self.warps + warp
        step = vwarps * self.unroll  # 32-k groups per trip of the cluster
        n_trips = cute.ceil_div(cute.ceil_div(kv_total, 4), step)
        if const_expr(self.prefetch):
            # weights of trip 0 in flight before the grid dependency wait
            tWnx = cute.make_rmem_tensor((VEC, self.unroll, self.blocks), BFloat16)
            self.load_w(gW, atom_w, tWnx, 0, step, vwarps, vwarp, t, g, bidx, n, kv_total)
            if const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            for trip in cutlass.range(n_trips):
                tWrW.store(tWnx.load())  # waits for this trip's weights
                self.load_w(
                    gW, atom_w, tWnx, trip + 1, step, vwarps, vwarp, t, g, bidx, n, kv_total
                )
                self.load_x(gX, atom_x, tXlo, tXhi, trip, step, vwarps, vwarp, t, g, kv_total)
                self.mmas(tWrW, tXlo, tXhi, tCrC)
        else:
            for trip in cutlass.range(n_trips):
                # 1) weights in flight first (rows past N re-read row N-1; never stored)
                self.load_w(gW, atom_w, tWrW, trip, step, vwarps, vwarp, t, g, bidx, n, kv_total)
                # 2) PDL: x comes from the previous kernel
                if const_expr(self.pdl):
                    if trip == 0:
                        cute.arch.griddepcontrol_wait()
                # 3) token vectors, 4) MMAs
                self.load_x(gX, atom_x, tXlo, tXhi, trip, step, vwarps, vwarp, t, g, kv_total)
                self.mmas(tWrW, tXlo, tXhi, tCrC)

        if const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()

        # sRed[warp, row in CTA, token]: each warp's partial sums
        smem = cutlass.memory.SmemAllocator()
        sRed = smem.allocate_tensor(
            Float32, cute.make_layout((self.warps, self.rows, 16 * self.m_tiles)), 16
        )
        for i in cutlass.range_constexpr(self.m_tiles):
            for b in cutlass.range_constexpr(self.blocks):
                sRed[warp, 8 * b + 2 * t, 16 * i + g] = tCrC[0, i, b]
                sRed[warp, 8 * b + 2 * t + 1, 16 * i + g] = tCrC[1, i, b]
                sRed[warp, 8 * b + 2 * t, 16 * i + g + 8] = tCrC[2, i, b]
                sRed[warp, 8 * b + 2 * t + 1, 16 * i + g + 8] = tCrC[3, i, b]
        if const_expr(self.splits > 1):
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()
        outputs = self.rows * self.m
        per_cta = (outputs + self.splits - 1) // self.splits
        for o in cutlass.range_constexpr((per_cta + self.threads - 1) // self.threads):
            idx = (o * self.threads + tidx) * self.splits + crank
            if idx < outputs:
                tok = idx // self.rows
                r = idx % self.rows
                row = bidx * self.rows + r
                if row < n:
                    s = Float32(0.0)
                    for c in cutlass.range_constexpr(self.splits):
                        if const_expr(self.splits > 1):
                            for w in cutlass.range_constexpr(self.warps):
                                off = w + self.warps * (r + self.rows * tok)
                                s = s + load_peer_f32(sRed.iterator + off, c)
                        else:
                            for w in cutlass.range_constexpr(self.warps):
                                s = s + sRed[w, r, tok]
                    if const_expr(self.residual):
                        s = s + mR[tok, row].to(Float32)
                    mY[tok, row] = s.to(BFloat16)
        if const_expr(self.splits > 1):
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    @cute.jit
    def load_w(self, gW, atom_w, tW, trip, step, vwarps, vwarp, t, g, bidx, n, kv_total):
        """This warp's weight vectors of one trip; rows past N re-read row N-1 (never stored),
        k past K are zeros."""
        for u in cutlass.range_constexpr(self.unroll):
            kv = (trip * step + u * vwarps + vwarp) * 4 + t
            for b in cutlass.range_constexpr(self.blocks):
                row = cutlass.min(bidx * self.rows + 8 * b + g, n - 1)
                if kv < kv_total:
                    cute.copy(atom_w, gW[(None, (row, kv))], tW[None, u, b])
                else:
                    tW[None, u, b].fill(0.0)

    @cute.jit
    def load_x(self, gX, atom_x, tXlo, tXhi, trip, step, vwarps, vwarp, t, g, kv_total):
        """Token vectors of one trip: rows g and g + 8 of each 16-token tile."""
        for u in cutlass.range_constexpr(self.unroll):
            kv = (trip * step + u * vwarps + vwarp) * 4 + t
            for i in cutlass.range_constexpr(self.m_tiles):
                tlo = 16 * i + g
                thi = 16 * i + g + 8
                if kv < kv_total and tlo < self.m:
                    cute.copy(atom_x, gX[(None, (tlo, kv))], tXlo[None, i, u])
                else:
                    tXlo[None, i, u].fill(0.0)
                if kv < kv_total and thi < self.m:
                    cute.copy(atom_x, gX[(None, (thi, kv))], tXhi[None, i, u])
                else:
                    tXhi[None, i, u].fill(0.0)

    @cute.jit
    def mmas(self, tWrW, tXlo, tXhi, tCrC):
        """Two MMAs per 32-k group, token tile and weight block."""
        for u in cutlass.range_constexpr(self.unroll):
            for i in cutlass.range_constexpr(self.m_tiles):
                a_lo = cute.recast_tensor(tXlo[None, i, u], Int32)
                a_hi = cute.recast_tensor(tXhi[None, i, u], Int32)
                for b in cutlass.range_constexpr(self.blocks):
                    bw = cute.recast_tensor(tWrW[None, u, b], Int32)
                    for h in cutlass.range_constexpr(2):
                        d0, d1, d2, d3 = mma_bf16_16816(
                            a_lo[2 * h],
                            a_hi[2 * h],
                            a_lo[2 * h + 1],
                            a_hi[2 * h + 1],
                            bw[2 * h],
                            bw[2 * h + 1],
                            tCrC[0, i, b],
                            tCrC[1, i, b],
                            tCrC[2, i, b],
                            tCrC[3, i, b],
                        )
                        tCrC[0, i, b] = d0
                        tCrC[1, i, b] = d1
                        tCrC[2, i, b] = d2
                        tCrC[3, i, b] = d3
