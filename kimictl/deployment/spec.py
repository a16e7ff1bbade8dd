"""DeploymentSpec: one typed object for "how vLLM is launched".

It is parsed from a profile (runtime.profiles) or from an existing `vllm serve ...` command line
(`vllm_args.parse_vllm_command`), and renders back to argv + env (`to_argv`, `to_env`).
Round trip: `parse_vllm_command(spec.to_command()).spec == spec` for every spec (property-tested).

Conventions of the parser (vLLM 0.33 `vllm serve` syntax):
- leading `VAR=value` words are environment assignments (`spec.env`);
- `--flag value`, `--flag=value`, short forms `-tp -pp -dp -dcp -ep -sc -cc -O`;
- JSON flags (`--speculative-config`, `--compilation-config`, `--additional-config`) take JSON
  or the dotted form `--additional-config.decode_backend latency_specialized`; a dotted value
  is read as JSON when it parses (`3`, `true`, `[1,2]`) and as a plain string otherwise;
- `-O3` / `-O 3` / `-O=3` / `--optimization-level 3` set `optimization_level`; like vLLM 0.33,
  `-O.key value` and `-O '{json}'` are bad input (compilation keys go through -cc);
- switches take no value (`--enforce-eager=true` is bad input, as in vLLM) and have vLLM's
  negative forms `--no-X`, and `--disable-X` for `--enable-X`;
- `--spec-method/--spec-model/--spec-tokens`, `--dtype` and `--ubatch-size` stay in `extra_args`;
  kimictl.runtime.checks.rules.effective reads them there (as vLLM merges them into its config);
- speculative-config keys are normalised from `-` to `_` (vLLM does the same);
- `--cudagraph-capture-sizes 1 2 4` lands in `compilation_config["cudagraph_capture_sizes"]`;
- `--max-model-len` accepts `1k` (x1000), `1K` (x1024), and `auto` (kept as -1, vLLM's own value);
- `--api-key K` is moved into `env["VLLM_API_KEY"]` (secrets travel by environment);
- `--host` defaults to 127.0.0.1 (kimictl's default, not vLLM's): a spec always names its host;
- flags kimictl does not model are kept verbatim, in order, in `extra_args`; the ones that are not
  known vLLM flags at all are also listed in `ParseResult.unrecognised`.

Value types and bounds live in ONE table, `FIELD_CHECKS` (K3's accepted values come from
runtime.k3): the parser and the profile loader (runtime.profiles) both check every value they read
against it, so a bad value is the same InputError whichever way it enters. `DeploymentSpec(...)`
and `with_()` do not check: tools and tests build specs that the K3 rules then judge.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kimictl.core.apikeys import redact_env
from kimictl.core.errors import InputError
from kimictl.deployment import buckets, k3, traces

# The switch of kimictl's vLLM plugin (kimictl.kernels.vllm.plugin), rendered by profiles from
# `[serve] kimictl_kernels = true`
KERNELS_ENV_VAR = "KIMICTL_VLLM_KERNELS"
# The plugin's fused-layer switch (kimictl.kernels.vllm.layer_route), rendered by profiles from
# `[serve] kimictl_layer = true`
LAYER_ENV_VAR = "KIMICTL_VLLM_LAYER"
# The plugin's other input: a prebuilt CuTe unit cache folder (kimictl.kernels.vllm.prebuilt), set
# by `kimictl serve` when the profile's `[serve] prebuilt_units` is "auto" and a cache matches
PREBUILT_ENV_VAR = "KIMICTL_VLLM_PREBUILT"
# `[serve] prebuilt_units` when a profile does not set it (profiles.PREBUILT_MODES lists the rest)
PREBUILT_DEFAULT = "auto"

__all__ = [
    "DEFAULT_HOST",
    "FIELD_CHECKS",
    "JSON_FLAG_NAME",
    "KERNELS_ENV_VAR",
    "LAYER_ENV_VAR",
    "PREBUILT_DEFAULT",
    "PREBUILT_ENV_VAR",
    "DeploymentSpec",
    "ValueCheck",
    "check_field",
    "dump_json",
    "nonempty_text",
    "one_of",
    "parse_max_model_len",
    "redact_env",
]

DEFAULT_HOST = "127.0.0.1"


@dataclass(frozen=True)
class DeploymentSpec:
    """How vLLM is launched. Defaults are vLLM's own, except `host` (kimictl binds loopback).

    `None` means "not given: vLLM decides" (vLLM's default applies). `max_model_len == -1` is
    vLLM's `auto`.
    """

    model: str
    served_model_name: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    enable_expert_parallel: bool = False
    enable_dbo: bool = False
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    speculative_config: dict[str, Any] | None = None
    compilation_config: dict[str, Any] = field(default_factory=dict)
    optimization_level: int | None = None
    enforce_eager: bool = False
    additional_config: dict[str, Any] = field(default_factory=dict)
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    use_replayssm: bool = False
    enable_sleep_mode: bool = False
    enable_lora: bool = False
    host: str = DEFAULT_HOST
    port: int | None = None
    gpu_memory_utilization: float | None = None
    distributed_executor_backend: str | None = None
    # --custom-histogram-buckets: family -> seconds bounds (deployment.buckets derives them)
    custom_histogram_buckets: dict[str, list[float]] | None = None
    # --otlp-traces-endpoint: where vLLM sends one span per finished request (deployment.traces)
    otlp_traces_endpoint: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)

    # ---- derived facts the rules and tools use ----
    @property
    def num_speculative_tokens(self) -> int:
        """Draft tokens per step (0 without speculation)."""
        if not self.speculative_config:
            return 0
        value = self.speculative_config.get("num_speculative_tokens", 0)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def speculative_method(self) -> str | None:
        if not self.speculative_config:
            return None
        method = self.speculative_config.get("method")
        return str(method) if method is not None else None

    @property
    def tokens_per_request(self) -> int:
        """q: tokens each request carries per decode step (1 + draft tokens)."""
        return 1 + self.num_speculative_tokens

    @property
    def decode_backend(self) -> str:
        return str(self.additional_config.get("decode_backend", "auto"))

    @property
    def gpus_needed(self) -> int:
        """GPUs one deployment occupies: TP x PP x DP (DCP reuses the TP ranks)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    @property
    def cudagraph_capture_sizes(self) -> list[int] | None:
        sizes = self.compilation_config.get("cudagraph_capture_sizes")
        if isinstance(sizes, list) and all(isinstance(s, int) for s in sizes):
            return list(sizes)
        return None

    # ---- edits ----
    def with_(self, **changes: Any) -> DeploymentSpec:
        """A copy with `changes` applied; unknown field names are an InputError."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise InputError(
                f"DeploymentSpec has no field {', '.join(unknown)}; "
                f"allowed fields: {', '.join(sorted(names))}."
            )
        return dataclasses.replace(self, **changes)

    # ---- rendering ----
    def to_argv(self, executable: str = "vllm") -> list[str]:
        """`[executable, "serve", model, flags..., extra_args...]`; env is separate (to_env)."""
        argv = [executable, "serve", self.model]
        if self.served_model_name is not None:
            argv += ["--served-model-name", self.served_model_name]
        for spec_field, flag in _INT_FLAGS_RENDER:
            value = getattr(self, spec_field)
            default = _FIELD_DEFAULTS[spec_field]
            if value != default:
                argv += [flag, _render_int(spec_field, value)]
        if self.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", repr(float(self.gpu_memory_utilization))]
        for spec_field, flag in _STR_FLAGS_RENDER:
            value = getattr(self, spec_field)
            if value is not None and value != _FIELD_DEFAULTS[spec_field]:
                argv += [flag, value]
        argv += ["--host", self.host]
        for spec_field, flag in _BOOL_FLAGS_RENDER:
            if getattr(self, spec_field):
                argv.append(flag)
        if self.optimization_level is not None:
            argv.append(f"-O{self.optimization_level}")
        if self.speculative_config is not None:
            argv += ["--speculative-config", dump_json(self.speculative_config)]
        if self.compilation_config:
            argv += ["--compilation-config", dump_json(self.compilation_config)]
        if self.additional_config:
            argv += ["--additional-config", dump_json(self.additional_config)]
        if self.custom_histogram_buckets:
            argv += buckets.flag_for(self.custom_histogram_buckets)
        if self.otlp_traces_endpoint is not None:
            argv += ["--otlp-traces-endpoint", self.otlp_traces_endpoint]
        argv += list(self.extra_args)
        return argv

    def to_env(self) -> dict[str, str]:
        """Environment variables to add to the launch environment: with an OTLP/HTTP traces URL
        (path /v1/traces), the span exporter's settings too; what `env` sets wins."""
        if not traces.is_otlp_http(self.otlp_traces_endpoint):
            return dict(self.env)
        assert self.otlp_traces_endpoint is not None
        env = traces.tracing_env(self.otlp_traces_endpoint, host=self.host, port=self.port)
        return env | self.env

    def to_command(self, *, executable: str = "vllm", redact: bool = True) -> str:
        """One shell line `VAR=value ... vllm serve MODEL ...`; secrets redacted unless told."""
        env = redact_env(self.to_env()) if redact else self.to_env()
        words = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
        words += [shlex.quote(a) for a in self.to_argv(executable)]
        return " ".join(words)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["env"] = redact_env(self.env)
        return data


def parse_max_model_len(text: str, *, flag: str = "--max-model-len") -> int:
    """`4096`, `1k` (1000), `1K` (1024), `1m`, `1M`, `auto` (-1) -> int."""
    value = text.strip()
    if value.lower() in ("auto", "-1"):
        return -1
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", value)
    if not match:
        raise InputError(
            f"{flag} expects a number like 4096, 32k, 1M or auto, got {text!r}.",
        )
    number, suffix = match.groups()
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}
    result = float(number) * scale[suffix]
    if result != int(result):
        raise InputError(f"{flag} expects a whole number of tokens, got {text!r}.")
    return int(result)


# ---------------------------------------------------------------- value types and bounds

ValueCheck = Callable[[Any], Any]
"""Returns the value (normalised: int, float, list) or raises ValueError(what is allowed)."""


def nonempty_text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("a non-empty string")
    return value


def one_of(*allowed: str, ignore_case: bool = False) -> ValueCheck:
    """A check that accepts only `allowed` (vLLM upper-cases some enum names itself)."""

    def check(value: Any) -> str:
        key = value.upper() if ignore_case and isinstance(value, str) else value
        if key not in allowed:
            raise ValueError(" | ".join(f'"{a}"' for a in allowed))
        return str(value)

    return check


def _whole(low: int, high: int | None = None, allowed: str = "") -> ValueCheck:
    """A whole number in [low, high] (no upper bound when high is None)."""

    def check(value: Any) -> int:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < low
            or (high is not None and value > high)
        ):
            raise ValueError(allowed or f"a whole number >= {low}")
        return int(value)

    return check


def _switch(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("true or false")
    return value


def _number(low: float, high: float | None, allowed: str) -> ValueCheck:
    """A finite number in (low, high] (no upper bound when high is None); ints stay ints."""

    def check(value: Any) -> int | float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if (
            not ok
            or not math.isfinite(value)
            or value <= low
            or (high is not None and value > high)
        ):
            raise ValueError(allowed)
        return value

    return check


def _max_model_len(value: Any) -> int:
    allowed = 'a whole number >= 1, a size like "128k", or "auto"'
    if isinstance(value, str):
        try:
            value = parse_max_model_len(value, flag="max_model_len")
        except InputError:
            raise ValueError(allowed) from None
    if isinstance(value, bool) or not isinstance(value, int) or not (value >= 1 or value == -1):
        raise ValueError(allowed)
    return int(value)


def _sizes(value: Any) -> list[int]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        raise ValueError("a non-empty list of whole numbers >= 1, e.g. [1, 2, 4, 8]")
    return [int(v) for v in value]


def _words(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError('a list of strings, e.g. ["--trust-remote-code"]')
    return [str(v) for v in value]


def _fraction(value: Any) -> float:
    return float(_number(0, 1, "a number in (0, 1]")(value))


def _level_or_name(value: Any) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        raise ValueError("a whole number or a mode name")
    return value


_count = _whole(1)


def _bounds(value: Any) -> list[float]:
    return buckets.check_buckets({buckets.FAMILY: value})[buckets.FAMILY]


# Every value kimictl reads, by DeploymentSpec field, or `<json field>.<key>` for the keys of
# --speculative-config / --compilation-config / --additional-config that kimictl knows.
# Other JSON keys pass unchecked (vLLM owns them); a JSON null means "vLLM's default".
FIELD_CHECKS: dict[str, ValueCheck] = {
    "model": nonempty_text,
    "served_model_name": nonempty_text,
    "tensor_parallel_size": _count,
    "pipeline_parallel_size": _count,
    "data_parallel_size": _count,
    "decode_context_parallel_size": _count,
    "enable_expert_parallel": _switch,
    "enable_dbo": _switch,
    "kv_cache_dtype": nonempty_text,  # vLLM owns the dtype names
    "max_model_len": _max_model_len,
    "max_num_seqs": _count,
    "max_num_batched_tokens": _count,
    "optimization_level": _whole(0, 3, "0, 1, 2 or 3"),
    "enforce_eager": _switch,
    "mamba_cache_dtype": nonempty_text,
    "mamba_ssm_cache_dtype": nonempty_text,
    "use_replayssm": _switch,
    "enable_sleep_mode": _switch,
    "enable_lora": _switch,
    "host": nonempty_text,
    "port": _whole(1, 65535, "a port number 1-65535"),
    "gpu_memory_utilization": _fraction,
    "distributed_executor_backend": one_of("mp", "ray", "uni", "external_launcher"),
    "extra_args": _words,
    "speculative_config.method": nonempty_text,
    "speculative_config.model": nonempty_text,
    # more than k3.MAX_SPECULATIVE_TOKENS is legal vLLM: rule 17 reports it, not the parser
    "speculative_config.num_speculative_tokens": _whole(
        0, None, f"a whole number >= 0 (the K3 fast path takes at most {k3.MAX_SPECULATIVE_TOKENS})"
    ),
    "speculative_config.draft_tensor_parallel_size": _count,
    "speculative_config.draft_sample_method": nonempty_text,
    "speculative_config.rejection_sample_method": one_of("standard", "synthetic", "block", "fly"),
    "speculative_config.synthetic_acceptance_length": _number(0, None, "a positive number"),
    "speculative_config.enable_adaptive_verification": _switch,
    "compilation_config.mode": _level_or_name,
    "compilation_config.cudagraph_mode": one_of(
        "NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", ignore_case=True
    ),
    "compilation_config.cudagraph_capture_sizes": _sizes,
    # Profiles check these; a `vllm serve` line does not (vLLM's parser takes any JSON there and
    # refuses a bad value only when the model is built: the rules report it, k3.decode_backend
    # and k3.additional_config).
    **{
        f"additional_config.{key}": one_of(*allowed)
        for key, allowed in k3.ADDITIONAL_CONFIG_CHOICES.items()
    },
    **{f"custom_histogram_buckets.{family}": _bounds for family in sorted(buckets.FAMILIES)},
}


def check_field(name: str, value: Any) -> Any:
    """`value` checked (and normalised) against FIELD_CHECKS[name]; names not listed pass as they
    are. Raises ValueError whose text is what is allowed; callers add where the value came from."""
    check = FIELD_CHECKS.get(name)
    return value if check is None else check(value)


# ---------------------------------------------------------------- flag tables

# flag spellings -> (field, kind).
# kinds: int, float, str, bool, json, maxlen, optlevel, sizes, apikey
# Rendering order and defaults.
_FIELD_DEFAULTS: dict[str, Any] = {
    f.name: (f.default if f.default is not dataclasses.MISSING else None)
    for f in dataclasses.fields(DeploymentSpec)
}
_INT_FLAGS_RENDER: tuple[tuple[str, str], ...] = (
    ("tensor_parallel_size", "--tensor-parallel-size"),
    ("pipeline_parallel_size", "--pipeline-parallel-size"),
    ("data_parallel_size", "--data-parallel-size"),
    ("decode_context_parallel_size", "--decode-context-parallel-size"),
    ("max_model_len", "--max-model-len"),
    ("max_num_seqs", "--max-num-seqs"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("port", "--port"),
)
_STR_FLAGS_RENDER: tuple[tuple[str, str], ...] = (
    ("kv_cache_dtype", "--kv-cache-dtype"),
    ("mamba_cache_dtype", "--mamba-cache-dtype"),
    ("mamba_ssm_cache_dtype", "--mamba-ssm-cache-dtype"),
    ("distributed_executor_backend", "--distributed-executor-backend"),
)
_BOOL_FLAGS_RENDER: tuple[tuple[str, str], ...] = (
    ("enable_expert_parallel", "--enable-expert-parallel"),
    ("enable_dbo", "--enable-dbo"),
    ("enforce_eager", "--enforce-eager"),
    ("use_replayssm", "--use-replayssm"),
    ("enable_sleep_mode", "--enable-sleep-mode"),
    ("enable_lora", "--enable-lora"),
)
JSON_FLAG_NAME = {
    "speculative_config": "--speculative-config",
    "compilation_config": "--compilation-config",
    "additional_config": "--additional-config",
    "custom_histogram_buckets": "--custom-histogram-buckets",
}


def _render_int(field_name: str, value: int) -> str:
    if field_name == "max_model_len" and value == -1:
        return "auto"
    return str(value)


def dump_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=False)
