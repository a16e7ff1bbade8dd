# The DSL traces this body: shapes and elements are DSL values mypy cannot type.
# mypy: disable-error-code="index,operator,union-attr,arg-type,call-arg,attr-defined"
"""The CuTe DSL body of the tensor-core weight-streaming GEMM (design in tcstream_gemm.py).

Imports cutlass at the top (the DSL rewrites kernel source against this module's globals), so
only the build step imports it.
"""

# No `from __future__ import annotations` here: the DSL reads the annotations (cuda.CUstream).
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from kimictl.kernels.gemm.rowblock_dsl import RowBlockGemm
from kimictl.kernels.gemm.tcstream_gemm import ROWS, VEC, TcStreamConfig

__all__ = ["TcStreamGemm", "load_peer_f32", "mma_bf16_16816"]


@dsl_user_op
def mma_bf16_16816(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, *, loc=None, ip=None):
    """D = A(16x16 bf16, row) * B(16x8 bf16, col) + C, fp32: PTX register order a0..a3 = packed
    bf16 pairs (row g k 2t), (row g+8 k 2t), (row g k 2t+8), (row g+8 k 2t+8); b0, b1 = (k 2t,
    col g), (k 2t+8, col g); c0..c3 = (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)."""
    ins = [Int32(v).ir_value(loc=loc, ip=ip) for v in (a0, a1, a2, a3, b0, b1)]
    ins += [Float32(v).ir_value(loc=loc, ip=ip) for v in (c0, c1, c2, c3)]
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32(), T.f32(), T.f32(), T.f32()]),
        ins,
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
        has_side_effects=False,
        loc=loc,
        ip=ip,
    )
    return tuple(Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def load_peer_f32(smem_ptr, cta_rank, *, loc=None, ip=None):
    """fp32 at the same shared-memory offset in CTA `cta_rank` of this cluster. Volatile, so it
    stays after the cluster barrier that published the value."""
    addr = llvm.ptrtoint(T.i32(), smem_ptr.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip)
    res = llvm.inline_asm(
        T.f32(),
        [addr, Int32(cta_rank).ir_value(loc=loc, ip=ip)],
        "{ .reg .b32 ra; mapa.shared::cluster.u32 ra, $1, $2; ld.shared::cluster.f32 $0, [ra]; }",
        "=f,r,r",
        has_side_effects=True,
        loc=loc,
        ip=ip,
    )
    return Float32(res)


class TcStreamGemm(RowBlockGemm):
    def __init__(self, cfg: TcStreamConfig) -> None:
        self.m = cfg.m
        self.n_tiles = cfg.n_tiles
        self.warps = cfg.warps
        self.threads = 32 * cfg.warps
        self.unroll = cfg.unroll
        self.groups = cfg.groups
        self.splits = cfg.splits
        self.rows = cfg.rows
        self.residual = cfg.residual
        self.pdl = cfg.pdl
        self.early = cfg.early
        self.ctas = cfg.ctas

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mR: cute.Tensor) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        bidx, crank, _ = cute.arch.block_idx()  # crank: this CTA's K slice within the cluster
        if const_expr(self.pdl and self.early):
            cute.arch.griddepcontrol_launch_dependents()
        lane = tidx % 32
        warp = tidx // 32
        g = lane // 4  # fragment row (and token) group
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

        # rows past N re-read row N-1 (valid memory); their results are never stored
        tCrC = cute.make_rmem_tensor((4, self.n_tiles, self.groups), Float32)
        tWlo = cute.make_rmem_tensor((VEC, self.unroll, self.groups), BFloat16)
        tWhi = cute.make_rmem_tensor((VEC, self.unroll, self.groups), BFloat16)
        tXrX = cute.make_rmem_tensor((VEC, self.n_tiles, self.unroll), BFloat16)
        # the cluster acts as one CTA of splits * warps warps interleaved over the 32-k groups
        vwarps = self.splits * self.warps
        vwarp = crank * self.warps + warp
        step = vwarps * self.unroll  # 32-k groups per trip of the cluster
        n_trips = cute.ceil_div(cute.ceil_div(kv_total, 4), step)
        # CTA reduction buffer: sRed[warp, row, token]
        smem = cutlass.memory.SmemAllocator()
        sRed = smem.allocate_tensor(
            Float32, cute.make_layout((self.warps, self.rows, 8 * self.n_tiles)), 16
        )
        # one 16-row block per CTA, or (persistent, ctas > 0) a grid-stride loop over row blocks
        n_blocks = cute.ceil_div(n, self.rows)
        stride = n_blocks
        if const_expr(self.ctas > 0):
            stride = cute.arch.grid_dim()[0]
        for blk in cutlass.range(bidx, n_blocks, stride):
            tCrC.fill(0.0)
            for trip in cutlass.range(n_trips):
                # 1) this trip's weight vectors in flight first
                for u in cutlass.range_constexpr(self.unroll):
                    kv = (trip * step + u * vwarps + vwarp) * 4 + t
                    for q in cutlass.range_constexpr(self.groups):
                        row_lo = cutlass.min(blk * self.rows + q * ROWS + g, n - 1)
                        row_hi = cutlass.min(blk * self.rows + q * ROWS + g + 8, n - 1)
                        if kv < kv_total:
                            cute.copy(atom_w, gW[(None, (row_lo, kv))], tWlo[None, u, q])
                            cute.copy(atom_w, gW[(None, (row_hi, kv))], tWhi[None, u, q])
                        else:
                            tWlo[None, u, q].fill(0.0)
                            tWhi[None, u, q].fill(0.0)
                # 2) PDL: x comes from the previous kernel; weights are already moving
                if const_expr(self.pdl):
                    if trip == 0:
                        cute.arch.griddepcontrol_wait()
                # 3) token vectors, then two MMAs per 32-k group, token tile and row group
                for u in cutlass.range_constexpr(self.unroll):
                    kv = (trip * step + u * vwarps + vwarp) * 4 + t
                    for j in cutlass.range_constexpr(self.n_tiles):
                        tok = g + 8 * j
                        if kv < kv_total and tok < self.m:
                            cute.copy(atom_x, gX[(None, (tok, kv))], tXrX[None, j, u])
                        else:
                            tXrX[None, j, u].fill(0.0)
                for u in cutlass.range_constexpr(self.unroll):
                    for q in cutlass.range_constexpr(self.groups):
                        a_lo = cute.recast_tensor(tWlo[None, u, q], Int32)
                        a_hi = cute.recast_tensor(tWhi[None, u, q], Int32)
                        for j in cutlass.range_constexpr(self.n_tiles):
                            b = cute.recast_tensor(tXrX[None, j, u], Int32)
                            for h in cutlass.range_constexpr(2):
                                d0, d1, d2, d3 = mma_bf16_16816(
                                    a_lo[2 * h],
                                    a_hi[2 * h],
                                    a_lo[2 * h + 1],
                                    a_hi[2 * h + 1],
                                    b[2 * h],
                                    b[2 * h + 1],
                                    tCrC[0, j, q],
                                    tCrC[1, j, q],
                                    tCrC[2, j, q],
                                    tCrC[3, j, q],
                                )
                                tCrC[0, j, q] = d0
                                tCrC[1, j, q] = d1
                                tCrC[2, j, q] = d2
                                tCrC[3, j, q] = d3

            if const_expr(self.pdl and not self.early):
                cute.arch.griddepcontrol_launch_dependents()

            # CTA reduction over the K-splitting warps: sRed[warp, row, token]
            for q in cutlass.range_constexpr(self.groups):
                for j in cutlass.range_constexpr(self.n_tiles):
                    sRed[warp, q * ROWS + g, 8 * j + 2 * t] = tCrC[0, j, q]
                    sRed[warp, q * ROWS + g, 8 * j + 2 * t + 1] = tCrC[1, j, q]
                    sRed[warp, q * ROWS + g + 8, 8 * j + 2 * t] = tCrC[2, j, q]
                    sRed[warp, q * ROWS + g + 8, 8 * j + 2 * t + 1] = tCrC[3, j, q]
            if const_expr(self.splits > 1):
                # release this CTA's partials to the cluster, acquire the others'
                cute.arch.cluster_arrive()
                cute.arch.cluster_wait()
            else:
                cute.arch.sync_threads()
            outputs = self.rows * self.m
            per_cta = (outputs + self.splits - 1) // self.splits  # outputs this CTA finalises
            for o in cutlass.range_constexpr((per_cta + self.threads - 1) // self.threads):
                idx = (o * self.threads + tidx) * self.splits + crank
                if idx < outputs:
                    tok = idx // self.rows
                    r = idx % self.rows
                    row = blk * self.rows + r
                    if row < n:
                        s = Float32(0.0)
                        for c in cutlass.range_constexpr(self.splits):
                            if const_expr(self.splits > 1):
                                # peer c's sRed[w, r, tok]: mapa + ld.shared::cluster
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
                # no CTA may exit while a peer still reads its shared memory
                cute.arch.cluster_arrive()
                cute.arch.cluster_wait()
            if const_expr(self.ctas > 0):
                cute.arch.sync_threads()  # sRed is reused by the next block
