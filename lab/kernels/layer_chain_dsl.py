# The DSL traces this body: shapes and elements are DSL values mypy cannot type.
# mypy: disable-error-code="index,operator,union-attr,attr-defined,arg-type,call-arg,assignment"
"""The tensor-core form of the layer segments (lab only; the shipped SIMT form is
kimictl/kernels/layer/chain_dsl.py, whose loads, x building, barrier and stores this reuses):
each stage's GEMM on `mma.sync.m16n8k16` (see layer_chain.LayerChainMmaConfig)."""

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32

from kimictl.kernels.gemm.tcstream_gemm_dsl import mma_bf16_16816
from kimictl.kernels.layer.chain import THREADS
from kimictl.kernels.layer.chain_dsl import LayerChain
from kimictl.kernels.layer.elem_dsl import VEC
from lab.kernels.layer_chain import KGROUP, TILE, WARPS

__all__ = ["LayerChainMma"]


class LayerChainMma(LayerChain):
    """LayerChain with `_stage` on the tensor cores (its kernel calls `_stage` per stage)."""

    @cute.jit
    def _issue_mma(self, i: cutlass.Constexpr, gW: cute.Tensor, sWv: cute.Tensor,
                   blk: cutlass.Int32, n_blk: cutlass.Int32, slot: cutlass.Int32,
                   tidx: cutlass.Int32, bidx: cutlass.Int32) -> None:  # fmt: skip
        """mma: cp.async this thread's vectors of the CTA's block `blk` (tile blk // pieces,
        piece blk % pieces) into ring slot `slot`: rows g and g + 8 of the tile at the k-vector
        of each of the piece's k-groups, one commit group (empty past the CTA's last block)."""
        st = self.stages[i]
        kv_total = st.k // VEC
        pieces = self.cfg.pieces(st)
        u = self.slot // 2
        warp = tidx // 32
        g = (tidx % 32) // 4
        atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(
            cache_mode=cute.nvgpu.cpasync.LoadCacheMode.GLOBAL), BFloat16,
            num_bits_per_copy=128)  # fmt: skip
        if blk < n_blk:
            tile = bidx + (blk // pieces) * self.cfg.ctas
            piece = blk % pieces
            base = st.w_off // VEC
            lo = cutlass.min(tile * TILE + g, st.n - 1) * kv_total  # rows past N re-read N - 1
            hi = cutlass.min(tile * TILE + g + 8, st.n - 1) * kv_total
            for uu in cutlass.range_constexpr(u):
                kv = ((piece * u + uu) * WARPS + warp) * (KGROUP // VEC) + tidx % 4
                if kv < kv_total:
                    j = slot * self.slot + 2 * uu
                    cute.copy(atom, gW[(None, base + lo + kv)], sWv[(None, j * THREADS + tidx)])
                    cute.copy(atom, gW[(None, base + hi + kv)],
                              sWv[(None, (j + 1) * THREADS + tidx)])  # fmt: skip
        cute.arch.cp_async_commit_group()

    @cute.jit
    def _stage(self, i: cutlass.Constexpr, bufs: dict, flat: dict, gW: cute.Tensor,
               gY: cute.Tensor, sXv: cute.Tensor, sWv: cute.Tensor, sRed: cute.Tensor,
               sAcc: cute.Tensor, cnt: cute.Pointer, old: Int32, tidx: cutlass.Int32,
               bidx: cutlass.Int32) -> None:  # fmt: skip
        """Stage i on the tensor cores: the CTA's tiles bidx, bidx + ctas, ..., each as `pieces`
        ring slots, MMAs per k-group, the warps' sums reduced once per tile."""
        st = self.stages[i]
        ring = self.cfg.ring
        kg_total = st.k // KGROUP
        pieces = self.cfg.pieces(st)
        u = self.slot // 2
        warp = tidx // 32
        lane = tidx % 32
        g = lane // 4
        t = lane % 4
        n_tiles = (st.n + TILE - 1) // TILE
        my_tiles = (n_tiles - bidx + self.cfg.ctas - 1) // self.cfg.ctas
        n_blk = my_tiles * pieces
        tWlo = cute.make_rmem_tensor((VEC,), BFloat16)
        tWhi = cute.make_rmem_tensor((VEC,), BFloat16)
        tX = cute.make_rmem_tensor((VEC,), BFloat16)
        acc = cute.make_rmem_tensor((4,), Float32)
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        for p in cutlass.range_constexpr(ring - 1):
            self._issue_mma(i, gW, sWv, Int32(p), n_blk, Int32(p), tidx, bidx)
        self._inputs(i, bufs, gW, sXv, gY, sRed, cnt, old, tidx, bidx)
        for ti in cutlass.range(my_tiles):
            acc.fill(0.0)
            for piece in cutlass.range_constexpr(pieces):
                blk = ti * pieces + piece
                nxt = blk + ring - 1
                self._issue_mma(i, gW, sWv, nxt, n_blk, nxt % ring, tidx, bidx)
                cute.arch.cp_async_wait_group(ring - 1)  # this thread's vectors of blk landed
                slot = blk % ring
                for uu in cutlass.range_constexpr(u):
                    kg = (piece * u + uu) * WARPS + warp
                    if kg < kg_total:  # warp-uniform: mma.sync needs the whole warp
                        j = slot * self.slot + 2 * uu
                        cute.copy(atom, sWv[(None, j * THREADS + tidx)], tWlo)
                        cute.copy(atom, sWv[(None, (j + 1) * THREADS + tidx)], tWhi)
                        if g < self.m:
                            cute.copy(atom, sXv[(None, g * (self.kmax // VEC) + kg * 4 + t)], tX)
                        else:
                            tX.fill(0.0)
                        a_lo = cute.recast_tensor(tWlo, Int32)
                        a_hi = cute.recast_tensor(tWhi, Int32)
                        b = cute.recast_tensor(tX, Int32)
                        for h in cutlass.range_constexpr(2):
                            d0, d1, d2, d3 = mma_bf16_16816(
                                a_lo[2 * h], a_hi[2 * h], a_lo[2 * h + 1], a_hi[2 * h + 1],
                                b[2 * h], b[2 * h + 1], acc[0], acc[1], acc[2], acc[3],
                            )  # fmt: skip
                            acc[0], acc[1], acc[2], acc[3] = d0, d1, d2, d3
            # C fragment: rows g, g + 8 of the tile, tokens 2t, 2t + 1; two parities, so one
            # barrier per tile suffices (a parity is rewritten only after the next barrier)
            par = ti % 2
            sAcc[par, warp, g, 2 * t] = acc[0]
            sAcc[par, warp, g, 2 * t + 1] = acc[1]
            sAcc[par, warp, g + 8, 2 * t] = acc[2]
            sAcc[par, warp, g + 8, 2 * t + 1] = acc[3]
            cute.arch.sync_threads()
            if tidx < TILE * self.m:
                r = tidx % TILE
                row = (bidx + ti * self.cfg.ctas) * TILE + r
                if row < st.n:
                    s = Float32(0.0)
                    for w in cutlass.range_constexpr(WARPS):
                        s = s + sAcc[par, w, r, tidx // TILE]
                    self._store(i, flat, tidx // TILE, row, s)
        self._side(i, gW, gY, sRed, tidx, bidx)
        cute.arch.cp_async_wait_group(0)  # the ring is free for the next stage
