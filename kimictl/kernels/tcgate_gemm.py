"""tcstream with MLA's sigmoid output gate applied to x as it is loaded (issue 17, experimental,
not shipped).

y[m, n] = (a[m] * sigmoid(g[m])) . w[n], with a = x (the attention core's output, K = the local
heads x v_head_dim) and g = the gate columns of the fused qkv_a/gate GEMM's output, passed as the
ABI's r pointer: r is read as [M, gate_w] with the gate at columns gate_off..gate_off + K. Each
x vector is rounded to bf16 after the product, as the separate gate kernel (and vLLM's
`a * sigmoid(gate)`) rounds it, so the GEMM sees the same operand. That removes the gate launch
between the attention core and o_proj. No residual (r carries the gate). Built only on request:
`build('sm_90a', configs=tcgate_gemm.gate_configs())` (benchmarks/layer_h200.py --make-build).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimictl.kernels.tcstream_gemm import TcStreamConfig

__all__ = ["GATE_CONFIGS", "TcGateConfig", "gate_configs"]

VEC = 8


@dataclass(frozen=True)
class TcGateConfig(TcStreamConfig):
    gate_w: int = 0  # row width of r (the fused qkv_a/gate output)
    gate_off: int = 0  # column of the gate in r
    kernel = "tcgate_gemm"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.residual:
            raise ValueError("tcgate has no residual: r carries the gate")
        if self.gate_w <= 0 or self.gate_w % VEC or self.gate_off % VEC:
            raise ValueError("gate_w (> 0) and gate_off must be multiples of 8 (16-byte vectors)")

    @property
    def name(self) -> str:
        base = super().name.removeprefix("tcstream")
        return f"tcgate{base}_x{self.gate_w}_o{self.gate_off}"


def gate_configs(ms: tuple[int, ...] = (1, 2, 4, 8, 16)) -> tuple[TcGateConfig, ...]:
    """o_proj's gated variants for K3's MLA layer at TP8: the tcstream tiles that measured
    fastest on o_proj (7168 x 1536) at M <= 8 on the H200 (w8 x u2 and u4, early trigger)."""
    from kimictl.kernels.layer_ops import dense_layer_ops

    ops = {op.name: op for op in dense_layer_ops("mla")}
    gate_w = ops["qkv_a_g"].n
    gate_off = gate_w - ops["out_gate"].n  # the gate is the last segment of that output
    return tuple(
        TcGateConfig(m, 8, u, 1, early=True, gate_w=gate_w, gate_off=gate_off)
        for m in ms
        for u in (2, 4)
    )


GATE_CONFIGS: tuple[TcGateConfig, ...] = ()  # built on request (layer_h200.py --make-build)


def _compile_tcgate(cfg: TcGateConfig, arch: str = "sm_90a") -> Any:
    from kimictl.kernels.aot import compile_gemm
    from kimictl.kernels.tcgate_gemm_dsl import TcGateGemm

    return compile_gemm(TcGateGemm(cfg), cfg.m, arch)
