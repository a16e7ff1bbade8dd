"""Views of the dense layer's op list (kimictl/kernels/layer/ops.py) that only the lab's
benchmark and tests read."""

from __future__ import annotations

from kimictl.kernels.layer.ops import DenseOp, dense_layer_ops

__all__ = ["gemm_ops", "op_weight_bytes", "weight_bytes"]

BF16 = 2


def gemm_ops(kind: str, tp: int = 8) -> tuple[DenseOp, ...]:
    """The GEMMs of the layer's op list, in order."""
    return tuple(op for op in dense_layer_ops(kind, tp) if op.kind == "gemm")


def op_weight_bytes(op: DenseOp) -> int:
    """Bytes of bf16 weights one op reads: a GEMM's [n, k], a norm's [k], none otherwise."""
    if op.kind == "gemm":
        return op.n * op.k * BF16
    if op.kind in ("add_rmsnorm", "rmsnorm"):
        return op.k * BF16
    return 0


def weight_bytes(kind: str, tp: int = 8) -> int:
    """Bytes of weights the dense part reads once per step (norm weights included)."""
    return sum(op_weight_bytes(op) for op in dense_layer_ops(kind, tp))
