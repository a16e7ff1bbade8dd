"""The values vLLM 0.33's K3 gate reads, derived from a launch line the way vLLM derives them.

vLLM does not judge the raw flags: `unsupported(vllm_config)` (vllm/models/kimi_k3/nvidia/
specialized_decode/runtime/__init__.py) reads the VllmConfig that `EngineArgs.
create_engine_config()` BUILDS, after defaults, env parsing and derivations. `effective_config()`
is kimictl's one model of that build, for the values the gate reads; the deployment rules
(kimictl.runtime.checks.rules.deployment) judge these values, never the raw flags. Each derivation
cites the vLLM 0.33.0 function it mirrors. tests/test_doctor_vs_vllm.py checks this module
against vLLM's real code on generated deployments.

Not modelled (kimictl says so where it matters): HiSparse and watermark configs (both force the
V2 runner), KV-transfer connectors and pooling/encoder-decoder models (they change the CUDA-graph
mode), MoonEP all2all (disables CUDA graphs, only with expert parallelism, which fails rule 5
first), draft models whose config.json is not local.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kimictl.core.outputs import read_json_object

if TYPE_CHECKING:
    from kimictl.deployment.spec import DeploymentSpec

__all__ = ["Effective", "Refusal", "effective_config", "model_text_config"]

# vllm/transformers_utils/configs/kimi_linear.py:KimiLinearConfig.__init__ defaults of the fields
# the gate compares (K3's text config class; KimiK3Config builds it from `text_config`).
KIMI_LINEAR_DEFAULTS: dict[str, Any] = {
    "hidden_act": "silu",
    "activation_situ_beta": None,
    "activation_situ_linear_beta": None,
    "num_experts": None,
    "num_experts_per_token": None,
    "num_expert_group": 1,
    "topk_group": 1,
    "moe_router_activation_func": "sigmoid",
}
_ROUTER_FUNCS = ("softmax", "sigmoid")  # KimiLinearConfig asserts one of these

# vllm/config/speculative.py:MTPModelTypes (method names that mean "mtp")
_MTP_METHODS = frozenset(
    "deepseek_mtp mimo_mtp mimo_v2_mtp glm4_moe_mtp glm4_moe_lite_mtp glm_ocr_mtp ernie_mtp "
    "nemotron_h_mtp exaone_moe_mtp exaone4_5_mtp qwen3_next_mtp qwen4_exp_mtp qwen3_5_mtp "
    "longcat_flash_mtp bailing_hybrid_v3_mtp minimax_m3_mtp bailing_hybrid_mtp mtp kimi_k3_mtp "
    "pangu_ultra_moe_mtp step3p5_mtp step5_mtp hy_v3_mtp hy_v4_mtp gemma4_mtp inkling_mtp "
    "glm5_next_mtp".split()
)
# vllm/config/vllm.py:OPTIMIZATION_LEVEL_00..03 ["compilation_config"]["cudagraph_mode"]
_LEVEL_CUDAGRAPH_MODE = {
    0: "NONE",
    1: "PIECEWISE",
    2: "FULL_AND_PIECEWISE",
    3: "FULL_AND_PIECEWISE",
}
_DEFAULT_OPTIMIZATION_LEVEL = 2  # vllm/config/vllm.py:VllmConfig.optimization_level = O2
# vllm/config/compilation.py:CompilationMode
_COMPILATION_MODES = {
    0: "NONE",
    1: "STOCK_TORCH_COMPILE",
    2: "DYNAMO_TRACE_ONCE",
    3: "VLLM_COMPILE",
}
_FULL_DECODE = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")  # CUDAGraphMode.decode_mode()
# vllm/utils/torch_utils.py:STR_DTYPE_TO_TORCH_DTYPE names for --dtype / cache dtypes
_DTYPE_NAMES = {
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
}


@dataclass(frozen=True)
class Refusal:
    """vLLM raises while building the config (before the gate): `message` is its text."""

    message: str
    fix: str


@dataclass(frozen=True)
class Effective:
    text_config: dict[str, Any] | None  # the gate's 8 MoE fields after class defaults; None=unread
    v2_model_runner: bool
    v2_why: str  # how the runner was chosen
    compilation_mode: str  # CompilationMode name after vLLM's overrides
    compilation_why: str
    cudagraph_mode: str  # CUDAGraphMode name after vLLM's overrides
    cudagraph_why: str
    speculative_method: str | None  # None: no speculation
    method_why: str
    num_speculative_tokens: int
    adaptive_verification: bool
    ubatching: bool  # ParallelConfig.use_ubatching
    model_dtype: str
    kda_dtypes: tuple[str, str] | None  # (conv, recurrent); None: vLLM raises (see refusals)
    kda_why: str
    aux_stream: bool  # envs.VLLM_KIMI_K3_AUX_ATTN_RES_STREAM, read only with speculation
    refusals: list[Refusal] = field(default_factory=list)

    @property
    def decode_cudagraphs_full(self) -> bool:
        return self.cudagraph_mode in _FULL_DECODE


def _env_bool(env: dict[str, str], name: str) -> bool | None:
    """vllm/envs.py: `bool(int(os.getenv(name)))` (maybe_convert_bool); None when unset.
    Raises ValueError for values int() rejects, as vLLM does."""
    value = env.get(name)
    return None if value is None else bool(int(value))


def _extra_value(extra: list[str], *flags: str) -> str | None:
    """The last value given to any of `flags` in the verbatim extra words (`--f v` or `--f=v`)."""
    found: str | None = None
    for i, word in enumerate(extra):
        name, eq, value = word.partition("=")
        name = name.replace("_", "-") if name.startswith("--") else name
        if name in flags:
            if eq:
                found = value
            elif i + 1 < len(extra):
                found = extra[i + 1]
    return found


def _config_json(model: str) -> dict[str, Any] | None:
    return read_json_object(Path(model).expanduser() / "config.json")


def model_text_config(raw: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(the text config vLLM's gate reads, a refusal message or None) from config.json.

    vllm/transformers_utils/configs/kimi_k3.py:KimiK3Config builds `text_config` with
    KimiLinearConfig(**text_config) (KimiLinearConfig() when absent), so fields missing from
    config.json take KimiLinearConfig's defaults; a flat `kimi_linear` config is that class too.
    """
    model_type = raw.get("model_type")
    if model_type == "kimi_k3":
        given = raw.get("text_config")
        body = given if isinstance(given, dict) else {}
    elif model_type == "kimi_linear":
        body = raw
    else:  # another config class: its own values (its text config when nested), no K3 defaults
        nested = raw.get("text_config")
        return dict(nested if isinstance(nested, dict) else raw), None
    text = {**KIMI_LINEAR_DEFAULTS, **{k: body[k] for k in KIMI_LINEAR_DEFAULTS if k in body}}
    refusal = None
    if text["moe_router_activation_func"] not in _ROUTER_FUNCS:
        # KimiLinearConfig.__init__: assert moe_router_activation_func in (softmax, sigmoid)
        refusal = (
            "config.json: KimiLinearConfig accepts moe_router_activation_func softmax or "
            f"sigmoid, got {text['moe_router_activation_func']!r}"
        )
    return text, refusal


def _model_dtype(spec: DeploymentSpec, raw: dict[str, Any] | None) -> tuple[str, str | None]:
    """vllm/config/model.py:_get_and_verify_dtype / _resolve_auto_dtype on CUDA SM10x
    (supported dtypes bf16, fp16, fp32): `auto` takes the checkpoint's dtype, float32
    checkpoints are downcast to bfloat16."""
    given = (_extra_value(spec.extra_args, "--dtype") or "auto").lower()
    if given != "auto":
        name = _DTYPE_NAMES.get(given)
        if name is None:
            return "bfloat16", f"Unknown dtype: {given!r}"
        return name, None
    config_dtype = None
    if raw is not None:
        nested = raw.get("text_config")
        text: dict[str, Any] = nested if isinstance(nested, dict) else {}
        config_dtype = raw.get("dtype") or raw.get("torch_dtype") or text.get("torch_dtype")
    if config_dtype in ("float16", "half"):
        return "float16", None
    return "bfloat16", None


def _speculation(
    spec: DeploymentSpec, refusals: list[Refusal]
) -> tuple[str | None, str, int, bool, dict[str, Any]]:
    """(method, why, num_speculative_tokens, adaptive, config) as vLLM resolves them.

    vllm/engine/arg_utils.py:EngineArgs.create_speculative_config merges --spec-method,
    --spec-model and --spec-tokens into the JSON (a key given both ways is refused) and
    normalises '-' in keys to '_'; vllm/config/speculative.py:SpeculativeConfig.__post_init__
    infers the method from the draft model.
    """
    config = dict(spec.speculative_config or {}) if spec.speculative_config is not None else None
    for flag, key in (
        ("--spec-method", "method"),
        ("--spec-model", "model"),
        ("--spec-tokens", "num_speculative_tokens"),
    ):
        value = _extra_value(spec.extra_args, flag)
        if value is None:
            continue
        config = {} if config is None else config
        if key in config:
            refusals.append(
                Refusal(
                    f"{flag} and --speculative-config['{key}'] are mutually exclusive",
                    f"drop {flag} or the '{key}' key of --speculative-config",
                )
            )
        parsed: Any = value
        if key == "num_speculative_tokens":
            try:
                parsed = int(value)
            except ValueError:
                parsed = value
        config[key] = parsed
    if config is None:
        return None, "no speculative config", 0, False, {}
    config = {str(k).replace("-", "_"): v for k, v in config.items()}
    method = config.get("method")
    model = config.get("model")
    tokens = config.get("num_speculative_tokens")
    why = f"method {method}"
    draft: dict[str, Any] | None = None
    if method is None:
        if model in ("ngram", "[ngram]"):
            method, why = "ngram", 'model "ngram" means method ngram'
        elif model is None:
            if tokens is not None:
                refusals.append(
                    Refusal(
                        "num_speculative_tokens was provided but without speculative model.",
                        "set -sc.method dspark",
                    )
                )
            method, why = "draft_model", "no method and no model"
        else:
            method, why = "draft_model", "a model without a method is a draft model"
    if method in _MTP_METHODS:
        method = "mtp"
    if method == "[ngram]":
        method = "ngram"
    if isinstance(model, str) and model not in ("ngram", "[ngram]"):
        draft = _config_json(model)
        if method == "draft_model":
            # SpeculativeConfig.__post_init__: "Automatically detect the method" from the name
            low = model.lower()
            archs = (draft or {}).get("architectures") or []
            if "eagle-" in low:
                method = "eagle"
            elif "eagle3" in low:
                method = "eagle3"
            elif "dflash" in low or "MuseGlimmerAssistantModel" in archs:
                method = "dflash"
            elif "dspark" in low or "Qwen3DSparkModel" in archs or "Gemma4DSparkModel" in archs:
                method = "dspark"
            elif draft is not None and draft.get("model_type") in _MTP_METHODS:
                method = "mtp"
            if method != "draft_model":
                why = f"method {method} inferred from the draft model {model}"
    if tokens is None and method == "dspark":
        # DSpark's width defaults to the draft config's block_size (dspark_block_size)
        source = draft if draft is not None else (_config_json(spec.model) or {})
        tokens = source.get("block_size", source.get("dspark_block_size"))
    count = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0
    adaptive = bool(config.get("enable_adaptive_verification", False))
    return str(method), why, count, adaptive, config


def _v2_runner(
    spec: DeploymentSpec,
    env: dict[str, str],
    method: str | None,
    config: dict[str, Any],
    ubatching: bool,
    refusals: list[Refusal],
) -> tuple[bool, str]:
    """vllm/config/vllm.py:VllmConfig.use_v2_model_runner: VLLM_USE_V2_MODEL_RUNNER when set,
    else V2 unless _get_v2_model_runner_unsupported_features() lists something."""
    name = "VLLM_USE_V2_MODEL_RUNNER"
    try:
        forced = _env_bool(env, name)
    except ValueError:
        refusals.append(
            Refusal(
                f"invalid literal for int() with base 10: {env[name]!r}",
                f"{name} takes 0 or 1 (vLLM parses it with int())",
            )
        )
        forced = None
    if forced is not None:
        return forced, f"{name}={env[name]}"
    unsupported: list[str] = []
    if spec.distributed_executor_backend == "external_launcher" and (
        spec.pipeline_parallel_size > 1
    ):
        unsupported.append("pipeline parallelism with external_launcher")
    if method in ("suffix", "custom_class"):
        unsupported.append(f"speculative method '{method}'")
    if (
        method is not None
        and config.get("parallel_drafting")
        and method not in ("dflash", "dspark")
    ):
        unsupported.append("parallel drafting for EAGLE speculative decoding")
    if ubatching:  # _get_dbo_unsupported_features() with the env unset
        unsupported.append("dual batch overlap")
    if unsupported:
        return False, f"{name} unset and V2 does not support {', '.join(unsupported)}"
    return True, f"{name} unset: vLLM 0.33 defaults to Model Runner V2"


def _compilation(
    spec: DeploymentSpec, env: dict[str, str], level: int, v2: bool
) -> tuple[str, str, str, str]:
    """(compilation mode, why, cudagraph mode, why) after VllmConfig.__post_init__.

    - enforce_eager sets mode NONE and cudagraph_mode NONE;
    - _maybe_enable_breakable_cudagraph(): K3 is in DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES,
      so unless VLLM_USE_BREAKABLE_CUDAGRAPH is set to something other than "1", breakable
      CUDA graphs are on and the compilation mode is forced to NONE;
    - mode unset: VLLM_COMPILE above -O0, else NONE;
    - cudagraph_mode unset: the -O level's default (O0 NONE, O1 PIECEWISE, O2/O3
      FULL_AND_PIECEWISE, _apply_optimization_level_defaults);
    - _disable_cudagraphs_for_v2_stock_torch_compile(): stock torch.compile on V2 -> NONE;
    - _normalize_piecewise_cudagraph_mode(): piecewise modes without VLLM_COMPILE and without
      breakable graphs drop their piecewise part (PIECEWISE -> NONE, FULL_AND_PIECEWISE -> FULL).
    """
    cc = spec.compilation_config
    given_mode = cc.get("mode")
    mode: str | None = None
    if isinstance(given_mode, int) and not isinstance(given_mode, bool):
        mode = _COMPILATION_MODES.get(given_mode)
    elif isinstance(given_mode, str):
        mode = given_mode.upper().removeprefix("COMPILATIONMODE.")
    mode_why = f"-cc mode {given_mode}" if given_mode is not None else ""
    breakable_env = env.get("VLLM_USE_BREAKABLE_CUDAGRAPH")
    breakable = breakable_env is None or breakable_env == "1"
    if spec.enforce_eager:
        mode, mode_why = "NONE", "--enforce-eager"
    elif env.get("TORCH_COMPILE_DISABLE") == "1":
        mode, mode_why = "NONE", "TORCH_COMPILE_DISABLE=1"
    if breakable and not spec.enforce_eager:
        mode, mode_why = "NONE", "breakable CUDA graphs (K3's default) force compilation mode none"
    if mode is None:
        mode = "VLLM_COMPILE" if level > 0 else "NONE"
        mode_why = f"-O{level} default"

    given_graphs = cc.get("cudagraph_mode")
    if given_graphs is not None:
        graphs, graphs_why = str(given_graphs).upper(), f"cudagraph_mode {given_graphs}"
    else:
        graphs, graphs_why = _LEVEL_CUDAGRAPH_MODE[level], f"the -O{level} default"
    if spec.enforce_eager:
        return mode, mode_why, "NONE", "--enforce-eager"
    if mode == "STOCK_TORCH_COMPILE" and v2:
        return mode, mode_why, "NONE", "stock torch.compile on Model Runner V2"
    if graphs in ("PIECEWISE", "FULL_AND_PIECEWISE") and mode != "VLLM_COMPILE" and not breakable:
        fallback = "NONE" if graphs == "PIECEWISE" else "FULL"
        return mode, mode_why, fallback, f"{graphs_why} needs VLLM_COMPILE; vLLM uses {fallback}"
    return mode, mode_why, graphs, graphs_why


def _kda_dtypes(
    spec: DeploymentSpec, model_dtype: str, refusals: list[Refusal]
) -> tuple[tuple[str, str] | None, str]:
    """vllm/model_executor/layers/mamba/mamba_utils.py:MambaStateDtypeCalculator.kda_state_dtype:
    conv = the mamba cache dtype (`auto`: the model dtype); recurrent = float32 for `auto`,
    else the given float32/bfloat16 (any other value raises)."""
    conv_given = spec.mamba_cache_dtype
    conv = model_dtype if conv_given == "auto" else _DTYPE_NAMES.get(conv_given, conv_given)
    ssm = spec.mamba_ssm_cache_dtype
    if ssm == "auto":
        recurrent = "float32"
    elif ssm in ("float32", "bfloat16"):
        recurrent = ssm
    else:
        if spec.decode_backend == "auto":  # only the gate computes these dtypes
            return None, f"--mamba-ssm-cache-dtype {ssm}"
        refusals.append(
            Refusal(
                f"KDA recurrent state supports only auto, float32, and bfloat16; got {ssm}",
                "--mamba-ssm-cache-dtype auto",
            )
        )
        return None, f"--mamba-ssm-cache-dtype {ssm}"
    why = f"conv {conv} ({'model dtype' if conv_given == 'auto' else '--mamba-cache-dtype'})"
    return (conv, recurrent), f"{why}, recurrent {recurrent}"


def _kv_cache_refusals(
    spec: DeploymentSpec, raw: dict[str, Any] | None, model_dtype: str
) -> list[Refusal]:
    """What vLLM raises for a --kv-cache-dtype on K3 (an MLA model with KDA layers)."""
    dtype = spec.kv_cache_dtype
    out = []
    if dtype in ("float16", "bfloat16") and dtype != model_dtype:
        # vllm/config/vllm.py:VllmConfig._reject_mismatched_float_kv_cache
        allowed = (
            f"`auto` or `{model_dtype}`" if model_dtype in ("float16", "bfloat16") else "`auto`"
        )
        out.append(
            Refusal(
                f'kv_cache_dtype="{dtype}" is incompatible with dtype="{model_dtype}". Please '
                f"set `--kv-cache-dtype` to {allowed}.",
                "--kv-cache-dtype fp8",
            )
        )
    if dtype.startswith("nvfp4") and not dtype.endswith("_ds_mla"):
        # vllm/config/vllm.py:VllmConfig.validate_nvfp4_kv_cache_with_mla (K3 uses MLA)
        out.append(
            Refusal(
                "nvfp4 KV cache is not supported with MLA (Multi-head Latent Attention) "
                "backends. Please use a different --kv-cache-dtype (e.g., 'fp8', 'auto', or "
                "'nvfp4_ds_mla' with a sparse MLA backend) for MLA models such as DeepSeek.",
                "--kv-cache-dtype fp8",
            )
        )
    if (dtype.startswith("turboquant_") or dtype == "ultraquant_4bit") and not _full_attn_listed(
        raw
    ):
        # vllm/model_executor/layers/quantization/turboquant/config.py:get_boundary_skip_layers
        # (K3 is hybrid and lists its full-attention layers only in linear_attn_config)
        out.append(
            Refusal(
                "TurboQuant KV cache requires identifiable full-attention layers, but none were "
                "found in the hybrid model config.",
                "--kv-cache-dtype fp8",
            )
        )
    return out


def _full_attn_listed(raw: dict[str, Any] | None) -> bool:
    """turboquant's _get_full_attention_layer_indices: layer_types / layers_block_type of the
    text config, attn_type_list of the top config."""
    raw = raw or {}
    nested = raw.get("text_config")
    text = nested if isinstance(nested, dict) else raw
    kinds = text.get("layer_types")
    if kinds is not None:
        return any(t in ("full_attention", "attention") for t in kinds)
    blocks = text.get("layers_block_type")
    if blocks is not None:
        return any(t in ("attention", "hybrid") for t in blocks)
    types = raw.get("attn_type_list")
    return types is not None and any(t == 1 for t in types)


_K3_ARCH = "KimiK3ForConditionalGeneration"
_DBO_ALL2ALL = ("deepep_low_latency", "deepep_high_throughput", "nixl_ep")


def _build_refusals(
    spec: DeploymentSpec,
    raw: dict[str, Any] | None,
    method: str | None,
    tokens: int,
    adaptive: bool,
    v2: bool,
    graphs: str,
    ubatching: bool,
) -> list[Refusal]:
    """What vLLM's config build raises for a K3 deployment, in vLLM's words."""
    out: list[Refusal] = []
    archs = (raw or {}).get("architectures") or [_K3_ARCH]
    arch = archs[0] if isinstance(archs, list) and archs else _K3_ARCH
    if spec.enable_lora and arch == _K3_ARCH:
        # vllm/config/lora.py:LoRAConfig.verify_with_model_config (K3 has no SupportsLoRA)
        out.append(
            Refusal(
                f"LoRA is not supported for {arch} ({spec.model}). Supported models implement "
                "the `SupportsLoRA` interface. Run this model without `enable_lora`.",
                "drop --enable-lora",
            )
        )
    if method == "dspark" and not v2:
        # vllm/config/vllm.py:_validate_v1_model_runner
        out.append(
            Refusal(
                "Model Runner V1 does not support: dspark speculative decoding",
                "leave VLLM_USE_V2_MODEL_RUNNER unset or set it to 1",
            )
        )
    if ubatching:
        if v2:
            # vllm/config/vllm.py:_get_dbo_unsupported_features (K3: multimodal and hybrid)
            out.append(
                Refusal(
                    "Model Runner V2 does not yet support: dual batch overlap with multimodal "
                    "models, dual batch overlap with hybrid models",
                    "drop --enable-dbo / --ubatch-size",
                )
            )
        elif _extra_value(spec.extra_args, "--all2all-backend") not in _DBO_ALL2ALL:
            # vllm/config/vllm.py:VllmConfig.__post_init__ (CUDA)
            out.append(
                Refusal(
                    "Microbatching currently only supports the "
                    f"{', '.join(_DBO_ALL2ALL)} all2all backends on this platform.",
                    "drop --enable-dbo / --ubatch-size",
                )
            )
    if method is not None and adaptive and graphs not in _FULL_DECODE:
        # vllm/config/vllm.py: adaptive verification check (has_full_cudagraphs())
        out.append(
            Refusal(
                "Adaptive verification requires full CUDA graphs. Use cudagraph mode FULL, "
                "FULL_DECODE_ONLY, or FULL_AND_PIECEWISE, or disable adaptive verification.",
                "drop -sc.enable_adaptive_verification",
            )
        )
    if method == "suffix":
        import importlib.util

        if importlib.util.find_spec("arctic_inference") is None:
            # vllm/config/speculative.py:SpeculativeConfig.__post_init__ (suffix decoding)
            out.append(
                Refusal(
                    "Arctic Inference is required for suffix decoding. Install via "
                    "`pip install arctic-inference==0.1.1`.",
                    f"set -sc.method {'dspark'}",
                )
            )
    speculating = method is not None and tokens > 0
    backend = _extra_value(spec.extra_args, "--mamba-backend") or "triton"
    if spec.use_replayssm and not speculating and v2 and backend == "triton":
        # vllm/config/vllm.py:VllmConfig.validate_mamba_cached_kernel (with speculation a KDA
        # model takes the RecoverSSM branch instead, which V2 accepts; the gate then fails)
        out.append(
            Refusal(
                "Triton ReplaySSM requires Model Runner V1; use --mamba-backend flashinfer or "
                "Model Runner V1",
                "drop --use-replayssm",
            )
        )
    return out


def effective_config(spec: DeploymentSpec, model_config: dict[str, Any] | None = None) -> Effective:
    """The gate's inputs as vLLM 0.33 builds them. `model_config` is the model's config.json
    (read from a local `spec.model` folder when not given; None when unreadable)."""
    refusals: list[Refusal] = []
    env = spec.env
    raw = model_config if model_config is not None else _config_json(spec.model)
    text: dict[str, Any] | None = None
    if raw is not None:
        text, bad = model_text_config(raw)
        if bad:
            refusals.append(Refusal(bad, "fix config.json (Kimi K3 uses sigmoid)"))

    method, method_why, tokens, adaptive, sc = _speculation(spec, refusals)
    ubatch = _extra_value(spec.extra_args, "--ubatch-size")
    try:
        ubatch_size = int(ubatch) if ubatch is not None else 0
    except ValueError:
        ubatch_size = 0
    ubatching = spec.enable_dbo or ubatch_size > 1  # ParallelConfig.use_ubatching
    v2, v2_why = _v2_runner(spec, env, method, sc, ubatching, refusals)
    level = (
        spec.optimization_level
        if spec.optimization_level is not None
        else _DEFAULT_OPTIMIZATION_LEVEL
    )
    mode, mode_why, graphs, graphs_why = _compilation(spec, env, level, v2)
    model_dtype, dtype_error = _model_dtype(spec, raw)
    if dtype_error:
        refusals.append(Refusal(dtype_error, "--dtype auto"))
    kda, kda_why = _kda_dtypes(spec, model_dtype, refusals)
    refusals.extend(_kv_cache_refusals(spec, raw, model_dtype))

    aux = False
    if method is not None:  # the gate reads the env only with speculation on
        try:
            aux = bool(_env_bool(env, "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM"))
        except ValueError:
            value = env["VLLM_KIMI_K3_AUX_ATTN_RES_STREAM"]
            if spec.decode_backend != "auto":  # stock decode never runs the gate
                refusals.append(
                    Refusal(
                        f"invalid literal for int() with base 10: {value!r}",
                        "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM takes 0 or 1 (vLLM parses it with int())",
                    )
                )
    refusals.extend(_build_refusals(spec, raw, method, tokens, adaptive, v2, graphs, ubatching))
    return Effective(
        text_config=text,
        v2_model_runner=v2,
        v2_why=v2_why,
        compilation_mode=mode,
        compilation_why=mode_why,
        cudagraph_mode=graphs,
        cudagraph_why=graphs_why,
        speculative_method=method,
        method_why=method_why,
        num_speculative_tokens=tokens,
        adaptive_verification=adaptive,
        ubatching=ubatching,
        model_dtype=model_dtype,
        kda_dtypes=kda,
        kda_why=kda_why,
        aux_stream=aux,
        refusals=refusals,
    )
