"""kimictl's kernels as torch custom ops: `torch.ops.kimictl.decode_gemm(x, w, variant)`.

Launched on torch's current stream (so CUDA-graph capture records them, as `kernels verify`
proves for every variant), with a fake implementation so torch.compile/dynamo treat the call as
one opaque node of known output shape instead of tracing into ctypes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["OP_NAME", "register_ops"]

OP_NAME = "kimictl::decode_gemm"
_state: dict[str, Any] = {}


def _library() -> Any:
    if "lib" not in _state:  # opened once: the per-call path is one dict lookup
        _state["lib"] = _state["library"]()
    return _state["lib"]


def register_ops(library: Callable[[], Any] | None = None) -> Any:
    """Define the op once per process; `library()` gives the harness.KernelLibrary to launch
    from (default: this node's installed build), opened on first launch. Returns the op."""
    if "op" in _state:
        if library is not None:
            _state["library"] = library
            _state.pop("lib", None)
        return _state["op"]
    import torch

    from kimictl.kernels.toolchain.harness import default_library

    _state["library"] = library or default_library

    # explicit schema: this module's annotations are strings naming a torch it imports lazily
    @torch.library.custom_op(
        OP_NAME, mutates_args=(), schema="(Tensor x, Tensor w, str variant) -> Tensor"
    )
    def decode_gemm(x: torch.Tensor, w: torch.Tensor, variant: str) -> torch.Tensor:
        y = torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
        # y doubles as the unused residual pointer of non-residual variants
        _library().launch(variant, x, w, y, y, torch.cuda.current_stream())
        return y

    @decode_gemm.register_fake
    def _(x: torch.Tensor, w: torch.Tensor, variant: str) -> torch.Tensor:
        return x.new_empty((x.shape[0], w.shape[0]))

    _state["op"] = decode_gemm
    return decode_gemm
