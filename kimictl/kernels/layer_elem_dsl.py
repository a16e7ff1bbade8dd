# The DSL traces this body: shapes and elements are DSL values mypy cannot type.
# mypy: disable-error-code="index,operator,union-attr,attr-defined,arg-type,call-arg"
"""The CuTe DSL body of the layer's elementwise kernels (see layer_elem.py for the ops and ABI).

One CTA per token row. PDL: trigger the dependents first (the next GEMM may start streaming its
weights; it waits for this grid before reading its output), load the norm weights (not written by
the previous kernel), then `griddepcontrol.wait`, then read the previous kernel's output.
"""

# No `from __future__ import annotations` here: the DSL reads the annotations (cuda.CUstream).
import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, const_expr

from kimictl.kernels.layer_elem import EPS, LayerElemConfig

__all__ = ["LayerElem"]

VEC = 8  # bf16 elements per 16-byte vector


class LayerElem:
    def __init__(self, cfg: LayerElemConfig) -> None:
        self.cfg = cfg
        self.op = cfg.op
        self.m = cfg.m
        self.threads = cfg.threads
        self.pdl = cfg.pdl

    @cute.jit
    def _norm_segment(
        self,
        gX: cute.Tensor,
        gW: cute.Tensor,
        gY: cute.Tensor,
        row: cutlass.Int32,
        col0: cutlass.Constexpr,
        width: cutlass.Constexpr,
        y_base: cutlass.Int32,
        sRed: cute.Tensor,
        slot: cutlass.Constexpr,
        tidx: cutlass.Int32,
    ) -> None:
        """y[y_base + v*8 ..] = norm(x[row, col0 + ..]) * w[col0 + ..] over `width` columns."""
        nv = width // VEC
        per = (nv + self.threads - 1) // self.threads
        n_warps = self.threads // 32
        fx = cute.make_rmem_tensor((VEC, per), BFloat16)
        fw = cute.make_rmem_tensor((VEC, per), BFloat16)
        fo = cute.make_rmem_tensor((VEC,), BFloat16)
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        c0 = col0 // VEC
        for j in cutlass.range_constexpr(per):
            v = j * self.threads + tidx
            if v < nv:
                cute.copy(atom, gW[(None, c0 + v)], fw[None, j])
                cute.copy(atom, gX[(None, (row, c0 + v))], fx[None, j])
            else:
                fx[None, j].fill(0.0)
        q = Float32(0.0)
        for j in cutlass.range_constexpr(per):
            x32 = fx[None, j].load().to(Float32)
            for e in cutlass.range_constexpr(VEC):
                q = q + x32[e] * x32[e]
        q = cute.arch.warp_reduction_sum(q)
        if tidx % 32 == 0:
            sRed[slot, tidx // 32] = q
        cute.arch.sync_threads()
        t = Float32(0.0)
        for w in cutlass.range_constexpr(n_warps):
            t = t + sRed[slot, w]
        scale = cute.math.rsqrt(t / Float32(width) + Float32(EPS))
        for j in cutlass.range_constexpr(per):
            v = j * self.threads + tidx
            if v < nv:
                x32 = fx[None, j].load().to(Float32)
                w32 = fw[None, j].load().to(Float32)
                for e in cutlass.range_constexpr(VEC):
                    fo[e] = (x32[e] * scale * w32[e]).to(BFloat16)
                cute.copy(atom, fo, gY[(None, y_base // VEC + v)])

    @cute.jit
    def _situ_segment(
        self,
        gSrc: cute.Tensor,
        gY: cute.Tensor,
        row: cutlass.Int32,
        width: cutlass.Constexpr,
        y_base: cutlass.Int32,
        tidx: cutlass.Int32,
    ) -> None:
        """y[y_base ..] = beta*tanh(g/beta)*sigmoid(g) * lb*tanh(u/lb) over `width` columns, with
        g = src[row, off ..] and u = src[row, off + width ..]."""
        cfg = self.cfg
        nv = width // VEC
        per = (nv + self.threads - 1) // self.threads
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        fg = cute.make_rmem_tensor((VEC,), BFloat16)
        fu = cute.make_rmem_tensor((VEC,), BFloat16)
        fo = cute.make_rmem_tensor((VEC,), BFloat16)
        beta, lbeta = Float32(cfg.beta), Float32(cfg.lbeta)
        for j in cutlass.range_constexpr(per):
            v = j * self.threads + tidx
            if v < nv:
                cute.copy(atom, gSrc[(None, (row, cfg.off // VEC + v))], fg)
                cute.copy(atom, gSrc[(None, (row, cfg.off // VEC + nv + v))], fu)
                g32 = fg.load().to(Float32)
                u32 = fu.load().to(Float32)
                for e in cutlass.range_constexpr(VEC):
                    g = g32[e]
                    u = u32[e]
                    sg = Float32(1.0) / (Float32(1.0) + cute.math.exp(-g))
                    a = beta * cute.math.tanh(g / beta) * sg * lbeta * cute.math.tanh(u / lbeta)
                    fo[e] = a.to(BFloat16)
                cute.copy(atom, fo, gY[(None, y_base // VEC + v)])

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mR: cute.Tensor) -> None:
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        gX = cute.zipped_divide(mX, (1, VEC))
        gY = cute.zipped_divide(mY, (VEC,))
        smem = cutlass.memory.SmemAllocator()
        sRed = smem.allocate_tensor(Float32, cute.make_layout((2, self.threads // 32)), 16)
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        if const_expr(self.op == "addrms"):
            # new residual = bf16(h + r); the norm reads the rounded sum (vLLM's fused op)
            k = cfg.width
            nv = k // VEC
            per = (nv + self.threads - 1) // self.threads
            gW = cute.zipped_divide(mW, (VEC,))
            gR = cute.zipped_divide(mR, (1, VEC))
            fw = cute.make_rmem_tensor((VEC, per), BFloat16)
            fx = cute.make_rmem_tensor((VEC, per), BFloat16)
            fr = cute.make_rmem_tensor((VEC, per), BFloat16)
            fo = cute.make_rmem_tensor((VEC,), BFloat16)
            for j in cutlass.range_constexpr(per):
                v = j * self.threads + tidx
                if v < nv:
                    cute.copy(atom, gW[(None, v)], fw[None, j])
            if const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            for j in cutlass.range_constexpr(per):
                v = j * self.threads + tidx
                if v < nv:
                    cute.copy(atom, gX[(None, (row, v))], fx[None, j])
                    cute.copy(atom, gR[(None, (row, v))], fr[None, j])
            q = Float32(0.0)
            for j in cutlass.range_constexpr(per):
                v = j * self.threads + tidx
                if v < nv:
                    x32 = fx[None, j].load().to(Float32)
                    r32 = fr[None, j].load().to(Float32)
                    for e in cutlass.range_constexpr(VEC):
                        fr[e, j] = (x32[e] + r32[e]).to(BFloat16)
                    s32 = fr[None, j].load().to(Float32)
                    for e in cutlass.range_constexpr(VEC):
                        q = q + s32[e] * s32[e]
                    cute.copy(atom, fr[None, j], gY[(None, (self.m + row) * nv + v)])
            q = cute.arch.warp_reduction_sum(q)
            if tidx % 32 == 0:
                sRed[0, tidx // 32] = q
            cute.arch.sync_threads()
            t = Float32(0.0)
            for w in cutlass.range_constexpr(self.threads // 32):
                t = t + sRed[0, w]
            scale = cute.math.rsqrt(t / Float32(k) + Float32(EPS))
            for j in cutlass.range_constexpr(per):
                v = j * self.threads + tidx
                if v < nv:
                    s32 = fr[None, j].load().to(Float32)
                    w32 = fw[None, j].load().to(Float32)
                    for e in cutlass.range_constexpr(VEC):
                        fo[e] = (s32[e] * scale * w32[e]).to(BFloat16)
                    cute.copy(atom, fo, gY[(None, row * nv + v)])
        elif const_expr(self.op == "rms" or self.op == "qkvnorm"):
            gW = cute.zipped_divide(mW, (VEC,))
            if const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            self._norm_segment(gX, gW, gY, row, 0, cfg.width, row * cfg.width, sRed, 0, tidx)
            if const_expr(self.op == "qkvnorm"):
                self._norm_segment(gX, gW, gY, row, cfg.width, cfg.seg2,
                                   self.m * cfg.width + row * cfg.seg2, sRed, 1, tidx)  # fmt: skip
        elif const_expr(self.op == "gate"):
            # y = a * sigmoid(gate); gate = R[row, off:off + width]
            nv = cfg.width // VEC
            per = (nv + self.threads - 1) // self.threads
            gR = cute.zipped_divide(mR, (1, VEC))
            fa = cute.make_rmem_tensor((VEC,), BFloat16)
            fg = cute.make_rmem_tensor((VEC,), BFloat16)
            fo = cute.make_rmem_tensor((VEC,), BFloat16)
            if const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            for j in cutlass.range_constexpr(per):
                v = j * self.threads + tidx
                if v < nv:
                    cute.copy(atom, gX[(None, (row, v))], fa)
                    cute.copy(atom, gR[(None, (row, cfg.off // VEC + v))], fg)
                    a32 = fa.load().to(Float32)
                    g32 = fg.load().to(Float32)
                    for e in cutlass.range_constexpr(VEC):
                        sg = Float32(1.0) / (Float32(1.0) + cute.math.exp(-g32[e]))
                        fo[e] = (a32[e] * sg).to(BFloat16)
                    cute.copy(atom, fo, gY[(None, row * nv + v)])
        elif const_expr(self.op == "rmssitu"):  # one row of latent_up + shared_down's x
            gW = cute.zipped_divide(mW, (VEC,))
            gR = cute.zipped_divide(mR, (1, VEC))
            row_w = cfg.width + cfg.seg2
            if const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            self._norm_segment(gX, gW, gY, row, 0, cfg.width, row * row_w, sRed, 0, tidx)
            self._situ_segment(gR, gY, row, cfg.seg2, row * row_w + cfg.width, tidx)
        else:  # situ: act = SiTU(g) * lin(u) from X; R = fp32 logits
            nl = cfg.aux_w // VEC
            per_l = (nl + self.threads - 1) // self.threads
            fl = cute.make_rmem_tensor((VEC,), BFloat16)
            if const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            self._situ_segment(gX, gY, row, cfg.width, row * cfg.width, tidx)
            for j in cutlass.range_constexpr(per_l):
                v = j * self.threads + tidx
                if v < nl:
                    cute.copy(atom, gX[(None, (row, v))], fl)
                    l32 = fl.load().to(Float32)
                    for e in cutlass.range_constexpr(VEC):
                        mR[row, v * VEC + e] = l32[e]

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mY: cute.Tensor,
        mR: cute.Tensor,
        stream: cuda.CUstream,
    ) -> None:
        self.kernel(mX, mW, mY, mR).launch(
            grid=(self.m, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl
        )
