"""The lab's kernel families (experiments no shipped path uses), for the shipped build tool:
`build(arch, configs=EXPERIMENTAL_CONFIGS, families=ALL_FAMILIES)`. They stay out of the shipped
build and of its source hash."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kimictl.kernels.toolchain.build import FAMILIES, LAYER_FAMILIES, Family

__all__ = ["ALL_FAMILIES", "EXPERIMENTAL_CONFIGS", "LAB_FAMILIES"]


def _lab(*names: str) -> tuple[str, ...]:
    return tuple(f"lab.kernels.{n}" for n in names)


def _gemm(*names: str) -> tuple[str, ...]:
    return tuple(f"kimictl.kernels.gemm.{n}" for n in names)


def _layer(*names: str) -> tuple[str, ...]:
    return tuple(f"kimictl.kernels.layer.{n}" for n in names)


LAB_FAMILIES: dict[str, Family] = {
    # RMSNorm folded into wstream's x loads
    "wsnorm_gemm": Family(
        "lab.kernels.wsnorm_gemm", "NORM_CONFIGS", "_compile_wsnorm",
        _lab("wsnorm_gemm", "wsnorm_gemm_dsl") + _gemm("wstream_gemm_dsl", "aot"),
    ),
    # the output gate / SiTU folded into the next GEMM's x loads
    "tcpro_gemm": Family(
        "lab.kernels.tcpro_gemm", "PRO_CONFIGS", "_compile_tcpro",
        _lab("tcpro_gemm", "tcpro_gemm_dsl")
        + _gemm("tcstream_gemm_dsl", "aot", "rowblock_dsl"),
        arches=("sm_90a",),
    ),
    # wgmma with x at a row stride of its own (KDA's f_b)
    "wgstride_gemm": Family(
        "lab.kernels.wgstride_gemm", "STRIDE_CONFIGS", "_compile_wgstride",
        _lab("wgstride_gemm", "wgstride_gemm_dsl")
        + _gemm("wgmma_gemm", "wgmma_gemm_dsl", "aot", "rowblock_dsl"),
        arches=("sm_90a",),
    ),
    # the dense layer's elementwise ops with PDL
    "layer_elem": Family(
        "lab.kernels.layer_elem", "ELEM_CONFIGS", "_compile_elem",
        _lab("layer_elem", "layer_elem_dsl") + _layer("elem", "elem_dsl"),
    ),
    # the dense layer as three persistent kernels: the search's sweep, the shipped SIMT kernel and
    # the lab's tensor-core form of it
    "layer_chain": replace(
        LAYER_FAMILIES["layer_chain"], module="lab.kernels.layer_chain", configs="CHAIN_CONFIGS",
        sources=LAYER_FAMILIES["layer_chain"].sources + _lab("layer_chain", "layer_chain_dsl")
        + _gemm("tcstream_gemm_dsl"),
    ),
}  # fmt: skip
ALL_FAMILIES: dict[str, Family] = {**FAMILIES, **LAB_FAMILIES}
EXPERIMENTAL_CONFIGS: tuple[Any, ...] = tuple(
    cfg for fam in LAB_FAMILIES.values() for cfg in getattr(fam.load(), fam.configs)
)
