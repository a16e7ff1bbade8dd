"""Generated K3 deployments for the differential test (tests/test_doctor_vs_vllm.py).

A deployment is `vllm serve` words (model first), an environment, and the model folder's
config.json variant. Base: a ready K3 line (TP 8/16, FP8 KV, latency_specialized, sometimes DSpark
with 7 draft tokens, sometimes VLLM_USE_V2_MODEL_RUNNER=1). Mutations each touch one rule of vLLM's
gate or one derivation vLLM makes before it (defaults, -O levels, dtypes, spellings, env values).
"""

from __future__ import annotations

import ast
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

K3_TEXT = {
    "model_type": "kimi_linear",
    "hidden_act": "situ",
    "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0,
    "num_experts": 896,
    "num_experts_per_token": 16,
    "num_expert_group": 1,
    "topk_group": 1,
    "moe_router_activation_func": "sigmoid",
    "hidden_size": 7168,
    "num_hidden_layers": 93,
    "num_attention_heads": 96,
    "vocab_size": 163840,
    "max_position_embeddings": 1048576,
    # MLA and KDA shapes: without them vLLM treats the model as GQA (and refuses DCP)
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4]},
}


def _k3(text: dict[str, Any] | None = None, drop: tuple[str, ...] = (), **top: Any) -> dict:
    body = {k: v for k, v in {**K3_TEXT, **(text or {})}.items() if k not in drop}
    config: dict[str, Any] = {
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "text_config": body,
        "torch_dtype": "bfloat16",
    }
    config.update(top)
    return config


# name -> config.json of the model folder
CONFIGS: dict[str, dict[str, Any]] = {
    "k3": _k3(),
    "no-router-func": _k3(drop=("moe_router_activation_func",)),  # class default: sigmoid
    "no-expert-groups": _k3(drop=("num_expert_group", "topk_group")),  # class defaults: 1, 1
    "int-betas": _k3({"activation_situ_beta": 4, "activation_situ_linear_beta": 25}),
    "no-hidden-act": _k3(drop=("hidden_act",)),  # class default: silu
    "no-situ-beta": _k3(drop=("activation_situ_beta",)),  # class default: None
    "softmax-router": _k3({"moe_router_activation_func": "softmax"}),
    "384-experts": _k3({"num_experts": 384}),
    "top-8": _k3({"num_experts_per_token": 8}),
    "8-groups": _k3({"num_expert_group": 8, "topk_group": 4}),
    "fp16-checkpoint": _k3(torch_dtype="float16"),
    "fp32-checkpoint": _k3(torch_dtype="float32"),
}

DSPARK_DRAFT = {
    "architectures": ["K3DSparkModel"],
    "model_type": "k3_dspark",
    "hidden_size": 7168,
    "num_hidden_layers": 1,
    "num_attention_heads": 96,
    "num_key_value_heads": 96,
    "vocab_size": 163840,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "intermediate_size": 18432,
    "target_layer_ids": [10, 40, 80],
    "num_target_layers": 3,
    "block_size": 8,
    "max_position_embeddings": 1048576,
    "torch_dtype": "bfloat16",
}


def make_models(root: Path) -> dict[str, Path]:
    """Model folders (config.json only) for every CONFIGS entry, plus two draft folders:
    `k3-dspark-draft` (vLLM infers method dspark from the name) and `draft` (it does not)."""
    paths: dict[str, Path] = {}
    for name, config in {**CONFIGS, "k3-dspark-draft": DSPARK_DRAFT, "draft": DSPARK_DRAFT}.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))
        paths[name] = folder
    return paths


@dataclass
class Deployment:
    words: list[str]  # after `vllm serve`, model first
    env: dict[str, str] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)

    def command(self) -> str:
        import shlex

        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*env, "vllm", "serve", *(shlex.quote(w) for w in self.words)])


Mutation = Callable[[Deployment, dict[str, Path], random.Random], None]
_SC = "--speculative-config"


def _spec(dep: Deployment) -> dict[str, Any] | None:
    if _SC in dep.words:
        return json.loads(dep.words[dep.words.index(_SC) + 1])  # type: ignore[no-any-return]
    return None


def _set_spec(dep: Deployment, spec: dict[str, Any] | None) -> None:
    if _SC in dep.words:
        i = dep.words.index(_SC)
        del dep.words[i : i + 2]
    if spec is not None:
        dep.words += [_SC, json.dumps(spec)]


def _ensure_spec(dep: Deployment, models: dict[str, Path]) -> dict[str, Any]:
    spec = _spec(dep)
    if spec is None:
        spec = {
            "method": "dspark",
            "model": str(models["k3-dspark-draft"]),
            "num_speculative_tokens": 7,
        }
        _set_spec(dep, spec)
    return spec


def _add(*words: str) -> Mutation:
    def mutate(dep: Deployment, models: dict[str, Path], rng: random.Random) -> None:
        dep.words += list(words)

    return mutate


def _env(name: str, value: str | None) -> Mutation:
    def mutate(dep: Deployment, models: dict[str, Path], rng: random.Random) -> None:
        if value is None:
            dep.env.pop(name, None)
        else:
            dep.env[name] = value

    return mutate


_TP_SPELLINGS = ("-tp", "--tensor-parallel-size", "--tensor_parallel_size")


def _tp(value: int, spelling: str = "-tp") -> Mutation:
    def mutate(dep: Deployment, models: dict[str, Path], rng: random.Random) -> None:
        i = next(i for i, w in enumerate(dep.words) if w in _TP_SPELLINGS)
        dep.words[i : i + 2] = [spelling, str(value)]

    return mutate


def _model(name: str) -> Mutation:
    def mutate(dep: Deployment, models: dict[str, Path], rng: random.Random) -> None:
        dep.words[0] = str(models[name])

    return mutate


def _spec_edit(**changes: Any) -> Mutation:
    def mutate(dep: Deployment, models: dict[str, Path], rng: random.Random) -> None:
        spec = _ensure_spec(dep, models)
        for key, value in changes.items():
            if value is None:
                spec.pop(key, None)
            elif value == "<draft>":
                spec[key] = str(models["draft"])
            else:
                spec[key] = value
        _set_spec(dep, spec)

    return mutate


def _spec_flags(dep: Deployment, models: dict[str, Path], rng: random.Random) -> None:
    """The same DSpark speculation spelled --spec-method/--spec-model/--spec-tokens."""
    _set_spec(dep, None)
    dep.words += ["--spec-method", "dspark", "--spec-model", str(models["k3-dspark-draft"])]
    dep.words += ["--spec-tokens", str(rng.choice([3, 7, 8]))]


def _no_spec(dep: Deployment, models: dict[str, Path], rng: random.Random) -> None:
    _set_spec(dep, None)


def _backend(value: str | None) -> Mutation:
    def mutate(dep: Deployment, models: dict[str, Path], rng: random.Random) -> None:
        i = dep.words.index("--additional-config")
        extra = {} if value is None else {"decode_backend": value}
        dep.words[i + 1] = json.dumps(extra)

    return mutate


# name -> mutation; names group into the classes the test reports.
MUTATIONS: dict[str, Mutation] = {
    # parallelism
    "tp4": _tp(4),
    "tp2-long": _tp(2, "--tensor-parallel-size"),
    "tp16-underscore": _tp(16, "--tensor_parallel_size"),
    "pp2": _add("-pp", "2"),
    "ep-short": _add("-ep"),
    "ep-long": _add("--enable-expert-parallel"),
    "ep-then-disable": _add("--enable-expert-parallel", "--disable-expert-parallel"),
    "ep-then-no": _add("--enable-expert-parallel", "--no-enable-expert-parallel"),
    "dbo": _add("--enable-dbo"),
    "ubatch-size": _add("--ubatch-size", "2"),
    "dcp2": _add("-dcp", "2"),
    "dcp-tp": _add("--decode-context-parallel-size", "8"),
    # features
    "sleep": _add("--enable-sleep-mode"),
    "sleep-then-disable": _add("--enable-sleep-mode", "--disable-sleep-mode"),
    "lora": _add("--enable-lora"),
    "lora-then-no": _add("--enable-lora", "--no-enable-lora"),
    "replayssm": _add("--use-replayssm"),
    # model runner
    "v2-env-1": _env("VLLM_USE_V2_MODEL_RUNNER", "1"),
    "v2-env-0": _env("VLLM_USE_V2_MODEL_RUNNER", "0"),
    "v2-env-unset": _env("VLLM_USE_V2_MODEL_RUNNER", None),
    "v2-env-true": _env("VLLM_USE_V2_MODEL_RUNNER", "true"),
    # compilation and graphs
    "cc-mode1": _add("-cc", '{"mode": 1}'),
    "cc-mode1-dotted": _add("-cc.mode", "1"),
    "cc-mode-name": _add("--compilation-config", '{"mode": "STOCK_TORCH_COMPILE"}'),
    "cc-mode3": _add("-cc", '{"mode": 3}'),
    "breakable-off": _env("VLLM_USE_BREAKABLE_CUDAGRAPH", "0"),
    "breakable-on": _env("VLLM_USE_BREAKABLE_CUDAGRAPH", "1"),
    "eager": _add("--enforce-eager"),
    "eager-then-no": _add("--enforce-eager", "--no-enforce-eager"),
    "O0": _add("-O0"),
    "O1": _add("-O1"),
    "O2": _add("-O2"),
    "O3": _add("-O3"),
    "O-space-1": _add("-O", "1"),
    "O-long-2": _add("--optimization-level", "2"),
    "O-eq-0": _add("-O=0"),
    "graphs-piecewise": _add("-cc.cudagraph_mode", "PIECEWISE"),
    "graphs-none": _add("-cc", '{"cudagraph_mode": "NONE"}'),
    "graphs-full": _add("-cc", '{"cudagraph_mode": "FULL"}'),
    "graphs-decode-only": _add("-cc.cudagraph_mode", "FULL_DECODE_ONLY"),
    "graphs-full-and-piecewise": _add("-cc", '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'),
    "graphs-lower": _add("-cc.cudagraph_mode", "piecewise"),
    "cc-mode-lower": _add("-cc", '{"mode": "stock_torch_compile"}'),
    "O0-graphs-full": _add("-O0", "-cc.cudagraph_mode", "FULL"),
    "torch-compile-disable": _env("TORCH_COMPILE_DISABLE", "1"),
    # speculation
    "spec-dspark7": _spec_edit(method="dspark", num_speculative_tokens=7),
    "spec-3": _spec_edit(num_speculative_tokens=3),
    "spec-8": _spec_edit(num_speculative_tokens=8),
    "spec-12": _spec_edit(num_speculative_tokens=12),
    "spec-ngram": _spec_edit(method="ngram", model=None, num_speculative_tokens=3),
    "spec-suffix": _spec_edit(method="suffix", model=None, num_speculative_tokens=3),
    "spec-model-no-method": _spec_edit(method=None, model="<draft>"),
    "spec-dspark-name-no-method": _spec_edit(method=None),
    "spec-adaptive": _spec_edit(enable_adaptive_verification=True),
    "spec-adaptive-dash": _spec_edit(**{"enable-adaptive-verification": True}),
    "spec-tokens-dash": _spec_edit(**{"num-speculative-tokens": 8, "num_speculative_tokens": None}),
    "spec-flags": _spec_flags,
    "spec-no-tokens": _spec_edit(num_speculative_tokens=None),  # DSpark: the draft's block_size
    "spec-ngram-model": _spec_edit(method=None, model="ngram", num_speculative_tokens=3),
    "no-spec": _no_spec,
    # KDA cache dtypes
    "mamba-fp32": _add("--mamba-cache-dtype", "float32"),
    "mamba-bf16": _add("--mamba-cache-dtype", "bfloat16"),
    "mamba-fp16": _add("--mamba-cache-dtype", "float16"),
    "ssm-bf16": _add("--mamba-ssm-cache-dtype", "bfloat16"),
    "ssm-fp32": _add("--mamba-ssm-cache-dtype", "float32"),
    "ssm-fp16": _add("--mamba-ssm-cache-dtype", "float16"),
    "dtype-half": _add("--dtype", "half"),
    "dtype-fp16": _add("--dtype", "float16"),
    "dtype-fp32": _add("--dtype", "float32"),
    "dtype-bf16": _add("--dtype", "bfloat16"),
    "dtype-auto": _add("--dtype", "auto"),
    # env
    "aux-1": _env("VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", "1"),
    "aux-0": _env("VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", "0"),
    "aux-2": _env("VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", "2"),
    "aux-true": _env("VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", "true"),
    # decode backend
    "backend-bad": _backend("fast"),
    "backend-auto": _backend("auto"),
    "backend-missing": _backend(None),
    "backend-dash-key": _add("--additional-config", '{"decode-backend": "latency_specialized"}'),
    # config.json variants
    **{f"config-{name}": _model(name) for name in CONFIGS if name != "k3"},
}

# Spellings vLLM's parser rejects: kimictl must call them bad input too.
BAD_SPELLINGS: dict[str, Mutation] = {
    "bad-O-dotted": _add("-O.mode", "1"),
    "bad-eager-value": _add("--enforce-eager=true"),
    "bad-O-json": _add("-O", '{"mode": 1}'),
    "bad-tp-word": _tp(0, "--tensor-parallel-size=abc"),
    "bad-cc-dash-key": _add("-cc", '{"cudagraph-mode": "FULL"}'),
    "bad-O-level": _add("-O", "7"),
}


def base(models: dict[str, Path], rng: random.Random) -> Deployment:
    words = [str(models["k3"]), "-tp", str(rng.choice([8, 16])), "--kv-cache-dtype", "fp8"]
    words += ["--additional-config", json.dumps({"decode_backend": "latency_specialized"})]
    dep = Deployment(words)
    if rng.random() < 0.5:
        dep.env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    if rng.random() < 0.6:
        _ensure_spec(dep, models)
    return dep


def _fix_bad_tp(dep: Deployment) -> None:
    # "--tensor-parallel-size=abc" replaced "-tp N": the value word must go as well
    for i, word in enumerate(dep.words):
        if word == "--tensor-parallel-size=abc" and i + 1 < len(dep.words):
            del dep.words[i + 1]
            return


# vLLM's cache dtype options and the Literal type that lists their values (vllm/config/cache.py)
CACHE_DTYPE_OPTIONS = {
    "--kv-cache-dtype": "CacheDType",
    "--mamba-cache-dtype": "MambaDType",
    "--mamba-ssm-cache-dtype": "MambaDType",
}


def cache_dtype_choices(sources: Path) -> dict[str, tuple[str, ...]]:
    """Every value vLLM's parser accepts for each cache dtype option, read from the Literal
    types in vLLM's own vllm/config/cache.py (the argparse choices come from them)."""
    tree = ast.parse((sources / "vllm" / "config" / "cache.py").read_text())
    literals: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Subscript)
            and getattr(node.value.value, "id", None) == "Literal"
        ):
            items = node.value.slice
            elts = items.elts if isinstance(items, ast.Tuple) else [items]
            literals[node.targets[0].id] = tuple(
                e.value for e in elts if isinstance(e, ast.Constant)
            )
    return {flag: literals[name] for flag, name in CACHE_DTYPE_OPTIONS.items()}


def cache_dtype_mutations(choices: dict[str, tuple[str, ...]]) -> dict[str, Mutation]:
    """One mutation per value of every cache dtype option (`--kv-cache-dtype=fp8_e5m2`, ...)."""
    return {
        f"{flag.strip('-')}={value}": _add(flag, value)
        for flag, values in choices.items()
        for value in values
    }


def generate(
    models: dict[str, Path],
    seed: int,
    count: int,
    *,
    extra: dict[str, Mutation] | None = None,
) -> list[Deployment]:
    """Every mutation (and every `extra` one) alone on two bases, every bad spelling, then random
    1-4 mutations until `count`."""
    rng = random.Random(seed)
    mutations = {**MUTATIONS, **(extra or {})}
    out: list[Deployment] = []
    for _ in range(3):
        out.append(base(models, rng))
        out[-1].tags = ["base"]
    for name, mutate in mutations.items():
        for _ in range(2):
            dep = base(models, rng)
            mutate(dep, models, rng)
            dep.tags = [name]
            out.append(dep)
    for name, mutate in BAD_SPELLINGS.items():
        dep = base(models, rng)
        mutate(dep, models, rng)
        if name == "bad-tp-word":
            _fix_bad_tp(dep)
        dep.tags = [name]
        out.append(dep)
    names = list(mutations)
    while len(out) < count:
        dep = base(models, rng)
        picked = rng.sample(names, rng.randint(1, 4))
        for name in picked:
            mutations[name](dep, models, rng)
        dep.tags = picked
        out.append(dep)
    return out
