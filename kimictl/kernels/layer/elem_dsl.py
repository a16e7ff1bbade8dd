# The DSL traces this body: shapes and elements are DSL values mypy cannot type.
# mypy: disable-error-code="index,operator,union-attr,attr-defined,arg-type,call-arg"
"""The CuTe DSL body of the layer's elementwise kernels (see elem.py for the ops and ABI).

One CTA per token row. PDL: trigger the dependents first (the next GEMM may start streaming its
weights; it waits for this grid before reading its output), load the norm weights (not written by
the previous kernel), then `griddepcontrol.wait`, then read the previous kernel's output.
Sigmoid and tanh run on the hardware tanh (tanh.approx, relative error ~2^-11, under bf16's 2^-8
rounding of each output; sigmoid(v) = 0.5 + 0.5 tanh(v / 2)), as in tcpro: precise exp, tanh and
division cost ~100 instructions an element, on SMs the PDL-launched GEMM already shares.
"""

# No `from __future__ import annotations` here: the DSL reads the annotations (cuda.CUstream).
import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, const_expr

from kimictl.kernels.layer.elem import EPS, LayerElemConfig

__all__ = ["LayerElem"]

VEC = 8  # bf16 elements per 16-byte vector


class LayerElem:
    def __init__(self, cfg: LayerElemConfig) -> None:
        self.cfg = cfg
        self.op = cfg.op
        self.m = cfg.m
        self.threads = cfg.threads
        self.pdl = cfg.pdl
        self.ctas = cfg.m  # grid: one CTA per token row

    def _vectors(self, width: cutlass.Constexpr) -> tuple[int, int]:
        """(16-byte vectors in `width` columns, vectors per thread)."""
        nv = width // VEC
        return nv, (nv + self.threads - 1) // self.threads

    @cute.jit
    def _load_row(
        self,
        gSrc: cute.Tensor,
        row: cutlass.Int32,
        col0: cutlass.Constexpr,
        width: cutlass.Constexpr,
        dst: cute.Tensor,
        tidx: cutlass.Int32,
        flat: cutlass.Constexpr = False,
        atom: cute.CopyAtom | None = None,
    ) -> None:
        """dst[:, j] = src[row, col0 + (j * threads + tidx) * 8 ..] (zeros past `width`); flat:
        src is 1-D (a norm weight) and row is ignored; atom: the load (a plain one if None)."""
        nv, per = self._vectors(width)
        if const_expr(atom is None):
            atom = cute.make_copy_atom(
                cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128
            )
        for j in cutlass.range_constexpr(per):
            v = j * self.threads + tidx
            if v < nv:
                if const_expr(flat):
                    cute.copy(atom, gSrc[(None, col0 // VEC + v)], dst[None, j])
                else:
                    cute.copy(atom, gSrc[(None, (row, col0 // VEC + v))], dst[None, j])
            else:
                dst[None, j].fill(0.0)

    @cute.jit
    def _norm_store(
        self,
        fx: cute.Tensor,
        fw: cute.Tensor,
        gY: cute.Tensor,
        width: cutlass.Constexpr,
        y_base: cutlass.Int32,
        sRed: cute.Tensor,
        slot: cutlass.Constexpr,
        tidx: cutlass.Int32,
    ) -> None:
        """y[y_base ..] = norm(x) * w over `width` columns, x and w loaded by _load_row."""
        self._sumsq(fx, width, sRed, slot, tidx)
        cute.arch.sync_threads()
        self._scale_store(fx, fw, gY, width, y_base, sRed, slot, tidx)

    @cute.jit
    def _sumsq(
        self,
        fx: cute.Tensor,
        width: cutlass.Constexpr,
        sRed: cute.Tensor,
        slot: cutlass.Constexpr,
        tidx: cutlass.Int32,
    ) -> None:
        """This warp's part of sum(x^2) into sRed[slot, warp] (a CTA barrier must follow)."""
        _, per = self._vectors(width)
        q = Float32(0.0)
        for j in cutlass.range_constexpr(per):
            x32 = fx[None, j].load().to(Float32)
            for e in cutlass.range_constexpr(VEC):
                q = q + x32[e] * x32[e]
        q = cute.arch.warp_reduction_sum(q)
        if tidx % 32 == 0:
            sRed[slot, tidx // 32] = q

    @cute.jit
    def _scale_store(
        self,
        fx: cute.Tensor,
        fw: cute.Tensor,
        gY: cute.Tensor,
        width: cutlass.Constexpr,
        y_base: cutlass.Int32,
        sRed: cute.Tensor,
        slot: cutlass.Constexpr,
        tidx: cutlass.Int32,
    ) -> None:
        """y[y_base ..] = x * rsqrt(mean(x^2) + eps) * w, the warps' sums read from sRed[slot]."""
        nv, per = self._vectors(width)
        fo = cute.make_rmem_tensor((VEC,), BFloat16)
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        t = Float32(0.0)
        for w in cutlass.range_constexpr(self.threads // 32):
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
        """y[y_base ..] = norm(x[row, col0 ..]) * w[col0 ..] over `width` columns."""
        _, per = self._vectors(width)
        fx = cute.make_rmem_tensor((VEC, per), BFloat16)
        fw = cute.make_rmem_tensor((VEC, per), BFloat16)
        self._load_row(gW, row, col0, width, fw, tidx, True)
        self._load_row(gX, row, col0, width, fx, tidx)
        self._norm_store(fx, fw, gY, width, y_base, sRed, slot, tidx)

    @cute.jit
    def _act_store(
        self,
        fx: cute.Tensor,
        fg: cute.Tensor,
        gY: cute.Tensor,
        width: cutlass.Constexpr,
        y_base: cutlass.Int32,
        tidx: cutlass.Int32,
        act: cutlass.Constexpr,
    ) -> None:
        """y[y_base ..] over `width` columns, sigmoid on the hardware tanh: act "gate":
        x * sigmoid(g); act "situ": beta*tanh(g/beta)*sigmoid(g) * lb*tanh(x/lb) (x is the up
        half)."""
        nv, per = self._vectors(width)
        fo = cute.make_rmem_tensor((VEC,), BFloat16)
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        half = Float32(0.5)
        if const_expr(act == "situ"):  # the betas once, not per element
            beta, lbeta = Float32(self.cfg.beta), Float32(self.cfg.lbeta)
            ibeta, ilbeta = Float32(1.0 / self.cfg.beta), Float32(1.0 / self.cfg.lbeta)
        for j in cutlass.range_constexpr(per):
            v = j * self.threads + tidx
            if v < nv:
                x32 = fx[None, j].load().to(Float32)
                g32 = fg[None, j].load().to(Float32)
                for e in cutlass.range_constexpr(VEC):
                    sg = half + half * cute.math.tanh(g32[e] * half, approx=True)
                    if const_expr(act == "gate"):
                        fo[e] = (x32[e] * sg).to(BFloat16)
                    else:
                        a = beta * cute.math.tanh(g32[e] * ibeta, approx=True) * sg
                        fo[e] = (a * lbeta * cute.math.tanh(x32[e] * ilbeta, approx=True)).to(
                            BFloat16
                        )
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
        if const_expr(self.pdl and not cfg.late):
            cute.arch.griddepcontrol_launch_dependents()
        if const_expr(self.op == "addrms"):
            # new residual = bf16(h + r); the norm reads the rounded sum (vLLM's fused op)
            nv, per = self._vectors(cfg.width)
            gW = cute.zipped_divide(mW, (VEC,))
            gR = cute.zipped_divide(mR, (1, VEC))
            fw = cute.make_rmem_tensor((VEC, per), BFloat16)
            fx = cute.make_rmem_tensor((VEC, per), BFloat16)
            fr = cute.make_rmem_tensor((VEC, per), BFloat16)
            self._load_row(gW, row, 0, cfg.width, fw, tidx, True)  # not the previous kernel's
            if const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            self._load_row(gX, row, 0, cfg.width, fx, tidx)
            self._load_row(gR, row, 0, cfg.width, fr, tidx)
            for j in cutlass.range_constexpr(per):
                v = j * self.threads + tidx
                if v < nv:
                    x32 = fx[None, j].load().to(Float32)
                    r32 = fr[None, j].load().to(Float32)
                    for e in cutlass.range_constexpr(VEC):
                        fr[e, j] = (x32[e] + r32[e]).to(BFloat16)
                    cute.copy(atom, fr[None, j], gY[(None, (self.m + row) * nv + v)])
            self._norm_store(fr, fw, gY, cfg.width, row * cfg.width, sRed, 0, tidx)
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
            _, per = self._vectors(cfg.width)
            gR = cute.zipped_divide(mR, (1, VEC))
            fa = cute.make_rmem_tensor((VEC, per), BFloat16)
            fg = cute.make_rmem_tensor((VEC, per), BFloat16)
            if const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            self._load_row(gX, row, 0, cfg.width, fa, tidx)
            self._load_row(gR, row, cfg.off, cfg.width, fg, tidx)
            self._act_store(fa, fg, gY, cfg.width, row * cfg.width, tidx, "gate")
        elif const_expr(self.op == "copy"):  # the stand-in: y = x[:, :width], in the PDL chain
            nv, per = self._vectors(cfg.width)
            fx = cute.make_rmem_tensor((VEC, per), BFloat16)
            if const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            self._load_row(gX, row, 0, cfg.width, fx, tidx)
            for j in cutlass.range_constexpr(per):
                v = j * self.threads + tidx
                if v < nv:
                    cute.copy(atom, fx[None, j], gY[(None, row * nv + v)])
            if const_expr(self.pdl and cfg.late):
                cute.arch.griddepcontrol_launch_dependents()
        elif const_expr(self.op == "rmssitu"):  # one row of latent_up + shared_down's x
            # every load in flight before any math: one round trip to memory, which the GEMM
            # after this kernel keeps busy streaming its weights (PDL)
            gW = cute.zipped_divide(mW, (VEC,))
            gR = cute.zipped_divide(mR, (1, VEC))
            row_w = cfg.width + cfg.seg2
            _, per = self._vectors(cfg.width)
            _, per_s = self._vectors(cfg.seg2)
            fw = cute.make_rmem_tensor((VEC, per), BFloat16)
            fx = cute.make_rmem_tensor((VEC, per), BFloat16)
            fg = cute.make_rmem_tensor((VEC, per_s), BFloat16)
            fu = cute.make_rmem_tensor((VEC, per_s), BFloat16)
            self._load_row(gW, row, 0, cfg.width, fw, tidx, True)  # not the previous kernel's
            if const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            self._load_row(gR, row, cfg.off, cfg.seg2, fg, tidx)
            self._load_row(gR, row, cfg.off + cfg.seg2, cfg.seg2, fu, tidx)
            self._load_row(gX, row, 0, cfg.width, fx, tidx)
            self._act_store(fu, fg, gY, cfg.seg2, row * row_w + cfg.width, tidx, "situ")
            self._norm_store(fx, fw, gY, cfg.width, row * row_w, sRed, 0, tidx)
        else:  # situ: act = SiTU(g) * lin(u) from X; R = fp32 logits
            nl, per_l = self._vectors(cfg.aux_w)
            fl = cute.make_rmem_tensor((VEC,), BFloat16)
            _, per = self._vectors(cfg.width)
            fg = cute.make_rmem_tensor((VEC, per), BFloat16)
            fu = cute.make_rmem_tensor((VEC, per), BFloat16)
            if const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            self._load_row(gX, row, cfg.off, cfg.width, fg, tidx)
            self._load_row(gX, row, cfg.off + cfg.width, cfg.width, fu, tidx)
            self._act_store(fu, fg, gY, cfg.width, row * cfg.width, tidx, "situ")
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
            grid=(self.ctas, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl
        )
