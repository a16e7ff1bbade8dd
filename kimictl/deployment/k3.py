"""Kimi K3 facts on vLLM 0.33.0, as constants: the single source of truth other modules import.

Everything here is quoted from the vllm==0.33.0 wheel's sources (vllm/models/kimi_k3/nvidia/;
tests/test_rules_deployment.py reads the reasons from vLLM's own `unsupported()`). Strings that
vLLM itself prints (the 18 `unsupported()` reasons, the decode_backend error) are kept
byte-for-byte so that kimictl's findings match what an operator sees in vLLM's log.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ADDITIONAL_CONFIG_CHOICES",
    "ALLOWED_TP",
    "DECODE_BACKENDS",
    "DECODE_BACKEND_AUTO",
    "DECODE_BACKEND_ERROR",
    "DECODE_BACKEND_SPECIALIZED",
    "DEFAULT_CUDAGRAPH_CAPTURE_SIZES",
    "ENV_AUX_ATTN_RES_STREAM",
    "ENV_GEMM_AR",
    "ENV_SHARD_SP_SHARED_EXPERT",
    "ENV_USE_V2_MODEL_RUNNER",
    "FULL_DECODE_CUDAGRAPH_MODES",
    "K3_MOE_CONFIG",
    "K3_MODEL_ID",
    "K3_SHAPES",
    "KDA_CACHE_DTYPES_OK",
    "MAX_PREPARED_TOKENS",
    "MAX_SPECULATIVE_TOKENS",
    "MULTICAST_ERRORS",
    "PREPARED_TOKEN_BATCHES",
    "REQUIRED_SPEC_METHOD",
    "RULES",
    "Rule",
    "SUPPORTED_COMPUTE_CAPABILITY_MAJOR",
    "UNSUPPORTED_PREFIX",
    "unsupported_message",
]

K3_MODEL_ID = "moonshotai/Kimi-K3"

# --- decode backend (`--additional-config '{"decode_backend": ...}'`) ---
DECODE_BACKEND_AUTO = "auto"  # default: stock decode
DECODE_BACKEND_SPECIALIZED = "latency_specialized"
DECODE_BACKENDS: tuple[str, ...] = (DECODE_BACKEND_AUTO, DECODE_BACKEND_SPECIALIZED)
DECODE_BACKEND_ERROR = "Supported decode_backend values are auto/latency_specialized"

# Other additional_config keys the K3 code reads, with their accepted values.
ADDITIONAL_CONFIG_CHOICES: dict[str, tuple[str, ...]] = {
    "decode_backend": DECODE_BACKENDS,
    "mla_core": ("auto", "tokenspeed", "trtllm"),
    "kda_decode_backend": ("auto", "native", "flashinfer", "triton"),
    "kda_spec_decode_backend": ("auto", "native", "flashinfer"),
    "kda_prefill_backend": ("auto", "triton", "flashkda", "flashinfer"),
}

# --- parallelism, speculation ---
ALLOWED_TP: tuple[int, ...] = (8, 16)
# decode_context_parallel_size must be 1 or equal to tensor_parallel_size (rule 7).
MAX_SPECULATIVE_TOKENS = 7
REQUIRED_SPEC_METHOD = "dspark"
SUPPORTED_COMPUTE_CAPABILITY_MAJOR = 10  # SM100 / SM103 (GB200 / GB300)

# --- prepared batches of the fast path, counted in TOKENS (q = 1 + num_speculative_tokens each) ---
PREPARED_TOKEN_BATCHES: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)
MAX_PREPARED_TOKENS = 64

# vLLM's default cudagraph capture sizes when none are given (1, 2, 4, then steps of 8 up to 256,
# then steps of 16 up to 512). An assumption taken from vLLM's CompilationConfig defaults; kimictl
# only uses the part <= 64, which is 1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64.
DEFAULT_CUDAGRAPH_CAPTURE_SIZES: tuple[int, ...] = (
    (1, 2, 4) + tuple(range(8, 256, 8)) + tuple(range(256, 513, 16))
)

# cudagraph_mode values that capture FULL graphs for decode steps (rule 12 passes with these).
FULL_DECODE_CUDAGRAPH_MODES: tuple[str, ...] = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")

# KDA cache dtypes that pass rule 15: conv state BF16, recurrent (SSM) state FP32; "auto" = default.
KDA_CACHE_DTYPES_OK: dict[str, tuple[str, ...]] = {
    "mamba_cache_dtype": ("auto", "bfloat16"),
    "mamba_ssm_cache_dtype": ("auto", "float32"),
}

# --- environment variables ---
ENV_USE_V2_MODEL_RUNNER = "VLLM_USE_V2_MODEL_RUNNER"
ENV_GEMM_AR = "VLLM_KIMI_K3_GEMM_AR"  # default 1; all TP ranks must belong to one NVLink domain
ENV_AUX_ATTN_RES_STREAM = "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM"
ENV_SHARD_SP_SHARED_EXPERT = "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT"

# --- the text config the specialized MoE requires (rule 2) ---
K3_MOE_CONFIG: dict[str, object] = {
    "hidden_act": "situ",
    "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0,
    "num_experts": 896,
    "num_experts_per_token": 16,
    "num_expert_group": 1,
    "topk_group": 1,
    "moe_router_activation_func": "sigmoid",
}

K3_SHAPES: dict[str, int] = {
    "hidden_size": 7168,
    "num_layers": 93,
    "kda_layers": 69,
    "mla_layers": 24,
    "kda_heads": 96,
    "kda_head_dim": 128,
    "kda_conv": 4,
    "mla_heads": 96,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_experts": 896,
    "num_experts_per_token": 16,
    "num_shared_experts": 2,
    "moe_intermediate_size": 3072,
    "latent_moe_width": 3584,
    "dense_intermediate_size": 33792,
    "vocab_size": 163840,
    "max_context": 1_048_576,
}

# RuntimeError messages raised at build time when the TP group has no multicast memory.
MULTICAST_ERRORS: tuple[str, ...] = (
    "Kimi K3 specialized o-projection needs multicast memory",
    "Kimi K3 specialized two-shot all-reduce needs multicast memory",
    "Kimi K3 specialized MLA DCP needs multicast memory",
)

# --- the 18 checks of `unsupported(vllm_config)`, in vLLM's order ---
UNSUPPORTED_PREFIX = "Kimi K3 specialized decode does not support"


@dataclass(frozen=True)
class Rule:
    """One condition of vLLM's `unsupported()`: `reason` is vLLM's string, quoted exactly."""

    number: int
    id: str
    reason: str
    fails_when: str

    @property
    def message(self) -> str:
        return unsupported_message(self.reason)


def unsupported_message(reason: str) -> str:
    """vLLM's ValueError text: f"Kimi K3 specialized decode does not support {reason}"."""
    return f"{UNSUPPORTED_PREFIX} {reason}"


RULES: tuple[Rule, ...] = (
    Rule(1, "k3.gpu_arch", "this GPU (SM100/103)",
         "GPU is not compute-capability family 10.x (SM100/SM103)"),
    Rule(2, "k3.moe_config", "MoE configs but the one-group sigmoid top-16 SiTU MoE of Kimi K3",
         "text config MoE fields differ from Kimi K3's"),
    Rule(3, "k3.tp", "TP other than 8/16", "tensor_parallel_size not in (8, 16)"),
    Rule(4, "k3.pp", "pipeline parallelism", "pipeline_parallel_size != 1"),
    Rule(5, "k3.ep", "expert parallelism", "enable_expert_parallel"),
    Rule(6, "k3.dbo", "DBO", "use_ubatching (DBO)"),
    Rule(7, "k3.dcp", "decode context parallel other than 1 or TP",
         "decode_context_parallel_size not in (1, tensor_parallel_size)"),
    Rule(8, "k3.sleep_mode", "sleep mode", "enable_sleep_mode"),
    Rule(9, "k3.lora", "LoRA", "LoRA enabled"),
    Rule(10, "k3.model_runner", "the V1 model runner",
         "not using Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1 forces it)"),
    Rule(11, "k3.torch_compile", "torch.compile", "compilation mode STOCK_TORCH_COMPILE"),
    Rule(12, "k3.full_cudagraphs",
         "deployments without FULL decode CUDA graphs (e.g. enforce-eager)",
         "no FULL decode CUDA graphs (--enforce-eager, cudagraph_mode NONE/PIECEWISE)"),
    Rule(13, "k3.spec_method", "speculative methods but DSpark",
         "speculative method set and not dspark"),
    Rule(14, "k3.adaptive_verification", "adaptive verification", "enable_adaptive_verification"),
    Rule(15, "k3.kda_cache_dtype",
         "KDA cache dtypes other than a BF16 conv state and an FP32 recurrent state "
         "(mamba cache dtype)",
         "KDA cache dtypes != (bf16 conv state, fp32 recurrent state)"),
    Rule(16, "k3.replayssm", "ReplaySSM / RecoverSSM (--use-replayssm)", "--use-replayssm"),
    Rule(17, "k3.max_draft_tokens", "more than 7 speculative tokens", "num_speculative_tokens > 7"),
    Rule(18, "k3.aux_attn_res_stream", "the AttnRes aux stream",
         "speculation on and VLLM_KIMI_K3_AUX_ATTN_RES_STREAM set"),
)  # fmt: skip
