"""Ahead-of-time compilation of one decode-GEMM variant, shared by every kernel family.

Every family has the same C ABI (see build.py): x[M, K], w[N, K], y[M, N], r[M, N], row-major bf16,
N and K runtime sizes (K % 8 == 0, 16-byte aligned rows), M fixed per variant, and a stream. The
fake tensors below are that ABI; only the kernel object differs between families.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VEC", "compile_gemm"]

VEC = 8  # bf16 elements per 16-byte load: K must be a multiple of it


def compile_gemm(kernel: Any, m: int, arch: str) -> Any:
    """cute.compile `kernel` (a family's DSL class, built from its config) against the ABI."""
    import cuda.bindings.driver as cuda  # noqa: F401  (the DSL resolves the stream type)
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16

    n = cute.sym_int()
    k = cute.sym_int(divisibility=VEC)  # 16-byte rows: every (row, k/8) vector is aligned

    def operand(rows: Any, cols: Any) -> Any:
        return cute.runtime.make_fake_compact_tensor(
            BFloat16, (rows, cols), stride_order=(1, 0), assumed_align=16
        )

    stream = cutlass.runtime.make_fake_stream()
    mx, mw, my, mr = operand(m, k), operand(n, k), operand(m, n), operand(m, n)
    return cute.compile(kernel, mx, mw, my, mr, stream, options=f"--gpu-arch {arch}")
