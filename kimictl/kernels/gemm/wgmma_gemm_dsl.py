# The DSL traces this body: shapes and elements are DSL values mypy cannot type.
# mypy: disable-error-code="index,operator,union-attr,arg-type,call-arg,attr-defined"
# mypy: disable-error-code="misc,type-arg,valid-type"
"""The CuTe DSL body of the Hopper wgmma weight-streaming GEMM (design in wgmma_gemm.py).

Imports cutlass at the top (the DSL rewrites kernel source against this module's globals), so
only the build step imports it.
"""

# No `from __future__ import annotations` here: the DSL reads the annotations (cuda.CUstream).
import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32, Int64, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.utils import LayoutEnum

from kimictl.kernels.gemm.rowblock_dsl import RowBlockGemm
from kimictl.kernels.gemm.wgmma_gemm import WgmmaConfig

__all__ = ["WgmmaGemm", "load_peer_f32x4"]


@dsl_user_op
def load_peer_f32x4(smem_ptr, cta_rank, *, loc=None, ip=None):
    """Four fp32 (16 bytes, 16-byte aligned) at the same shared-memory offset in CTA `cta_rank`
    of this cluster. Volatile, so it stays after the cluster barrier that published them."""
    addr = llvm.ptrtoint(T.i32(), smem_ptr.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip)
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32(), T.f32(), T.f32(), T.f32()]),
        [addr, Int32(cta_rank).ir_value(loc=loc, ip=ip)],
        "{ .reg .b32 ra; mapa.shared::cluster.u32 ra, $4, $5; "
        "ld.shared::cluster.v4.f32 {$0, $1, $2, $3}, [ra]; }",
        "=f,=f,=f,=f,r,r",
        has_side_effects=True,
        loc=loc,
        ip=ip,
    )
    return tuple(Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def evict_first_policy(*, loc=None, ip=None):
    """An L2 cache policy (createpolicy) that marks lines evict-first: each weight byte is read
    exactly once, so it should not push x (re-read by every CTA) out of L2."""
    res = llvm.inline_asm(
        T.i64(),
        [],
        "createpolicy.fractional.L2::evict_first.b64 $0, 1.0;",
        "=l",
        has_side_effects=False,
        loc=loc,
        ip=ip,
    )
    return Int64(res)


class WgmmaGemm(RowBlockGemm):
    def __init__(self, cfg: WgmmaConfig) -> None:
        self.m = cfg.m
        self.mn = cfg.mma_tokens  # x tile / accumulator tokens (>= m)
        self.xa = cfg.wn > 0  # x is wgmma's A operand
        self.early_trigger = cfg.early_trigger
        self.wgs = cfg.wgs
        self.rows = cfg.rows
        self.bk = cfg.bk
        self.stages = cfg.stages
        self.splits = cfg.splits
        self.threads = cfg.threads
        self.mma_threads = cfg.mma_threads
        self.ws = cfg.ws
        self.pw = cfg.mma_threads // 32  # the producer warp with ws (else warp 0 produces)
        self.residual = cfg.residual
        self.pdl = cfg.pdl
        self.tx_bytes = cfg.stage_bytes
        self.evict_first = cfg.evict_first

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mY: cute.Tensor,
        mR: cute.Tensor,
        stream: cuda.CUstream,
    ) -> None:
        if const_expr(self.xa):
            # tokens = A (64 x bk), weights = B (wn x bk), both K-major
            tile = (self.mn, self.rows, self.bk)
            tiler_mn = (64, self.rows)
        else:
            # weights = A (rows x bk, K-major), tokens = B (mn x bk, K-major)
            tile = (self.rows, self.mn, self.bk)
            tiler_mn = (64, self.mn)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            BFloat16,
            BFloat16,
            warpgroup.OperandMajorMode.K,
            warpgroup.OperandMajorMode.K,
            Float32,
            (self.wgs, 1, 1),
            tiler_mn=tiler_mn,
        )
        a_staged = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tile, BFloat16, self.stages)
        b_staged = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tile, BFloat16, self.stages)
        w_staged, x_staged = (b_staged, a_staged) if const_expr(self.xa) else (a_staged, b_staged)
        if const_expr(self.m == 1):
            # a static size-1 row mode would be dropped from the TMA (a 1-d copy of 8 x 64
            # elements, an illegal instruction on the H200): give x a runtime row count of 1
            kx = mX.shape[1]
            one = cutlass.min(kx, 1)
            mX = cute.make_tensor(mX.iterator, cute.make_layout((one, kx), stride=(kx, 1)))
        # descriptors from the runtime tensors: N and K stay dynamic. x's box has mn >= m rows:
        # TMA zero-fills the rows past the tensor's m (and still counts the full box's bytes).
        tma_w, tW = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(),
            mW,
            cute.slice_(w_staged, (None, None, 0)),
            (self.rows, self.bk),
        )
        tma_x, tX = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(),
            mX,
            cute.slice_(x_staged, (None, None, 0)),
            (self.mn, self.bk),
        )

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[Int64, self.stages * 2]
            sW: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(w_staged)], 1024]
            sX: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(x_staged)], 1024]

        self.storage = Storage
        kern = self.kernel(tma_w, tW, tma_x, tX, mY, mR, tiled_mma, w_staged, x_staged)
        self.launch_rows(kern, mW.shape[0], stream)

    @cute.kernel
    def kernel(
        self,
        tma_w: cute.CopyAtom,
        tW: cute.Tensor,
        tma_x: cute.CopyAtom,
        tX: cute.Tensor,
        mY: cute.Tensor,
        mR: cute.Tensor,
        tiled_mma: cute.TiledMma,
        w_staged: cute.ComposedLayout,
        x_staged: cute.ComposedLayout,
    ) -> None:
        if const_expr(self.early_trigger):
            # PDL: the next grid may launch now; its wait still waits for this grid to finish
            cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, crank, _ = cute.arch.block_idx()  # crank: this CTA's K slice within the cluster
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        n = mY.shape[1]
        if warp == 0:
            cpasync.prefetch_descriptor(tma_w)
            cpasync.prefetch_descriptor(tma_x)

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.storage)
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.bars.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.mma_threads // 32),
            tx_count=self.tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        )
        sW = storage.sW.get_tensor(w_staged.outer, swizzle=w_staged.inner)
        sX = storage.sX.get_tensor(x_staged.outer, swizzle=x_staged.inner)
        # partial tile, row-contiguous per token: sRed[row, token] at row + rows * token. It
        # reuses the weight ring, which is idle once every stage has been consumed.
        red_ptr = cute.recast_ptr(storage.sW.data_ptr(), dtype=Float32)
        sRed = cute.make_tensor(
            red_ptr, cute.make_layout((self.rows, self.mn), stride=(1, self.rows))
        )
        # the same memory as the MMA's C: (rows, tokens) swapped, (tokens, rows) with x as A
        sC = sRed
        if const_expr(self.xa):
            sC = cute.make_tensor(
                red_ptr, cute.make_layout((self.mn, self.rows), stride=(self.rows, 1))
            )

        # (rows, bk, k tiles) of this CTA's row block; (m, bk, k tiles) of x
        gW = cute.local_tile(tW, (self.rows, self.bk), (bidx, None))
        gX = cute.local_tile(tX, (self.mn, self.bk), (0, None))
        tAsA, tAgA = cpasync.tma_partition(
            tma_w, 0, cute.make_layout(1), cute.group_modes(sW, 0, 2), cute.group_modes(gW, 0, 2)
        )
        tBsB, tBgB = cpasync.tma_partition(
            tma_x, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2), cute.group_modes(gX, 0, 2)
        )

        # the producer warp (ws) partitions like the last warpgroup and never issues wgmma
        wg = cute.arch.make_warp_uniform(cutlass.min(tidx // 128, self.wgs - 1))
        thr_mma = tiled_mma.get_slice(wg * 128)
        sA, sB = (sX, sW) if const_expr(self.xa) else (sW, sX)
        tCsA = thr_mma.partition_A(sA)
        tCsB = thr_mma.partition_B(sB)
        tCrA = tiled_mma.make_fragment_A(tCsA)
        tCrB = tiled_mma.make_fragment_B(tCsB)
        # the accumulator fragment is per thread (A/B descriptors are per warpgroup)
        tCsC = tiled_mma.get_slice(cutlass.min(tidx, self.mma_threads - 1)).partition_C(sC)
        acc = cute.make_rmem_tensor(tCsC.shape, Float32)
        acc.fill(0.0)
        k_blocks = cute.size(tCrA, mode=[2])

        # this CTA's contiguous range of k tiles
        k_tiles = cute.size(gW, mode=[2])
        per = (k_tiles + self.splits - 1) // self.splits
        k0 = crank * per
        kcnt = cutlass.max(cutlass.min(per, k_tiles - k0), 0)
        npre = cutlass.min(kcnt, self.stages)

        pol = None
        if const_expr(self.evict_first):
            pol = evict_first_policy()
        prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        pwarp = self.pw if const_expr(self.ws) else 0
        # 1) PDL: the first stages' weights stream before the grid dependency wait
        if warp == pwarp:
            for _ in cutlass.range(npre, unroll=1):
                pipe.producer_acquire(prod)
                cute.copy(
                    tma_w,
                    tAgA[(None, k0 + prod.count)],
                    tAsA[(None, prod.index)],
                    tma_bar_ptr=pipe.producer_get_barrier(prod),
                    cache_policy=pol,
                )
                prod.advance()
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
            if const_expr(not self.early_trigger):
                cute.arch.griddepcontrol_launch_dependents()
        # 2) the same stages' x tiles (their barriers already expect both)
        if warp == pwarp:
            xs = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            for _ in cutlass.range(npre, unroll=1):
                cute.copy(
                    tma_x,
                    tBgB[(None, k0 + xs.count)],
                    tBsB[(None, xs.index)],
                    tma_bar_ptr=pipe.producer_get_barrier(xs),
                )
                xs.advance()

        cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        if const_expr(self.ws):
            # 3ws) the producer warp refills each stage as soon as the MMA warps release it; the
            # MMA warps keep one wgmma group in flight: stage s's MMAs run while they wait for
            # stage s + 1, and stage s - 1 is released once wait_group(1) says it is read
            if warp == self.pw:
                for _ in cutlass.range(kcnt - npre, unroll=1):
                    pipe.producer_acquire(prod)
                    bar = pipe.producer_get_barrier(prod)
                    cute.copy(
                        tma_w, tAgA[(None, k0 + prod.count)], tAsA[(None, prod.index)],
                        tma_bar_ptr=bar, cache_policy=pol,
                    )  # fmt: skip
                    cute.copy(
                        tma_x, tBgB[(None, k0 + prod.count)], tBsB[(None, prod.index)],
                        tma_bar_ptr=bar,
                    )  # fmt: skip
                    prod.advance()
            else:
                rel = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
                for i in cutlass.range(kcnt, unroll=1):
                    pipe.consumer_wait(cons)
                    warpgroup.fence()
                    for kb in cutlass.range_constexpr(k_blocks):
                        cute.gemm(
                            tiled_mma,
                            acc,
                            tCrA[(None, None, kb, cons.index)],
                            tCrB[(None, None, kb, cons.index)],
                            acc,
                        )
                    warpgroup.commit_group()
                    warpgroup.wait_group(1)
                    if i > 0:
                        pipe.consumer_release(rel)
                        rel.advance()
                    cons.advance()
                warpgroup.wait_group(0)
        # 3) mainloop: wait a stage, 64 x m x bk of MMAs per warpgroup, release it, refill it
        if const_expr(not self.ws):
            for _ in cutlass.range(kcnt, unroll=1):
                pipe.consumer_wait(cons)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(k_blocks):
                    cute.gemm(
                        tiled_mma,
                        acc,
                        tCrA[(None, None, kb, cons.index)],
                        tCrB[(None, None, kb, cons.index)],
                        acc,
                    )
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                pipe.consumer_release(cons)
                cons.advance()
                if warp == 0:
                    if prod.count < kcnt:
                        pipe.producer_acquire(prod)
                        bar = pipe.producer_get_barrier(prod)
                        cute.copy(
                            tma_w, tAgA[(None, k0 + prod.count)], tAsA[(None, prod.index)],
                            tma_bar_ptr=bar, cache_policy=pol,
                        )  # fmt: skip
                        cute.copy(
                            tma_x, tBgB[(None, k0 + prod.count)], tBsB[(None, prod.index)],
                            tma_bar_ptr=bar,
                        )  # fmt: skip
                        prod.advance()

        # 4) partial tile to shared memory (once no warpgroup reads the ring any more), then
        # reduce over the cluster's K slices
        cute.arch.sync_threads()
        if const_expr(self.ws):
            if tidx < self.mma_threads:
                cute.autovec_copy(acc, tCsC)
        else:
            cute.autovec_copy(acc, tCsC)
        if const_expr(self.splits > 1):
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()
        quads = self.rows // 4  # 4-row chunks per token
        per_cta = (quads * self.m) // self.splits  # chunks this CTA finalises
        trips = (per_cta + self.threads - 1) // self.threads
        out = cute.make_rmem_tensor((4, trips), Float32)
        # every load (peer partials, residual) first, then every store: y may alias r
        for o in cutlass.range_constexpr(trips):
            i = o * self.threads + tidx
            if i < per_cta:
                c = crank * per_cta + i
                tok = c // quads
                r = (c % quads) * 4
                if const_expr(self.splits > 1):
                    for j in cutlass.range_constexpr(4):
                        out[j, o] = Float32(0.0)
                    for peer in cutlass.range_constexpr(self.splits):
                        p = load_peer_f32x4(sRed.iterator + (r + self.rows * tok), peer)
                        for j in cutlass.range_constexpr(4):
                            out[j, o] = out[j, o] + p[j]
                else:
                    for j in cutlass.range_constexpr(4):
                        out[j, o] = sRed[r + j, tok]
                if const_expr(self.residual):
                    row = bidx * self.rows + r
                    for j in cutlass.range_constexpr(4):
                        if row + j < n:
                            out[j, o] = out[j, o] + mR[tok, row + j].to(Float32)
        for o in cutlass.range_constexpr(trips):
            i = o * self.threads + tidx
            if i < per_cta:
                c = crank * per_cta + i
                tok = c // quads
                row = bidx * self.rows + (c % quads) * 4
                for j in cutlass.range_constexpr(4):
                    if row + j < n:
                        mY[tok, row + j] = out[j, o].to(BFloat16)
        if const_expr(self.splits > 1):
            # no CTA may exit while a peer still reads its shared memory
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
