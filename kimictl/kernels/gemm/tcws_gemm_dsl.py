# The DSL traces this body: shapes and elements are DSL values mypy cannot type.
# mypy: disable-error-code="index,operator,union-attr,arg-type,call-arg,attr-defined"
"""The CuTe DSL body of the warp-specialised tensor-core GEMM (design in tcws_gemm.py).

Imports cutlass at the top (the DSL rewrites kernel source against this module's globals), so
only the build step imports it. The fragment code is tcpipe's (its PTX helpers are reused);
mbarriers are inline PTX on 32-bit shared addresses like the rest of the shared-memory traffic.
"""

# No `from __future__ import annotations` here: the DSL reads the annotations (cuda.CUstream).
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from kimictl.kernels.gemm.rowblock_dsl import RowBlockGemm
from kimictl.kernels.gemm.tcpipe_gemm_dsl import (
    cp_async_cg16,
    ld_shared_v4,
    ld_shared_v4f32,
    mma_16816,
)
from kimictl.kernels.gemm.tcws_gemm import BAR_BYTES, VEC, TcWsConfig

__all__ = ["TcWsGemm"]


def _asm(text, cons, args, loc, ip):
    llvm.inline_asm(
        None,
        [a.ir_value(loc=loc, ip=ip) for a in args],
        text,
        cons,
        has_side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def mbar_init(saddr, count, *, loc=None, ip=None):
    _asm("mbarrier.init.shared::cta.b64 [$0], $1;", "r,r", [Int32(saddr), Int32(count)], loc, ip)


@dsl_user_op
def mbar_wait(saddr, parity, *, loc=None, ip=None):
    """Spin until the phase of parity `parity` has completed (labels are local to the braces)."""
    _asm(
        "{ .reg .pred p; WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1; "
        "@!p bra WAIT; }",
        "r,r",
        [Int32(saddr), Int32(parity)],
        loc,
        ip,
    )


@dsl_user_op
def mbar_arrive(saddr, *, loc=None, ip=None):
    _asm(
        "{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [$0]; }", "r", [Int32(saddr)], loc, ip
    )


@dsl_user_op
def cp_async_arrive(saddr, *, loc=None, ip=None):
    """Arrive on the mbarrier once every earlier cp.async of this thread has landed."""
    _asm("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [$0];", "r", [Int32(saddr)], loc, ip)


@dsl_user_op
def st_shared_f32(saddr, val, *, loc=None, ip=None):
    _asm("st.shared.f32 [$0], $1;", "r,f", [Int32(saddr), Float32(val)], loc, ip)


class TcWsGemm(RowBlockGemm):
    def __init__(self, cfg: TcWsConfig) -> None:
        self.cfg = cfg
        self.m = cfg.m
        self.mt = cfg.mt
        self.rows = cfg.rows
        self.k_warps = cfg.k_warps
        self.w_warps = cfg.w_warps
        self.x_warps = cfg.x_warps
        self.threads = 32 * cfg.warps
        self.producers = 32 * (cfg.w_warps + cfg.x_warps)
        self.bk = cfg.bk
        self.cpr = cfg.bk // VEC  # 16-byte chunks per tile row
        self.row_bytes = cfg.bk * 2
        self.stages = cfg.stages
        self.stage_bytes = cfg.stage_bytes
        self.x_off = cfg.rows * cfg.bk * 2
        self.bar_off = cfg.stages * cfg.stage_bytes
        self.red_off = self.bar_off + BAR_BYTES
        self.smem_bytes = cfg.smem_bytes
        self.groups = cfg.rows // 16
        self.n_tiles = cfg.mt // 8
        self.kg_per_warp = cfg.bk // 32 // cfg.k_warps
        self.late = cfg.late
        self.pdl = cfg.pdl
        self.splits = 1

    @cute.jit
    def produce(self, sbase, gbase, k, row0, nvalid, nrows, soff, nthr, ptid, nt):
        """One producer role: `nthr` threads copy `nrows` rows x bk of every k tile into the ring
        at byte offset `soff` of each slot, rows clamped to nvalid - 1, k past K zero-filled."""
        chunks = nrows * self.cpr
        per = (chunks + nthr - 1) // nthr
        rowaddr = []
        lchunk = []
        sdst = []
        for c in cutlass.range_constexpr(per):
            idx = c * nthr + ptid
            r = cutlass.min(idx // self.cpr, nrows - 1)
            ch = idx % self.cpr
            row = cutlass.min(row0 + r, nvalid - 1)
            rowaddr.append(gbase + Int64(row) * k * 2)
            lchunk.append(ch * VEC)
            sdst.append(soff + r * self.row_bytes + (ch ^ ((r & 1) * 4)) * 16)
        for i in cutlass.range(nt):
            slot = i % self.stages
            rnd = i // self.stages
            bar = sbase + self.bar_off + slot * 16
            mbar_wait(bar + 8, (rnd & 1) ^ 1)  # empty: the compute warps are done with it
            slot_base = sbase + slot * self.stage_bytes
            for c in cutlass.range_constexpr(per):
                kk = i * self.bk + lchunk[c]
                nbytes = cutlass.max(cutlass.min((k - kk) * 2, 16), 0)
                kc = cutlass.min(kk, k - VEC)
                if const_expr(chunks % nthr == 0):
                    cp_async_cg16(slot_base + sdst[c], rowaddr[c] + Int64(kc) * 2, nbytes)
                else:
                    if c * nthr + ptid < chunks:
                        cp_async_cg16(slot_base + sdst[c], rowaddr[c] + Int64(kc) * 2, nbytes)
            cp_async_arrive(bar)  # full

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mR: cute.Tensor) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        warp = tidx // 32
        n = mW.shape[0]
        k = mW.shape[1]

        smem = cutlass.memory.SmemAllocator()
        buf = smem.allocate(self.smem_bytes, 128)
        sbase = buf.toint()
        nt = cute.ceil_div(k, self.bk)
        row0 = bidx * self.rows

        if tidx == 0:
            for s in cutlass.range_constexpr(self.stages):
                mbar_init(sbase + self.bar_off + s * 16, self.producers)
                mbar_init(sbase + self.bar_off + s * 16 + 8, 32 * self.k_warps)
        cute.arch.sync_threads()
        if const_expr(self.pdl and not self.late):
            cute.arch.griddepcontrol_launch_dependents()

        kw_threads = 32 * self.k_warps
        w_threads = 32 * self.w_warps
        if warp >= self.k_warps:
            ptid = tidx - kw_threads
            if ptid < w_threads:
                # weights do not depend on the previous kernel: no grid dependency wait
                self.produce(
                    sbase, mW.iterator.toint(), k, row0, n, self.rows, 0, w_threads, ptid, nt
                )
            else:
                if const_expr(self.pdl):
                    cute.arch.griddepcontrol_wait()
                self.produce(
                    sbase, mX.iterator.toint(), k, 0, self.m, self.mt, self.x_off,
                    32 * self.x_warps, ptid - w_threads, nt,
                )  # fmt: skip
        else:
            wk = warp
            g = lane // 4
            t = lane % 4
            sw = (g & 1) * 4
            col_off = []
            for u in cutlass.range_constexpr(self.kg_per_warp):
                col_off.append((((u * self.k_warps + wk) * 4 + t) ^ sw) * 16)
            wrow_off = g * self.row_bytes
            x_row_off = self.x_off + g * self.row_bytes
            acc = cute.make_rmem_tensor((4, self.n_tiles, self.groups), Float32)
            acc.fill(0.0)
            for i in cutlass.range(nt):
                slot = i % self.stages
                rnd = i // self.stages
                bar = sbase + self.bar_off + slot * 16
                mbar_wait(bar, rnd & 1)  # full
                slot_base = sbase + slot * self.stage_bytes
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
                mbar_arrive(bar + 8)  # empty (release: the ld.shared above come first)
            # partials: red[k-warp, token, row] fp32, the layout the final reduction reads
            red = sbase + self.red_off
            for q in cutlass.range_constexpr(self.groups):
                r = q * 16 + g
                for jt in cutlass.range_constexpr(self.n_tiles):
                    tok = jt * 8 + 2 * t
                    for e in cutlass.range_constexpr(4):
                        rr = r + (e // 2) * 8
                        tt = tok + e % 2
                        st_shared_f32(
                            red + ((wk * self.mt + tt) * self.rows + rr) * 4, acc[e, jt, q]
                        )
        cute.arch.sync_threads()

        # every thread finalises 4 rows x 1 token at a time
        quads = self.rows // 4 * self.m
        for o in cutlass.range_constexpr((quads + self.threads - 1) // self.threads):
            qi = o * self.threads + tidx
            if qi < quads:
                tok = qi // (self.rows // 4)
                r4 = (qi % (self.rows // 4)) * 4
                tot = [Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0)]
                for w in cutlass.range_constexpr(self.k_warps):
                    v = ld_shared_v4f32(
                        sbase + self.red_off + ((w * self.mt + tok) * self.rows + r4) * 4
                    )
                    for e in cutlass.range_constexpr(4):
                        tot[e] = tot[e] + v[e]
                for e in cutlass.range_constexpr(4):
                    row = row0 + r4 + e
                    if row < n:
                        mY[tok, row] = tot[e].to(BFloat16)
        if const_expr(self.pdl and self.late):
            cute.arch.griddepcontrol_launch_dependents()
