# The DSL traces this body: shapes and elements are DSL values mypy cannot type.
# mypy: disable-error-code="index,operator,union-attr,arg-type,call-arg,attr-defined"
"""The CuTe DSL body of the pipelined tensor-core GEMM (design in tcpipe_gemm.py).

Imports cutlass at the top (the DSL rewrites kernel source against this module's globals), so
only the build step imports it. Shared-memory traffic is written as inline PTX on byte
addresses: the swizzle and the k permutation are two integer expressions there.
"""

# No `from __future__ import annotations` here: the DSL reads the annotations (cuda.CUstream).
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from kimictl.kernels.gemm.rowblock_dsl import RowBlockGemm
from kimictl.kernels.gemm.tcpipe_gemm import VEC, TcPipeConfig

__all__ = ["TcPipeGemm"]


@dsl_user_op
def cp_async_cg16(saddr, gaddr, nbytes, *, loc=None, ip=None):
    """16 bytes global -> shared, cached in L2 only; bytes past `nbytes` (0 or 16) are zeroed."""
    llvm.inline_asm(
        None,
        [
            Int32(saddr).ir_value(loc=loc, ip=ip),
            Int64(gaddr).ir_value(loc=loc, ip=ip),
            Int32(nbytes).ir_value(loc=loc, ip=ip),
        ],
        "cp.async.cg.shared.global [$0], [$1], 16, $2;",
        "r,l,r",
        has_side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def ld_shared_v4(saddr, *, loc=None, ip=None):
    """16 bytes of shared memory as four b32 (volatile: stays between its barriers)."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32(), T.i32(), T.i32(), T.i32()]),
        [Int32(saddr).ir_value(loc=loc, ip=ip)],
        "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,r",
        has_side_effects=True,
        loc=loc,
        ip=ip,
    )
    return [Int32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def ld_cluster_v4f32(saddr, cta_rank, *, loc=None, ip=None):
    """Four fp32 at the same shared-memory offset in CTA `cta_rank` of this cluster."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32(), T.f32(), T.f32(), T.f32()]),
        [Int32(saddr).ir_value(loc=loc, ip=ip), Int32(cta_rank).ir_value(loc=loc, ip=ip)],
        "{ .reg .b32 ra; mapa.shared::cluster.u32 ra, $4, $5; "
        "ld.shared::cluster.v4.f32 {$0, $1, $2, $3}, [ra]; }",
        "=f,=f,=f,=f,r,r",
        has_side_effects=True,
        loc=loc,
        ip=ip,
    )
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def ld_shared_v4f32(saddr, *, loc=None, ip=None):
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32(), T.f32(), T.f32(), T.f32()]),
        [Int32(saddr).ir_value(loc=loc, ip=ip)],
        "ld.shared.v4.f32 {$0, $1, $2, $3}, [$4];",
        "=f,=f,=f,=f,r",
        has_side_effects=True,
        loc=loc,
        ip=ip,
    )
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def mma_16816(a, b, c, *, loc=None, ip=None):
    """D = A(16x16 bf16, row) * B(16x8 bf16, col) + C in fp32. a: 4 b32 (rows g, g+8 at k pairs
    2t and 2t+8), b: 2 b32 (k pairs 2t, 2t+8 of column g), c: (g, 2t), (g, 2t+1), (g+8, 2t),
    (g+8, 2t+1)."""
    ins = [Int32(v).ir_value(loc=loc, ip=ip) for v in (*a, *b)]
    ins += [Float32(v).ir_value(loc=loc, ip=ip) for v in c]
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
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


class TcPipeGemm(RowBlockGemm):
    def __init__(self, cfg: TcPipeConfig) -> None:
        self.cfg = cfg
        self.m = cfg.m
        self.rows = cfg.rows
        self.row_warps = cfg.row_warps
        self.k_warps = cfg.k_warps
        self.threads = 32 * cfg.warps
        self.bk = cfg.bk
        self.cpr = cfg.bk // VEC  # 16-byte chunks per tile row
        self.row_bytes = cfg.bk * 2
        self.stages = cfg.stages
        self.stage_bytes = cfg.stage_bytes
        self.x_off = cfg.rows * cfg.bk * 2  # x tile after the weight tile in each slot
        self.splits = cfg.splits
        self.groups = cfg.warp_rows // 16  # 16-row MMA groups per warp
        self.n_tiles = cfg.m // 8  # 8-token MMA columns
        self.kg_per_warp = cfg.bk // 32 // cfg.k_warps
        self.smem_bytes = cfg.smem_bytes
        self.residual = cfg.residual
        self.pdl = cfg.pdl

    @cute.jit
    def load_tile(self, base, gbase, k, row0, nrows_valid, total, tile, slot, tidx):
        """Issue cp.async for `total` rows (clamped to nrows_valid - 1) x bk of one k tile."""
        chunks = total * self.cpr
        for c in cutlass.range_constexpr((chunks + self.threads - 1) // self.threads):
            idx = c * self.threads + tidx
            r = idx // self.cpr
            ch = idx % self.cpr
            row = cutlass.min(row0 + r, nrows_valid - 1)
            kk = tile * self.bk + ch * VEC
            nbytes = cutlass.max(cutlass.min((k - kk) * 2, 16), 0)
            kc = cutlass.min(kk, k - VEC)
            gaddr = gbase + Int64(row * k + kc) * 2
            swz = (ch ^ ((r & 1) * 4)) * 16  # chunk ^ 4 on odd rows
            saddr = base + slot * self.stage_bytes + r * self.row_bytes + swz
            if const_expr(chunks % self.threads == 0):
                cp_async_cg16(saddr, gaddr, nbytes)
            else:
                if idx < chunks:
                    cp_async_cg16(saddr, gaddr, nbytes)

    @cute.jit
    def load_tile_fast(self, sdst, gthread, rstride, soff, rfirst, total, tile):
        """load_tile for a full k tile with every row in range: the thread's chunk column is fixed
        (threads % chunks-per-row == 0), so each chunk is one 64-bit add and one cp.async."""
        chunks = total * self.cpr
        rstep = self.threads // self.cpr
        g = gthread + Int64(tile * self.row_bytes)
        for c in cutlass.range_constexpr((chunks + self.threads - 1) // self.threads):
            saddr = sdst + soff[(c * rstep) % 2] + c * rstep * self.row_bytes
            if const_expr((c + 1) * self.threads <= chunks):
                cp_async_cg16(saddr, g, 16)
            else:
                if rfirst + c * rstep < total:
                    cp_async_cg16(saddr, g, 16)
            g = g + rstride

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mR: cute.Tensor) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        bidx, crank, _ = cute.arch.block_idx()  # crank: this CTA's K slice within the cluster
        lane = tidx % 32
        warp = tidx // 32
        wrow = warp // self.k_warps
        wk = warp % self.k_warps
        g = lane // 4  # fragment row (and token) group
        t = lane % 4  # fragment k pair -> real k 8t..8t+7 of each 32-k group
        n = mW.shape[0]
        k = mW.shape[1]

        smem = cutlass.memory.SmemAllocator()
        buf = smem.allocate(self.smem_bytes, 128)
        sbase = buf.toint()
        wbase = mW.iterator.toint()
        xbase = mX.iterator.toint()

        ktiles = cute.ceil_div(k, self.bk)
        per = cute.ceil_div(ktiles, self.splits)
        t0 = crank * per
        nt = cutlass.max(cutlass.min(ktiles - t0, per), 0)
        row0 = bidx * self.rows

        # fast-path loads: thread tidx always owns chunk column tidx % cpr of rows
        # tidx // cpr + c * rstep; the swizzle then only depends on the parity of c * rstep
        rfirst = tidx // self.cpr
        ch0 = tidx % self.cpr
        rstride = Int64(self.threads // self.cpr) * k * 2
        gw = wbase + (Int64(row0 + rfirst) * k + ch0 * VEC) * 2
        gx = xbase + (Int64(rfirst) * k + ch0 * VEC) * 2
        soff = [
            rfirst * self.row_bytes + (ch0 ^ ((rfirst & 1) * 4)) * 16,
            rfirst * self.row_bytes + (ch0 ^ (((rfirst + 1) & 1) * 4)) * 16,
        ]
        wfull = row0 + self.rows <= n  # every weight row of this CTA exists

        # fragment byte offsets inside one slot (the swizzle only depends on g & 1)
        sw = (g & 1) * 4
        col_off = []
        for u in cutlass.range_constexpr(self.kg_per_warp):
            col_off.append((((u * self.k_warps + wk) * 4 + t) ^ sw) * 16)
        wrow_off = (wrow * (self.rows // self.row_warps) + g) * self.row_bytes
        x_row_off = self.x_off + g * self.row_bytes

        acc = cute.make_rmem_tensor((4, self.n_tiles, self.groups), Float32)
        acc.fill(0.0)

        # prologue: weights first (independent of the previous kernel), then x after the wait
        for s in cutlass.range_constexpr(self.stages - 1):
            if s < nt:
                self.load_tile(sbase, wbase, k, row0, n, self.rows, t0 + s, s, tidx)
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
        for s in cutlass.range_constexpr(self.stages - 1):
            if s < nt:
                self.load_tile(sbase + self.x_off, xbase, k, 0, self.m, self.m, t0 + s, s, tidx)
            cute.arch.cp_async_commit_group()
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()

        for i in cutlass.range(nt):
            cute.arch.cp_async_wait_group(self.stages - 2)
            cute.arch.sync_threads()
            j = i + self.stages - 1
            if j < nt:
                nslot = j % self.stages
                tj = t0 + j
                sdst = sbase + nslot * self.stage_bytes
                if wfull and (tj + 1) * self.bk <= k:
                    self.load_tile_fast(sdst, gw, rstride, soff, rfirst, self.rows, tj)
                    self.load_tile_fast(sdst + self.x_off, gx, rstride, soff, rfirst, self.m, tj)
                else:
                    self.load_tile(sbase, wbase, k, row0, n, self.rows, tj, nslot, tidx)
                    self.load_tile(sbase + self.x_off, xbase, k, 0, self.m, self.m, tj, nslot, tidx)
            cute.arch.cp_async_commit_group()
            slot_base = sbase + (i % self.stages) * self.stage_bytes
            for u in cutlass.range_constexpr(self.kg_per_warp):
                a_lo = []
                a_hi = []
                for q in cutlass.range_constexpr(self.groups):
                    ra = slot_base + wrow_off + q * 16 * self.row_bytes + col_off[u]
                    a_lo.append(ld_shared_v4(ra))
                    a_hi.append(ld_shared_v4(ra + 8 * self.row_bytes))
                bx = []
                for jt in cutlass.range_constexpr(self.n_tiles):
                    rb = slot_base + x_row_off + jt * 8 * self.row_bytes + col_off[u]
                    bx.append(ld_shared_v4(rb))
                # both k halves of a 32-k group hit the same accumulators: h outermost keeps
                # groups x n_tiles independent MMAs between two that chain
                for h in cutlass.range_constexpr(2):
                    for jt in cutlass.range_constexpr(self.n_tiles):
                        for q in cutlass.range_constexpr(self.groups):
                            d = mma_16816(
                                (a_lo[q][2 * h], a_hi[q][2 * h], a_lo[q][2 * h + 1],
                                 a_hi[q][2 * h + 1]),
                                (bx[jt][2 * h], bx[jt][2 * h + 1]),
                                (acc[0, jt, q], acc[1, jt, q], acc[2, jt, q], acc[3, jt, q]),
                            )  # fmt: skip
                            for e in cutlass.range_constexpr(4):
                                acc[e, jt, q] = d[e]

        # partials of every k-warp: sRed[row, token, k-warp] (the ring is free once drained)
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        sRed = cute.make_tensor(
            cute.recast_ptr(buf, dtype=Float32),
            cute.make_layout((self.rows, self.m, self.k_warps)),
        )
        for q in cutlass.range_constexpr(self.groups):
            r = wrow * (self.rows // self.row_warps) + q * 16 + g
            for jt in cutlass.range_constexpr(self.n_tiles):
                tok = jt * 8 + 2 * t
                sRed[r, tok, wk] = acc[0, jt, q]
                sRed[r, tok + 1, wk] = acc[1, jt, q]
                sRed[r + 8, tok, wk] = acc[2, jt, q]
                sRed[r + 8, tok + 1, wk] = acc[3, jt, q]
        if const_expr(self.splits > 1):
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()

        # each CTA of the cluster finalises 1/splits of the CTA's outputs, 4 rows per thread
        quads = self.rows // 4 * self.m
        per_cta = quads // self.splits
        for o in cutlass.range_constexpr((per_cta + self.threads - 1) // self.threads):
            qi = o * self.threads + tidx
            if qi < per_cta:
                gq = crank * per_cta + qi
                tok = gq // (self.rows // 4)
                r4 = (gq % (self.rows // 4)) * 4
                tot = [Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0)]
                for w in cutlass.range_constexpr(self.k_warps):
                    off = sbase + ((w * self.m + tok) * self.rows + r4) * 4
                    for c in cutlass.range_constexpr(self.splits):
                        if const_expr(self.splits > 1):
                            v = ld_cluster_v4f32(off, c)
                        else:
                            v = ld_shared_v4f32(off)
                        for e in cutlass.range_constexpr(4):
                            tot[e] = tot[e] + v[e]
                for e in cutlass.range_constexpr(4):
                    row = row0 + r4 + e
                    if row < n:
                        val = tot[e]
                        if const_expr(self.residual):
                            val = val + mR[tok, row].to(Float32)
                        mY[tok, row] = val.to(BFloat16)
        if const_expr(self.splits > 1):
            # no CTA may exit while a peer still reads its shared memory
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
