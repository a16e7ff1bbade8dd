# The DSL traces this body: shapes and elements are DSL values mypy cannot type.
# mypy: disable-error-code="index,operator,union-attr,attr-defined,arg-type,call-arg"
"""The CuTe DSL per-row helpers of the layer's elementwise ops (loads, RMSNorm, the sigmoid gate,
SiTU * mul) and their PDL launch, which the fused segments (chain_dsl.py) build each stage's x
with; the lab's elementwise kernels (lab/kernels/layer_elem_dsl.py) run them one CTA per token row.

PDL: trigger the dependents first (the next GEMM may start streaming its
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

from kimictl.kernels.layer.elem import EPS

__all__ = ["LayerElem"]

VEC = 8  # bf16 elements per 16-byte vector


class LayerElem:
    """Per-row helpers and the PDL launch; a subclass sets `threads`, `pdl`, `ctas`, `m` and
    `cfg` (beta, lbeta for SiTU) and defines `kernel` (the fused segments: chain_dsl.py)."""

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
