"""kimictl's kernels as torch custom ops: `torch.ops.kimictl.decode_gemm(x, w, variant)`.

Launched on torch's current stream (so CUDA-graph capture records them, as `kernels verify`
proves for every variant), with a fake implementation so torch.compile/dynamo treat the call as
one opaque node of known output shape instead of tracing into ctypes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["LAYER_OP_NAME", "OP_NAME", "default_layer_library", "register_layer_op", "register_ops"]

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


LAYER_OP_NAME = "kimictl::layer_segment"
# flat output length per segment variant (chain.LayerChainConfig.sizes["y"]): the op's shape
_layer_y: dict[str, int] = {}


def _layer_library() -> Any:
    if "layer_lib" not in _state:
        _state["layer_lib"] = _state["layer_library"]()
    return _state["layer_lib"]


def default_layer_library() -> Any:
    """This node's layer build (kimictl.kernels.toolchain.build.gpu_layer_build), linked."""
    from kimictl.kernels.toolchain.build import gpu_layer_build
    from kimictl.kernels.toolchain.harness import open_library

    found = gpu_layer_build()
    if found is None:
        raise RuntimeError("no layer kernel build for this GPU: run `kimictl kernels install`")
    return open_library(found)


def register_layer_op(library: Callable[[], Any] | None = None) -> Any:
    """`torch.ops.kimictl.layer_segment(x, w, variant)`: one fused layer segment on the flat ABI
    (kimictl.kernels.layer.chain), y flat; R is unread by the segments the plugin routes.
    `library()` gives the KernelLibrary (default: this node's layer build), opened on first
    launch. Defined once per process; returns the op."""
    if library is not None:
        _state["layer_library"] = library
        _state.pop("layer_lib", None)
    if "layer_op" in _state:
        return _state["layer_op"]
    import torch

    from kimictl.kernels.layer.chain import CHAIN_SHIPPED

    _state.setdefault("layer_library", default_layer_library)
    _layer_y.update({c.name: c.sizes["y"] for c in CHAIN_SHIPPED})

    @torch.library.custom_op(
        LAYER_OP_NAME, mutates_args=(), schema="(Tensor x, Tensor w, str variant) -> Tensor"
    )
    def layer_segment(x: torch.Tensor, w: torch.Tensor, variant: str) -> torch.Tensor:
        y = torch.empty((_layer_y[variant],), dtype=x.dtype, device=x.device)
        # the barrier word in w's tail is written: w is the layer's own buffer, never shared
        stream = torch.cuda.current_stream() if x.is_cuda else None  # None: a CPU model
        _layer_library().launch(variant, x, w.view(1, -1), y, y, stream)
        return y

    @layer_segment.register_fake
    def _(x: torch.Tensor, w: torch.Tensor, variant: str) -> torch.Tensor:
        return x.new_empty((_layer_y[variant],))

    _state["layer_op"] = layer_segment
    return layer_segment
