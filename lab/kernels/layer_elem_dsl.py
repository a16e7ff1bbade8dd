# The DSL traces this body: shapes and elements are DSL values mypy cannot type.
# mypy: disable-error-code="index,operator,union-attr,attr-defined,arg-type,call-arg"
"""The CuTe DSL body of the layer's elementwise kernels (lab only; see layer_elem.py for the ops
and ABI): one CTA per token row on the shipped per-row helpers and launch
(kimictl/kernels/layer/elem_dsl.py, whose docstring says how they use PDL)."""

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, const_expr

from kimictl.kernels.layer.elem_dsl import VEC, LayerElem
from lab.kernels.layer_elem import LayerElemConfig

__all__ = ["LayerElemOps"]


class LayerElemOps(LayerElem):
    def __init__(self, cfg: LayerElemConfig) -> None:
        self.cfg = cfg
        self.op = cfg.op
        self.m = cfg.m
        self.threads = cfg.threads
        self.pdl = cfg.pdl
        self.ctas = cfg.m  # grid: one CTA per token row

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
