"""The decode model's constants that are not K3 shapes: value, unit and source of each."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "PARAMS",
    "Param",
    "param",
]


@dataclass(frozen=True)
class Param:
    """One model constant that is not a K3 shape: its value, unit and where the value comes from."""

    value: float
    unit: str
    source: str
    fitted: bool = False


PARAMS: dict[str, Param] = {
    "kernels_per_layer_stock": Param(
        23, "kernels", "published: one stock layer runs 23 kernels (k3-vllm-facts.md)"
    ),
    "kernels_per_layer_specialized": Param(
        13, "kernels", "published: one specialized layer runs 13 kernels (k3-vllm-facts.md)"
    ),
    "kernel_overhead_us_stock": Param(
        4.714,
        "us/kernel",
        "FITTED so that one TP16 GB300 layer at batch 1 costs the published 130 us in 23 kernels "
        "(calibrate() step 1). Cross-check: the intercept of the cuBLAS fit on the H200 "
        "(calibration.fit_kernel_bench) is 4.65 us",
        fitted=True,
    ),
    "hbm_efficiency_stock": Param(
        0.857,
        "of peak",
        "measured: least-squares slope of t = a + bytes/BW through cuBLAS at M=1 on the 12 K3 "
        "GEMM shapes of `kimictl kernels bench` on the H200 (tests/fixtures/"
        "runs/kernels_h200_bench.json, tensor-core run): 4.12 TB/s of 4.8 "
        "(calibration.fit_kernel_bench)",
    ),
    "hbm_efficiency_specialized": Param(
        0.974,
        "of peak",
        "measured: the same fit through the best kimictl CuTe DSL kernel per shape (same bench "
        "file): 4.68 TB/s of 4.8 (calibration.fit_kernel_bench)",
    ),
    "kernel_overhead_us_specialized": Param(
        4.096,
        "us/kernel",
        "FITTED so that one TP16 GB300 layer at batch 1 (8k context) costs the published 69 us in "
        "13 kernels (calibrate() step 1)",
        fitted=True,
    ),
    "routing_locality": Param(
        0.751,
        "share",
        "FITTED so that batch 1 on 16 GB300 with 7 draft tokens and AL 6 gives the published "
        "840 tokens/s (calibrate() step 2): share of a request's draft tokens that reuse the "
        "experts of the token before them. It absorbs every unmodelled saving of a q > 1 step "
        "(adjacent-token expert reuse, L2 prefetch); independent routing (0) gives 737 tokens/s",
        fitted=True,
    ),
    "allreduce_sync_rounds_stock": Param(
        3,
        "NVLink round trips",
        "assumed: stock all-reduce (custom / NCCL LL) pays a start barrier, the exchange and an "
        "end barrier; each is one NVLink latency of the system",
    ),
    "allreduce_sync_rounds_specialized": Param(
        1,
        "NVLink round trips",
        "assumed: the specialized path fuses the all-reduce into the o-projection with multicast "
        "mailboxes (k3-vllm-facts.md), one exchange and no separate barrier",
    ),
    "allreduces_per_layer": Param(
        2, "all-reduces", "shape: one after attention (o-proj), one after the MoE (row-parallel)"
    ),
    "step_overhead_us": Param(
        50.0,
        "us/step",
        "assumed: sampler, rejection sampler and scheduling gaps between graph replays (V2 model "
        "runner overlaps the CPU); bounded by the published 1.88-1.92x no-spec ratio: 0 us "
        "gives 1.88x at TP16 batch 1, 300 us 1.84x",
    ),
    "decode_flops_efficiency": Param(
        0.5,
        "of peak",
        "assumed: tensor-core efficiency of small-M decode GEMMs when compute, not bytes, binds "
        "(matters only at 100s of tokens per step)",
    ),
    "prefill_flops_efficiency": Param(
        0.4,
        "of peak",
        "assumed: no K3 prefill measurement exists; used for TTFT and for the cost prefills add "
        "to other users' decode steps",
    ),
    "draft_layers": Param(
        1,
        "target-layer equivalents",
        "assumed: the DSpark draft costs one target decoder layer at the step's token count plus "
        "an lm_head pass (vLLM's notes give no figure)",
    ),
    "kv_bytes_per_token_per_mla_layer": Param(
        656,
        "B",
        "assumed FP8 MLA cache layout: 512 FP8 latent + 4 FP32 scales + 64 BF16 rope = 656 B "
        "(vLLM's fp8_ds_mla layout)",
    ),
    "mxfp4_bytes_per_param": Param(
        0.53125, "B/param", "MXFP4: 4-bit values plus one 8-bit scale per 32 values"
    ),
    "activation_reserve_gib": Param(
        6.0,
        "GiB/GPU",
        "assumed: CUDA graphs, activations and workspaces outside the KV cache",
    ),
    "gpu_memory_utilization": Param(0.92, "share", "vLLM's default --gpu-memory-utilization"),
}


def param(name: str) -> float:
    return PARAMS[name].value
