# The DSL traces this body: shapes are DSL values mypy cannot type.
# mypy: disable-error-code="arg-type,call-arg,attr-defined,index"
"""The launch every kernel family shares: a grid of row blocks of w, optionally K-split by a
cluster, optionally persistent.

Each family's kernel owns `rows` consecutive rows of w per CTA (grid x), `splits` CTAs of one
thread-block cluster split K for those rows (grid y = cluster y), and a persistent family caps
grid x at `ctas` and loops over row blocks. Every launch carries the programmatic-serialization
attribute when the variant is built with PDL. A family subclasses RowBlockGemm, sets these facts
in its constructor and writes `kernel(mX, mW, mY, mR)`; a family whose host side builds more than
the four tensors (TMA descriptors) overrides `__call__` and ends it with `launch_rows`.

Imports cutlass at the top (the DSL rewrites jit source against its module's globals), so only
the build step imports it.
"""

# No `from __future__ import annotations` here: the DSL reads the annotations (cuda.CUstream).
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

__all__ = ["RowBlockGemm"]


class RowBlockGemm:
    rows: int  # weight rows per CTA
    threads: int  # threads per CTA
    pdl: bool  # launched with programmatic stream serialization
    splits: int = 1  # CTAs of one cluster splitting K
    ctas: int = 0  # > 0: persistent grid of at most this many CTAs

    def launch_rows(self, kern: Any, n: Any, stream: cuda.CUstream) -> None:
        """Launch `kern` (a bound cute.kernel) over the row blocks of an N-row weight. Plain
        Python run while the caller is traced: the branches are compile-time facts."""
        blocks = cute.ceil_div(n, self.rows)
        if self.ctas > 0:
            blocks = cutlass.min(blocks, self.ctas)  # persistent: CTAs loop over row blocks
        grid = (blocks, self.splits, 1)
        block = (self.threads, 1, 1)
        if self.splits > 1:
            # the K-splitting CTAs of one row block form a cluster (grid y = cluster y)
            kern.launch(
                grid=grid,
                block=block,
                cluster=(1, self.splits, 1),
                stream=stream,
                use_pdl=self.pdl,
            )
        else:
            kern.launch(grid=grid, block=block, stream=stream, use_pdl=self.pdl)

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mY: cute.Tensor,
        mR: cute.Tensor,
        stream: cuda.CUstream,
    ) -> None:
        self.launch_rows(self.kernel(mX, mW, mY, mR), mW.shape[0], stream)
