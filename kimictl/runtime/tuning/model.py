"""A per-decode-step performance model of Kimi K3 on vLLM, specialized path vs stock.

One decode step of one replica (TP GPUs) serving `batch` requests, each verifying q = 1 + draft
tokens, costs (per GPU, all 93 layers, then the lm_head and the draft):

    step = sum over layers of [ kernels x per-kernel overhead          (launch, ramp, tail)
                              + max(bytes / effective HBM bandwidth,   (weights, KV, KDA state)
                                    FLOPs / effective tensor peak)
                              + all-reduces (latency + NVLink bytes, one-shot or two-shot) ]
         + lm_head + draft model + per-step overhead

Bytes come from the K3 shapes in deployment.k3 (the one place they live): attention and dense
weights BF16 sharded by TP (the low-rank `a` projections replicated), routed experts MXFP4 for the
expected number of distinct experts touched by the step's tokens under top-16 of 896, shared
experts, per-request KDA state for 69 layers, and the MLA latent KV cache (FP8) for 24 layers at the
context length, split by DCP.

Speculation: tokens per request per step = acceptance length (AL); AL for d draft tokens follows a
geometric per-position acceptance calibrated from one measured (or assumed) AL.

The fast path covers prepared token batches (1..8, 16, 32, 64); bigger steps, and steps carrying a
prefill, run the stock forward: `fallback_share` says how often.

Every constant that is not a shape is in PARAMS with its value's source; `fitted=True` marks the
two that were fitted to a published figure (docs/tune.md has the calibration procedure).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from kimictl.core.errors import InputError
from kimictl.deployment import k3
from kimictl.runtime.tuning.params import PARAMS, Param, param
from kimictl.runtime.tuning.systems import SYSTEMS, System

__all__ = [
    "MODEL_VERSION",
    "PARAMS",
    "PATHS",
    "Config",
    "Param",
    "Prediction",
    "acceptance_length",
    "acceptance_rate_for",
    "checkpoint_bytes",
    "expected_distinct_experts",
    "fast_path_covers",
    "fitted_parameters",
    "kv_read_us",
    "layer_time_us",
    "predict",
    "N_LAYERS",
    "PathName",
    "default_acceptance_rate",
    "with_path",
]


MODEL_VERSION = "k3-decode-model/1"

PathName = Literal["specialized", "stock"]
PATHS: tuple[PathName, ...] = ("specialized", "stock")


# --- shapes (from deployment.k3, the single source of truth) --------------------------------------
_S = k3.K3_SHAPES
H = _S["hidden_size"]
N_LAYERS = _S["num_layers"]
N_KDA = _S["kda_layers"]
N_MLA = _S["mla_layers"]
N_DENSE = 1  # the first layer's FFN is dense (k3-vllm-facts.md: "first layer dense")
N_MOE = N_LAYERS - N_DENSE
N_EXPERTS = _S["num_experts"]
TOP_K = _S["num_experts_per_token"]
BF16 = 2
FP32 = 4


def _kda_params() -> tuple[float, float]:
    """(TP-sharded, replicated) parameters of one KDA attention block."""
    heads, dim = _S["kda_heads"], _S["kda_head_dim"]
    width = heads * dim
    sharded = 4 * H * width  # q, k, v, o projections
    sharded += 2 * dim * width  # f_b and g_b low-rank up-projections
    sharded += H * heads  # beta
    sharded += 3 * width * (_S["kda_conv"])  # short convolutions on q, k, v
    replicated = 2 * H * dim  # f_a and g_a low-rank down-projections
    return float(sharded), float(replicated)


def _mla_params() -> tuple[float, float]:
    """(TP-sharded, replicated) parameters of one MLA attention block."""
    heads = _S["mla_heads"]
    qk = _S["qk_nope_head_dim"] + _S["qk_rope_head_dim"]
    sharded = _S["q_lora_rank"] * heads * qk  # q_b
    sharded += _S["kv_lora_rank"] * heads * (_S["qk_nope_head_dim"] + _S["v_head_dim"])  # kv_b
    sharded += heads * _S["v_head_dim"] * H  # o_proj
    replicated = H * _S["q_lora_rank"] + H * (_S["kv_lora_rank"] + _S["qk_rope_head_dim"])
    return float(sharded), float(replicated)


EXPERT_PARAMS = 3.0 * _S["latent_moe_width"] * _S["moe_intermediate_size"]  # gate, up, down
SHARED_EXPERT_PARAMS = _S["num_shared_experts"] * 3.0 * H * _S["moe_intermediate_size"]
LATENT_PROJ_PARAMS = 2.0 * H * _S["latent_moe_width"]  # latent down + up, TP-sharded
ROUTER_PARAMS = float(H * N_EXPERTS)  # replicated
DENSE_FFN_PARAMS = 3.0 * H * _S["dense_intermediate_size"]
LM_HEAD_PARAMS = float(_S["vocab_size"] * H)
KDA_STATE_BYTES = float(_S["kda_heads"] * _S["kda_head_dim"] ** 2 * FP32)  # per request, layer
KDA_CONV_BYTES = float(3 * _S["kda_heads"] * _S["kda_head_dim"] * (_S["kda_conv"] - 1) * BF16)


def checkpoint_bytes() -> float:
    """Bytes of all weights (routed experts MXFP4, everything else BF16)."""
    kda_s, kda_r = _kda_params()
    mla_s, mla_r = _mla_params()
    attn = N_KDA * (kda_s + kda_r) + N_MLA * (mla_s + mla_r)
    moe_bf16 = N_MOE * (SHARED_EXPERT_PARAMS + LATENT_PROJ_PARAMS + ROUTER_PARAMS)
    routed = N_MOE * N_EXPERTS * EXPERT_PARAMS * param("mxfp4_bytes_per_param")
    embed = 2 * LM_HEAD_PARAMS  # embedding + lm_head
    return (attn + moe_bf16 + N_DENSE * DENSE_FFN_PARAMS + embed) * BF16 + routed


def weight_bytes_per_gpu(tp: int) -> float:
    kda_s, kda_r = _kda_params()
    mla_s, mla_r = _mla_params()
    sharded = N_KDA * kda_s + N_MLA * mla_s
    sharded += N_MOE * (SHARED_EXPERT_PARAMS + LATENT_PROJ_PARAMS) + N_DENSE * DENSE_FFN_PARAMS
    sharded += 2 * LM_HEAD_PARAMS
    replicated = N_KDA * kda_r + N_MLA * mla_r + N_MOE * ROUTER_PARAMS
    routed = N_MOE * N_EXPERTS * EXPERT_PARAMS * param("mxfp4_bytes_per_param")
    return (sharded / tp + replicated) * BF16 + routed / tp


def expected_distinct_experts(tokens: float) -> float:
    """Expected distinct experts a step's tokens touch, each picking top-16 of 896 independently.

    E * (1 - (1 - k/E)^tokens): 16 for one token, about 120 for 8, 613 for 64.
    """
    if tokens <= 0:
        return 0.0
    return N_EXPERTS * (1.0 - (1.0 - TOP_K / N_EXPERTS) ** tokens)


def acceptance_length(rate: float, draft_tokens: int) -> float:
    """Tokens per request per step with d draft tokens and per-position acceptance `rate`.

    Geometric model: draft i survives with rate^i, so AL = 1 + rate + ... + rate^d.
    """
    return float(sum(rate**i for i in range(draft_tokens + 1)))


def acceptance_rate_for(al: float, draft_tokens: int) -> float:
    """The per-position rate that gives acceptance length `al` at `draft_tokens` (bisection)."""
    if draft_tokens <= 0:
        return 0.0
    if not 1.0 <= al <= draft_tokens + 1:
        raise InputError(
            f"acceptance length {al:g} is impossible with {draft_tokens} draft tokens; "
            f"allowed: 1 to {draft_tokens + 1}."
        )
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if acceptance_length(mid, draft_tokens) < al:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fast_path_covers(step_tokens: int) -> bool:
    """True when a step of this many tokens fits a prepared token batch (padded up to one)."""
    return 1 <= step_tokens <= k3.MAX_PREPARED_TOKENS


def padded_tokens(step_tokens: int) -> int:
    """The prepared batch a step is padded to (the step itself when beyond the largest)."""
    for size in k3.PREPARED_TOKEN_BATCHES:
        if size >= step_tokens:
            return size
    return step_tokens


@dataclass(frozen=True)
class Config:
    """One deployment of one replica and the load on it."""

    tp: int
    batch: int = 1  # requests in the decode step (concurrency per replica)
    dcp: int = 1
    draft_tokens: int = 0
    acceptance: float | None = None  # per-position acceptance rate; None = the default
    context: int = 8192
    output_len: int = 1024
    path: PathName = "specialized"

    @property
    def q(self) -> int:
        return 1 + self.draft_tokens

    @property
    def step_tokens(self) -> int:
        return self.batch * self.q


# The published setup's DSpark synthetic acceptance length 6 at 7 draft tokens (k3-vllm-facts.md);
# the default only when no measured acceptance is given, and always labelled "assumed".
DEFAULT_AL = 6.0
DEFAULT_AL_DRAFT_TOKENS = 7


def default_acceptance_rate() -> float:
    return acceptance_rate_for(DEFAULT_AL, DEFAULT_AL_DRAFT_TOKENS)


@dataclass(frozen=True)
class Prediction:
    """What the model predicts for one Config (times in microseconds)."""

    config: Config
    decode_step_us: float  # one decode step on this path, no prefill in it
    step_us: float  # the step a decoding user sees on average (fallbacks, others' prefills)
    tokens_per_step: float  # per request (the acceptance length)
    tokens_per_s: float  # one replica
    tokens_per_s_per_user: float
    tokens_per_s_per_gpu: float
    ttft_ms: float
    fallback_share: float  # share of steps that run the stock forward (specialized path)
    fits_memory: bool
    max_seqs_by_memory: int
    breakdown: dict[str, float] = field(default_factory=dict)

    def predicted(self) -> dict[str, float]:
        return {
            "tokens_per_s": round(self.tokens_per_s, 2),
            "tokens_per_s_per_user": round(self.tokens_per_s_per_user, 2),
            "tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 2),
            "step_us": round(self.step_us, 1),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            **self.predicted(),
            "decode_step_us": round(self.decode_step_us, 1),
            "tokens_per_step": round(self.tokens_per_step, 3),
            "ttft_ms": round(self.ttft_ms, 1),
            "fallback_share": round(self.fallback_share, 4),
            "fits_memory": self.fits_memory,
            "max_seqs_by_memory": self.max_seqs_by_memory,
            "breakdown_us": {key: round(value, 2) for key, value in self.breakdown.items()},
        }


def _allreduce_us(system: System, tp: int, message_bytes: float, path: PathName) -> float:
    """One all-reduce over TP ranks: the faster of one-shot and two-shot. With a measured curve
    (`system.comm`), that curve instead.

    one-shot: every rank reads the other tp-1 buffers: latency + (tp-1) * msg / link
    two-shot: reduce-scatter then all-gather: 2 latencies + 2 (tp-1)/tp * msg / link
    """
    if tp <= 1:
        return 0.0
    if system.comm is not None:  # measured (commcurve.py says how other TPs/GPUs are derived)
        measured_on = SYSTEMS[system.comm.system].nvlink_gb_s
        return system.comm.allreduce_us(tp, message_bytes, path, measured_on / system.nvlink_gb_s)
    rounds = param(f"allreduce_sync_rounds_{path}")
    latency = rounds * system.nvlink_latency_us
    link = system.nvlink_gb_s * 1e3  # bytes per us
    one_shot = latency + (tp - 1) * message_bytes / link
    two_shot = 2 * latency + 2 * (tp - 1) / tp * message_bytes / link
    return min(one_shot, two_shot)


def _hbm_bytes_per_us(system: System, path: PathName) -> float:
    return system.hbm_tb_s * 1e6 * param(f"hbm_efficiency_{path}")


def _kernel_overhead_us(system: System, path: PathName) -> float:
    """One kernel's launch overhead on `path`: measured on the node when the system carries it."""
    name = f"kernel_overhead_us_{path}"
    if system.overheads is not None:
        return system.overheads.values()[name]
    return param(name)


def fitted_parameters(system: System) -> dict[str, float]:
    """The fitted parameters a prediction on `system` uses, by name (what the system's measured
    overheads replace is not among them)."""
    measured = system.overheads.values() if system.overheads is not None else {}
    return {n: p.value for n, p in PARAMS.items() if p.fitted and n not in measured}


def _layer_bytes_flops(
    kind: Literal["kda", "mla"],
    ffn: Literal["moe", "dense"],
    cfg: Config,
    experts_tokens: float,
) -> tuple[float, float]:
    """(bytes, FLOPs) one GPU moves/does for one layer of this step."""
    tp, tokens = cfg.tp, cfg.step_tokens
    if kind == "kda":
        sharded, replicated = _kda_params()
        # recurrent state: read once, written after each of the q positions (spec rollback)
        state = cfg.batch * (KDA_STATE_BYTES * (1 + cfg.q) + 2 * KDA_CONV_BYTES) / tp
        attn_flops = 2 * tokens * KDA_STATE_BYTES / FP32 * 2 / tp
    else:
        sharded, replicated = _mla_params()
        kv_token = param("kv_bytes_per_token_per_mla_layer")
        state = cfg.batch * cfg.context * kv_token / cfg.dcp
        heads = _S["mla_heads"] / tp
        latent = 2 * _S["kv_lora_rank"] + _S["qk_rope_head_dim"]  # QK^T and PV in latent space
        attn_flops = 2 * tokens * heads * cfg.context / cfg.dcp * latent
    weights = (sharded / tp + replicated) * BF16
    weight_flops = 2 * tokens * (sharded / tp + replicated)
    if ffn == "moe":
        experts = expected_distinct_experts(experts_tokens)
        weights += experts * EXPERT_PARAMS * param("mxfp4_bytes_per_param") / tp
        weights += (SHARED_EXPERT_PARAMS + LATENT_PROJ_PARAMS) / tp * BF16 + ROUTER_PARAMS * BF16
        ffn_params = TOP_K * EXPERT_PARAMS + SHARED_EXPERT_PARAMS + LATENT_PROJ_PARAMS
        weight_flops += 2 * tokens * (ffn_params / tp + ROUTER_PARAMS)
    else:
        weights += DENSE_FFN_PARAMS / tp * BF16
        weight_flops += 2 * tokens * DENSE_FFN_PARAMS / tp
    return weights + state, weight_flops + attn_flops


def _experts_tokens(cfg: Config) -> float:
    """Independent-routing equivalent of the step's tokens (draft tokens share some experts)."""
    per_request = 1 + (cfg.q - 1) * (1 - param("routing_locality"))
    return cfg.batch * per_request


def layer_time_us(
    system: System,
    cfg: Config,
    kind: Literal["kda", "mla"] = "mla",
    ffn: Literal["moe", "dense"] = "moe",
    *,
    path: PathName | None = None,
) -> dict[str, float]:
    """One layer's time on `path` (default cfg.path), split into its parts (microseconds)."""
    path = path or cfg.path
    nbytes, flops = _layer_bytes_flops(kind, ffn, cfg, _experts_tokens(cfg))
    memory = nbytes / _hbm_bytes_per_us(system, path)
    compute = flops / (system.bf16_tflops * 1e6 * param("decode_flops_efficiency"))
    kernels = param(f"kernels_per_layer_{path}") * _kernel_overhead_us(system, path)
    message = padded_tokens(cfg.step_tokens) * H * BF16
    comm = param("allreduces_per_layer") * _allreduce_us(system, cfg.tp, message, path)
    if kind == "mla" and cfg.dcp > 1:
        # DCP: partial attention outputs and their log-sum-exp are combined across the DCP group
        partial = cfg.step_tokens * _S["mla_heads"] / cfg.tp * (_S["kv_lora_rank"] + 1) * FP32
        comm += _allreduce_us(system, cfg.dcp, partial, path)
        if path == "stock":  # a separate combine kernel; the specialized MLA fuses it
            kernels += _kernel_overhead_us(system, "stock")
    data = max(memory, compute)
    return {
        "kernels": kernels,
        "memory": memory,
        "compute": compute,
        "data": data,
        "comm": comm,
        "total": kernels + data + comm,
    }


def _decode_step(system: System, cfg: Config, path: PathName) -> dict[str, float]:
    """Per-part microseconds of one decode step (all layers, lm_head, draft, overhead)."""
    parts = {"kernels": 0.0, "data": 0.0, "comm": 0.0}
    layer_mix: list[tuple[Literal["kda", "mla"], Literal["moe", "dense"], int]] = [
        ("kda", "moe", N_KDA - N_DENSE),
        ("kda", "dense", N_DENSE),
        ("mla", "moe", N_MLA),
    ]
    for kind, ffn, count in layer_mix:
        one = layer_time_us(system, cfg, kind, ffn, path=path)
        for key in parts:
            parts[key] += count * one[key]
    lm_head = LM_HEAD_PARAMS / cfg.tp * BF16 / _hbm_bytes_per_us(system, path)
    parts["lm_head"] = lm_head
    draft = 0.0
    if cfg.draft_tokens:
        one = layer_time_us(system, cfg, "mla", "dense", path=path)
        draft = param("draft_layers") * one["total"] + lm_head
    parts["draft"] = draft
    parts["overhead"] = param("step_overhead_us")
    parts["total"] = sum(parts.values())
    return parts


def _prefill_us(system: System, cfg: Config) -> float:
    """Compute-bound prefill of one request's context on one replica."""
    kda_s, kda_r = _kda_params()
    mla_s, mla_r = _mla_params()
    active = (
        N_KDA * (kda_s + kda_r)
        + N_MLA * (mla_s + mla_r)
        + N_MOE * (TOP_K * EXPERT_PARAMS + SHARED_EXPERT_PARAMS + LATENT_PROJ_PARAMS)
        + N_DENSE * DENSE_FFN_PARAMS
        + LM_HEAD_PARAMS / max(cfg.context, 1)  # logits only for the last token
    )
    flops = 2.0 * active * cfg.context
    rate = cfg.tp * system.bf16_tflops * 1e6 * param("prefill_flops_efficiency")
    return flops / rate


def _kv_bytes_per_request_per_gpu(cfg: Config) -> float:
    mla = (
        N_MLA * (cfg.context + cfg.output_len) * param("kv_bytes_per_token_per_mla_layer") / cfg.dcp
    )
    kda = N_KDA * (KDA_STATE_BYTES * (1 + cfg.q) + KDA_CONV_BYTES) / cfg.tp
    return mla + kda


def kv_read_us(system: System, cfg: Config) -> float:
    """Time one decode step spends reading the MLA KV cache (all 24 layers, split by DCP)."""
    kv = N_MLA * cfg.batch * cfg.context * param("kv_bytes_per_token_per_mla_layer") / cfg.dcp
    return kv / _hbm_bytes_per_us(system, cfg.path)


def max_seqs_by_memory(system: System, cfg: Config) -> int:
    """Requests whose KV cache and KDA state fit next to the weights on every GPU."""
    gib = 1024**3
    budget = system.hbm_gib * gib * param("gpu_memory_utilization")
    free = budget - weight_bytes_per_gpu(cfg.tp) - param("activation_reserve_gib") * gib
    if free <= 0:
        return 0
    return int(free // _kv_bytes_per_request_per_gpu(cfg))


def _tokens_per_step(cfg: Config) -> float:
    if cfg.draft_tokens == 0:
        return 1.0
    rate = cfg.acceptance if cfg.acceptance is not None else default_acceptance_rate()
    return acceptance_length(rate, cfg.draft_tokens)


def predict(system: System, cfg: Config) -> Prediction:
    """The model's prediction for one configuration on one system."""
    if cfg.tp <= 0 or cfg.batch <= 0 or cfg.dcp not in (1, cfg.tp):
        raise InputError(
            f"cannot model tp={cfg.tp}, dcp={cfg.dcp}, batch={cfg.batch}; tp and batch must be "
            f"positive and dcp 1 or tp."
        )
    al = _tokens_per_step(cfg)
    stock = _decode_step(system, cfg, "stock")
    own = stock if cfg.path == "stock" else _decode_step(system, cfg, "specialized")
    prefill = _prefill_us(system, cfg)
    # requests finishing (and new ones prefilling) per step: batch * AL / output_len.
    arrivals_all = cfg.batch * al / cfg.output_len
    arrivals_others = (cfg.batch - 1) * al / cfg.output_len
    covered = cfg.path == "specialized" and fast_path_covers(cfg.step_tokens)

    def mixed(arrivals: float) -> tuple[float, float]:
        with_prefill = 1.0 - math.exp(-arrivals)  # steps that carry a prefill chunk
        fallback = (with_prefill if covered else 1.0) if cfg.path == "specialized" else 0.0
        slow = fallback * (stock["total"] - own["total"])
        return own["total"] + slow + arrivals * prefill, fallback

    step_user, fallback_user = mixed(arrivals_others)
    step_all, _ = mixed(arrivals_all)
    tokens_per_s = cfg.batch * al / step_all * 1e6
    fit = max_seqs_by_memory(system, cfg)
    breakdown = {key: value for key, value in own.items() if key != "total"}
    breakdown["fallback_and_prefill"] = step_user - own["total"]
    return Prediction(
        config=cfg,
        decode_step_us=own["total"],
        step_us=step_user,
        tokens_per_step=al,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_user=al / step_user * 1e6,
        tokens_per_s_per_gpu=tokens_per_s / cfg.tp,  # DCP adds no GPUs
        ttft_ms=(prefill + own["total"]) / 1e3,
        fallback_share=fallback_user,
        fits_memory=fit >= cfg.batch,
        max_seqs_by_memory=fit,
        breakdown=breakdown,
    )


def with_path(cfg: Config, path: PathName) -> Config:
    return replace(cfg, path=path)
