# The DSL traces this body: shapes and elements are DSL values mypy cannot type.
# mypy: disable-error-code="index,operator,union-attr,attr-defined,arg-type,call-arg,assignment"
"""The CuTe DSL body of the persistent layer segments (see chain.py for the design and ABI).

The loads, norms, gate and SiTU * mul reuse layer_elem's per-row helpers with 512 threads, writing
into shared memory instead of global, and its launch (grid `ctas`). Activations another CTA wrote
in this launch are read with ld.global.cg (L2, never a stale L1 line); weights with L1
no-allocate, as in wstream.
"""

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, const_expr

from kimictl.kernels.layer.chain import (
    COUNTER,
    GROUP,
    THREADS,
    LayerChainConfig,
    arrive_add,
)
from kimictl.kernels.layer.elem_dsl import VEC, LayerElem

__all__ = ["LayerChain"]

GROUPS = THREADS // GROUP
WARPS_PER_GROUP = GROUP // 32


class LayerChain(LayerElem):
    def __init__(self, cfg: LayerChainConfig) -> None:
        self.cfg = cfg
        self.m = cfg.m
        self.threads = THREADS  # LayerElem's helpers split a row over every thread
        self.pdl = cfg.pdl
        self.ctas = cfg.ctas  # LayerElem's launch: a persistent grid
        self.stages = cfg.stages
        self.sizes = cfg.sizes
        self.kmax = max(s.k for s in self.stages)
        self.slot = cfg.slot

    @cute.jit
    def _inputs(self, i: cutlass.Constexpr, bufs: dict, gW: cute.Tensor, sXv: cute.Tensor,
                gY: cute.Tensor, sRed: cute.Tensor, cnt: cute.Pointer, old: Int32,
                tidx: cutlass.Int32, bidx: cutlass.Int32) -> None:  # fmt: skip
        """Wait for stage i's inputs, then build its x, every token row, in shared memory (row
        stride kmax). The norm weight is a weight, so it is loaded before the wait; every token
        row's loads are issued before any is used, and one CTA barrier serves all the rows'
        norms (one load round trip and one barrier per stage, not per token)."""
        st = self.stages[i]
        atom_cg = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), BFloat16, num_bits_per_copy=128,
                                      load_cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL)  # fmt: skip
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        src, base, ld = st.src
        src2, base2, ld2 = st.src2
        width = st.width if const_expr(st.pro == "rmssitu") else st.k
        nv, per = self._vectors(width)
        half = st.k - width  # rmssitu: the SiTU * mul columns after the normed ones
        _, per_s = self._vectors(half if const_expr(half > 0) else VEC)
        fw = cute.make_rmem_tensor((VEC, per), BFloat16)
        if const_expr(st.pro in ("addrms", "rms", "rmssitu")):
            self._load_row(gW, 0, st.g_off, width, fw, tidx, True)
        self._wait(i, cnt, old, tidx)
        fx = cute.make_rmem_tensor((VEC, per, self.m), BFloat16)
        f2 = cute.make_rmem_tensor((VEC, per, self.m), BFloat16)  # addrms: r; gate: the gate
        fg = cute.make_rmem_tensor((VEC, per_s, self.m), BFloat16)  # rmssitu: g and u
        fu = cute.make_rmem_tensor((VEC, per_s, self.m), BFloat16)
        for m in cutlass.range_constexpr(self.m):
            self._load_row(bufs[src], 0, base + m * ld, width, fx[None, None, m], tidx, True,
                           atom_cg)  # fmt: skip
            if const_expr(st.pro in ("addrms", "gate")):
                self._load_row(bufs[src2], 0, base2 + m * ld2, width, f2[None, None, m], tidx,
                               True, atom_cg)  # fmt: skip
            if const_expr(st.pro == "rmssitu"):
                self._load_row(bufs[src2], 0, base2 + m * ld2, half, fg[None, None, m], tidx,
                               True, atom_cg)  # fmt: skip
                self._load_row(bufs[src2], 0, base2 + m * ld2 + half, half, fu[None, None, m],
                               tidx, True, atom_cg)  # fmt: skip
        if const_expr(st.pro == "addrms"):  # new residual = bf16(h + r), what is normed
            for m in cutlass.range_constexpr(self.m):
                for j in cutlass.range_constexpr(per):
                    x32 = fx[None, j, m].load().to(Float32)
                    r32 = f2[None, j, m].load().to(Float32)
                    for e in cutlass.range_constexpr(VEC):
                        fx[e, j, m] = (x32[e] + r32[e]).to(BFloat16)
                    v = j * self.threads + tidx
                    if bidx == 0 and v < nv:
                        out = st.res_out // VEC + m * (width // VEC) + v
                        cute.copy(atom, fx[None, j, m], gY[(None, out)])
        if const_expr(st.pro in ("addrms", "rms", "rmssitu")):
            self._norm_rows(fx, fw, sXv, width, sRed, tidx)
        for m in cutlass.range_constexpr(self.m):
            if const_expr(st.pro == "rmssitu"):
                self._act_store(fu[None, None, m], fg[None, None, m], sXv, half,
                                m * self.kmax + width, tidx, "situ")  # fmt: skip
            elif const_expr(st.pro == "gate"):  # a * sigmoid(gate)
                self._act_store(fx[None, None, m], f2[None, None, m], sXv, width,
                                m * self.kmax, tidx, "gate")  # fmt: skip
            elif const_expr(st.pro == "plain"):
                for j in cutlass.range_constexpr(per):
                    v = j * self.threads + tidx
                    if v < nv:
                        cute.copy(atom, fx[None, j, m], sXv[(None, m * (self.kmax // VEC) + v)])
        cute.arch.sync_threads()

    @cute.jit
    def _norm_rows(self, fx: cute.Tensor, fw: cute.Tensor, sXv: cute.Tensor,
                   width: cutlass.Constexpr, sRed: cute.Tensor,
                   tidx: cutlass.Int32) -> None:  # fmt: skip
        """x[m] = norm(fx[:, :, m]) * fw into shared memory (row m at m * kmax), every token
        row's sum of squares through one CTA barrier (sRed rows 0..m-1)."""
        for m in cutlass.range_constexpr(self.m):
            self._sumsq(fx[None, None, m], width, sRed, m, tidx)
        cute.arch.sync_threads()
        for m in cutlass.range_constexpr(self.m):
            self._scale_store(fx[None, None, m], fw, sXv, width, m * self.kmax, sRed, m, tidx)

    @cute.jit
    def _side(self, i: cutlass.Constexpr, gW: cute.Tensor, gY: cute.Tensor, sRed: cute.Tensor,
              tidx: cutlass.Int32, bidx: cutlass.Int32) -> None:  # fmt: skip
        """MLA: kv_c's norm, by the last CTA after its GEMM blocks (no GEMM of the segment reads
        it, so it stays off the path to the first MMA or FMA)."""
        st = self.stages[i]
        if const_expr(st.side[1] > 0):
            atom_cg = cute.make_copy_atom(
                cute.nvgpu.CopyG2ROp(), BFloat16, num_bits_per_copy=128,
                load_cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL)  # fmt: skip
            s_base, s_w, s_g, s_out = st.side
            if bidx == self.cfg.ctas - 1:
                _, per_k = self._vectors(s_w)
                for m in cutlass.range_constexpr(self.m):
                    fk = cute.make_rmem_tensor((VEC, per_k), BFloat16)
                    fkw = cute.make_rmem_tensor((VEC, per_k), BFloat16)
                    self._load_row(gY, 0, s_base + m * st.src[2], s_w, fk, tidx, True, atom_cg)
                    self._load_row(gW, 0, s_g, s_w, fkw, tidx, True)
                    self._norm_store(fk, fkw, gY, s_w, s_out + m * s_w, sRed, self.m + m, tidx)

    @cute.jit
    def _issue(self, i: cutlass.Constexpr, gW: cute.Tensor, sWv: cute.Tensor, blk: cutlass.Int32,
               slot: cutlass.Int32, grp: cutlass.Int32, gt: cutlass.Int32) -> None:  # fmt: skip
        """cp.async this thread's weight vectors of row block `blk` into its ring slot, as one
        commit group (empty past the last block, so every thread counts groups alike)."""
        st = self.stages[i]
        kv_total = st.k // VEC
        rows = self.cfg.rows_of(st)
        atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(
            cache_mode=cute.nvgpu.cpasync.LoadCacheMode.GLOBAL), BFloat16,
            num_bits_per_copy=128)  # fmt: skip
        if blk < (st.n + rows - 1) // rows:
            for u in cutlass.range_constexpr(st.unroll):
                kv = u * GROUP + gt
                for r in cutlass.range_constexpr(rows):
                    row = cutlass.min(blk * rows + r, st.n - 1)
                    if kv < kv_total:
                        j = (grp * self.cfg.ring + slot) * self.slot + u * rows + r
                        cute.copy(atom, gW[(None, st.w_off // VEC + row * kv_total + kv)],
                                  sWv[(None, j * GROUP + gt)])  # fmt: skip
        cute.arch.cp_async_commit_group()

    @cute.jit
    def _stage(self, i: cutlass.Constexpr, bufs: dict, flat: dict, gW: cute.Tensor,
               gY: cute.Tensor, sXv: cute.Tensor, sWv: cute.Tensor, sRed: cute.Tensor,
               sAcc: cute.Tensor, cnt: cute.Pointer, old: Int32, tidx: cutlass.Int32,
               bidx: cutlass.Int32) -> None:  # fmt: skip
        st = self.stages[i]
        ring = self.cfg.ring
        kv_total = st.k // VEC
        rows = self.cfg.rows_of(st)
        grp = tidx // GROUP
        gt = tidx % GROUP
        warp = gt // 32
        lane = tidx % 32
        n_blocks = (st.n + rows - 1) // rows
        n_groups = self.cfg.ctas * GROUPS
        gid = bidx * GROUPS + grp
        tW = cute.make_rmem_tensor((VEC,), BFloat16)
        tX = cute.make_rmem_tensor((VEC, self.m), BFloat16)
        # two partial sums per output: half the dependent FMA chain a 16-byte vector makes
        acc = cute.make_rmem_tensor((self.m, rows, 2), Float32)
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        # 1) the first ring - 1 blocks' weights in flight before this stage's inputs exist
        for p in cutlass.range_constexpr(ring - 1):
            self._issue(i, gW, sWv, gid + p * n_groups, p, grp, gt)
        # 2) wait for them: the previous kernel (PDL) or every CTA's previous stage (barrier)
        self._inputs(i, bufs, gW, sXv, gY, sRed, cnt, old, tidx, bidx)
        for blk in cutlass.range(gid, n_blocks, n_groups):
            it = (blk - gid) // n_groups
            # keep ring - 1 blocks in flight: the slot refilled is the one computed last trip
            self._issue(i, gW, sWv, blk + (ring - 1) * n_groups, (it + ring - 1) % ring, grp, gt)
            cute.arch.cp_async_wait_group(ring - 1)  # this thread's vectors of `blk` landed
            base = (grp * ring + it % ring) * self.slot
            acc.fill(0.0)
            for u in cutlass.range_constexpr(st.unroll):
                kv = u * GROUP + gt
                if kv < kv_total:
                    for m in cutlass.range_constexpr(self.m):
                        cute.copy(atom, sXv[(None, m * (self.kmax // VEC) + kv)], tX[None, m])
                    for r in cutlass.range_constexpr(rows):
                        cute.copy(atom, sWv[(None, (base + u * rows + r) * GROUP + gt)], tW)
                        w32 = tW.load().to(Float32)
                        for m in cutlass.range_constexpr(self.m):
                            x32 = tX[None, m].load().to(Float32)
                            s0, s1 = acc[m, r, 0], acc[m, r, 1]
                            for e in cutlass.range_constexpr(0, VEC, 2):
                                s0 = s0 + w32[e] * x32[e]
                                s1 = s1 + w32[e + 1] * x32[e + 1]
                            acc[m, r, 0], acc[m, r, 1] = s0, s1
            # group reduction: shuffles, then one smem slot per warp (two parities, so the next
            # block's partials cannot overwrite ones a slow reader still needs)
            par = it % 2
            for m in cutlass.range_constexpr(self.m):
                for r in cutlass.range_constexpr(rows):
                    v = cute.arch.warp_reduction_sum(acc[m, r, 0] + acc[m, r, 1])
                    if lane == 0:
                        sAcc[par, grp, warp, m * rows + r] = v
            cute.arch.barrier(barrier_id=1 + grp, number_of_threads=GROUP)
            if gt < self.m * rows:
                mm = gt // rows
                row = blk * rows + gt % rows
                if row < st.n:
                    s = Float32(0.0)
                    for w in cutlass.range_constexpr(WARPS_PER_GROUP):
                        s = s + sAcc[par, grp, w, gt]
                    self._store(i, flat, mm, row, s)
        self._side(i, gW, gY, sRed, tidx, bidx)
        cute.arch.cp_async_wait_group(0)  # the ring is free for the next stage

    @cute.jit
    def _wait(self, i: cutlass.Constexpr, cnt: cute.Pointer, old: Int32,
              tidx: cutlass.Int32) -> None:  # fmt: skip
        """Stage i's inputs are ready: the previous kernel's (PDL) for the first stage, every
        CTA's previous stage (the grid barrier's word flipped past `old`) after that."""
        if const_expr(i == 0):
            if const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
        else:
            if tidx == 0:
                cur = cute.arch.load(cnt, Int32, sem="acquire", scope="gpu")
                while (cur ^ old) >= 0:  # same top bit: someone has not arrived
                    cur = cute.arch.load(cnt, Int32, sem="acquire", scope="gpu")
                cute.arch.fence_acq_rel_gpu()
            cute.arch.sync_threads()

    @cute.jit
    def _store(self, i: cutlass.Constexpr, flat: dict, mm: cutlass.Int32, row: cutlass.Int32,
               s: Float32) -> None:  # fmt: skip
        """Output (token mm, row) of stage i: bf16, plus the epilogue residual (added to the
        rounded GEMM output, as the unfused layer does)."""
        st = self.stages[i]
        if const_expr(st.epi_res is not None):
            rb, rbase, rld = st.epi_res
            s = s.to(BFloat16).to(Float32) + flat[rb][rbase + mm * rld + row].to(Float32)
        flat["y"][st.out[0] + mm * st.out[1] + row] = s.to(BFloat16)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mR: cute.Tensor) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if const_expr(self.pdl):  # every CTA is resident once all have passed this point
            cute.arch.griddepcontrol_launch_dependents()
        smem = cutlass.memory.SmemAllocator()
        sX = smem.allocate_tensor(BFloat16, cute.make_layout((self.m * self.kmax,)), 16)
        ring_len = THREADS * self.cfg.ring * self.slot * VEC  # every group's ring of slots
        sW = smem.allocate_tensor(BFloat16, cute.make_layout((ring_len,)), 128)
        sRed = smem.allocate_tensor(Float32, cute.make_layout((2 * self.m, THREADS // 32)), 16)
        sAcc = smem.allocate_tensor(Float32, cute.make_layout(self.cfg.acc_shape), 16)
        sXv = cute.zipped_divide(sX, (VEC,))
        sWv = cute.zipped_divide(sW, (VEC,))
        gY = cute.zipped_divide(mY, (VEC,))
        gW = cute.zipped_divide(mW, (VEC,))
        bufs = {"x": cute.zipped_divide(mX, (VEC,)), "r": cute.zipped_divide(mR, (VEC,)),
                "y": gY}  # fmt: skip
        flat = {"x": mX, "r": mR, "y": mY}
        cnt = cute.recast_ptr(mW.iterator + (self.sizes["w"] - COUNTER), dtype=Int32)
        old = Int32(0)
        for i in cutlass.range_constexpr(len(self.stages)):
            self._stage(i, bufs, flat, gW, gY, sXv, sWv, sRed, sAcc, cnt, old, tidx, bidx)
            if const_expr(i + 1 < len(self.stages)):  # arrive: this CTA's outputs are written
                cute.arch.sync_threads()
                if tidx == 0:
                    cute.arch.fence_acq_rel_gpu()
                    inc = Int32(arrive_add(False, self.cfg.ctas))
                    if bidx == 0:
                        inc = Int32(arrive_add(True, self.cfg.ctas))
                    old = cute.arch.atomic_add(cnt, inc, sem="release", scope="gpu")
