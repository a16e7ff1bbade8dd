"""The ShapeDynamicSkinnyGemm compile units vLLM 0.33.0 requests for Kimi K3 on SM90 (H200).

`vllm/models/kimi_k3/nvidia/low_latency_gemm.py::enable_kimi_k3_low_latency_gemm` gives every
unquantized linear (and the LM head) whose local (N, K) is in the device's table a per-M plan and
asks `shape_dynamic_skinny_gemm.request_warmup_configs()` for the table entry's CuTe configs; at
TP8 the KDA projection overlap adds `KDA_QKVG_CONFIGS` and `KDA_M1_FAB_CONFIG`. vLLM's warmup then
compiles each `(dtype, SkinnyGemmConfig, has_residual)` key once per process (skinny_gemm.py
`ShapeDynamicSkinnyGemm._compile`). These are the only CuTe units vLLM compiles on SM90 besides
the KDA skinny GEMMs (`kda_skinny_gemm.py`, not derived here).

The set below is EVERY config of vLLM 0.33.0's `KIMI_K3_PROJECTIONS_SM90` (its entries are local
shapes of K3 modules at TP4..TP16), so a prebuilt cache covers whichever of them the model's
modules select; tests/test_vllm_prebuilt.py checks it against the wheel's table and against what
the real `enable_kimi_k3_low_latency_gemm` requests for a model holding every table shape. Not
derived: the SM100 and SM103 tables (their skinny units stay vLLM's JIT).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "KDA_OVERLAP_CONFIGS",
    "SM90_TABLE",
    "SkinnyUnit",
    "skinny_units",
]

# low_latency_gemm.py KIMI_K3_PROJECTIONS_SM90: (N, K) -> per-M (block_size, outputs_per_block,
# k_unroll, vector_width) for M = 1, 2, ...; entries with dsv3/cuBLAS only are listed empty.
SM90_TABLE: dict[tuple[int, int], tuple[tuple[int, int, int, int], ...]] = {
    (1536, 128): (),
    (3072, 128): (),
    (1536, 7168): (
        (224, 2, 4, 8), (128, 3, 2, 8), (128, 2, 1, 8), (128, 2, 1, 8), (128, 3, 1, 8),
        (128, 3, 1, 8),
    ),
    (3072, 7168): ((224, 2, 4, 8), (128, 2, 2, 8), (64, 4, 1, 8), (128, 6, 1, 8)),
    (2112, 7168): ((224, 2, 4, 8), (128, 4, 2, 8), (128, 2, 1, 8), (128, 2, 1, 8)),
    (2304, 1536): ((96, 4, 2, 8), (96, 4, 1, 8)),
    (4608, 1536): ((96, 4, 2, 4), (96, 4, 1, 8), (64, 4, 1, 8)),
    (3584, 7168): ((224, 2, 4, 8), (128, 4, 2, 8), (128, 2, 1, 8)),
    (6288, 7168): ((224, 2, 4, 8), (128, 4, 2, 8), (64, 4, 1, 8)),
    (12448, 7168): ((224, 2, 4, 8), (224, 4, 2, 8), (128, 2, 1, 8)),
    (7168, 768): ((96, 4, 2, 4), (96, 4, 1, 8)),
    (7168, 1536): ((96, 4, 2, 8), (96, 4, 1, 8)),
    (7168, 3072): ((96, 2, 4, 8), (64, 4, 2, 8), (64, 2, 2, 8)),
    (7168, 3584): ((224, 4, 2, 8), (64, 4, 2, 8), (64, 4, 2, 8)),
    (7168, 4224): ((96, 4, 2, 4), (32, 4, 2, 4)),
    (7168, 8448): ((96, 2, 4, 8), (32, 4, 2, 8)),
    (7168, 14336): ((224, 2, 4, 8), (128, 2, 2, 8)),
    (20480, 7168): ((224, 4, 2, 8), (224, 4, 2, 8), (128, 2, 1, 8)),
}  # fmt: skip

# low_latency_gemm.py KDA_QKVG_CONFIGS (M 1, 2) and KDA_M1_FAB_CONFIG: (M, block, outputs,
# k_unroll, vector width). Requested when a TP8 KDA layer's projections got vLLM's plan
# (_enable_kda_projection_overlap: tp_size 8, packed weight [6288, 7168], f_b [1536, 128]).
KDA_OVERLAP_CONFIGS: tuple[tuple[int, int, int, int, int], ...] = (
    (1, 64, 4, 2, 8),
    (2, 64, 3, 2, 8),
    (1, 224, 1, 2, 8),
)
KDA_OVERLAP_TP = 8


@dataclass(frozen=True, order=True)
class SkinnyUnit:
    """One `SkinnyGemmConfig` (field order as vLLM's) plus `has_residual`: vLLM's cache key is
    `(dtype, config, has_residual)`; the dtype is always bfloat16 for K3."""

    num_rows: int
    block_size: int
    outputs_per_block: int
    k_unroll: int = 1
    vector_width: int = 8
    static_k: int | None = None
    has_residual: bool = False

    @property
    def config(self) -> tuple[int, int, int, int, int, int | None]:
        """SkinnyGemmConfig's fields, in its order."""
        return (
            self.num_rows,
            self.block_size,
            self.outputs_per_block,
            self.k_unroll,
            self.vector_width,
            self.static_k,
        )

    @property
    def key(self) -> tuple[object, ...]:
        return ("bfloat16", *self.config, self.has_residual)

    @property
    def effective(self) -> tuple[object, ...]:
        """What the compiled code depends on: with a static K the loop is fully unrolled at
        trace time and `k_unroll` is never read (_skinny_gemm.py CuteSkinnyGemm.kernel)."""
        k_unroll = 0 if self.static_k is not None else self.k_unroll
        return ("bfloat16", *self.config[:3], k_unroll, *self.config[4:], self.has_residual)

    @property
    def name(self) -> str:
        sk = f"_sk{self.static_k}" if self.static_k is not None else ""
        res = "_res" if self.has_residual else ""
        return (
            f"skinny_m{self.num_rows}_b{self.block_size}_o{self.outputs_per_block}"
            f"_u{self.k_unroll}_v{self.vector_width}{sk}{res}"
        )


def skinny_units(arch: str, tp: int) -> list[SkinnyUnit] | None:
    """vLLM's skinny units for `arch` at TP `tp` (sorted, one per vLLM key); None where not
    derived (every arch but sm_90a)."""
    if arch != "sm_90a":
        return None
    units = {
        SkinnyUnit(m, *cfg)
        for configs in SM90_TABLE.values()
        for m, cfg in enumerate(configs, start=1)
    }
    if tp == KDA_OVERLAP_TP:
        units.update(SkinnyUnit(*cfg) for cfg in KDA_OVERLAP_CONFIGS)
    return sorted(units)
