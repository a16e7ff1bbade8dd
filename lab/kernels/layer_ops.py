"""Views of the dense layer's op list (kimictl/kernels/layer/ops.py) that only the lab's
benchmark and tests read."""

from __future__ import annotations

from kimictl.kernels.layer.ops import DenseOp, dense_layer_ops

__all__ = ["gemm_ops", "weight_bytes"]


def gemm_ops(kind: str, tp: int = 8) -> tuple[DenseOp, ...]:
    """The GEMMs of the layer's op list, in order."""
    return tuple(op for op in dense_layer_ops(kind, tp) if op.kind == "gemm")


def weight_bytes(kind: str, tp: int = 8) -> int:
    """Bytes of weights the dense part reads once per step (norm weights included)."""
    return sum(op.weight_bytes for op in dense_layer_ops(kind, tp))
