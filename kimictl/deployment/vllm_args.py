"""`vllm serve ...` command lines -> DeploymentSpec: the flag table and the parser.

The conventions it follows (vLLM 0.33 syntax, kimictl's defaults) are listed in
kimictl.deployment.spec's docstring; rendering back to argv lives there too.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimictl.core.apikeys import ENV_VAR
from kimictl.core.errors import InputError
from kimictl.deployment import buckets
from kimictl.deployment.spec import (
    JSON_FLAG_NAME,
    DeploymentSpec,
    check_field,
    dump_json,
    parse_max_model_len,
)

__all__ = ["ParseResult", "parse_vllm_command"]


_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
_ENV_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)


@dataclass(frozen=True)
class ParseResult:
    spec: DeploymentSpec
    unrecognised: list[str]


_FLAGS: dict[str, tuple[str, str]] = {}


def _register(field_name: str, kind: str, *spellings: str) -> None:
    for spelling in spellings:
        _FLAGS[spelling] = (field_name, kind)


_register("model", "str", "--model")
_register("served_model_name", "str", "--served-model-name")
_register("tensor_parallel_size", "int", "--tensor-parallel-size", "-tp")
_register("pipeline_parallel_size", "int", "--pipeline-parallel-size", "-pp")
_register("data_parallel_size", "int", "--data-parallel-size", "-dp")
_register("decode_context_parallel_size", "int", "--decode-context-parallel-size", "-dcp")
_register("enable_expert_parallel", "bool", "--enable-expert-parallel", "-ep")
_register("enable_dbo", "bool", "--enable-dbo")
_register("kv_cache_dtype", "str", "--kv-cache-dtype")
_register("max_model_len", "maxlen", "--max-model-len")
_register("max_num_seqs", "int", "--max-num-seqs")
_register("max_num_batched_tokens", "int", "--max-num-batched-tokens")
_register("speculative_config", "json", "--speculative-config", "-sc")
_register("compilation_config", "json", "--compilation-config", "-cc")
_register("optimization_level", "optlevel", "--optimization-level", "-O")
_register("enforce_eager", "bool", "--enforce-eager")
_register("additional_config", "json", "--additional-config")
_register("mamba_cache_dtype", "str", "--mamba-cache-dtype")
_register("mamba_ssm_cache_dtype", "str", "--mamba-ssm-cache-dtype")
_register("use_replayssm", "bool", "--use-replayssm")
_register("enable_sleep_mode", "bool", "--enable-sleep-mode")
_register("enable_lora", "bool", "--enable-lora")
_register("host", "str", "--host")
_register("port", "int", "--port")
_register("gpu_memory_utilization", "float", "--gpu-memory-utilization")
_register("distributed_executor_backend", "str", "--distributed-executor-backend")
_register("compilation_config", "sizes", "--cudagraph-capture-sizes")
_register("env", "apikey", "--api-key")
_register("custom_histogram_buckets", "json", "--custom-histogram-buckets")
_register("otlp_traces_endpoint", "str", "--otlp-traces-endpoint")

# vLLM flags kimictl knows but does not model: kept in extra_args, not reported as unrecognised.
# value = number of values the flag takes (0 = switch).
_PASSTHROUGH: dict[str, int] = {
    "--trust-remote-code": 0,
    "--no-trust-remote-code": 0,
    "--headless": 0,
    "--disable-log-requests": 0,
    "--enable-log-requests": 0,
    "--disable-log-stats": 0,
    "--enable-prefix-caching": 0,
    "--no-enable-prefix-caching": 0,
    "--enable-chunked-prefill": 0,
    "--no-enable-chunked-prefill": 0,
    "--enable-auto-tool-choice": 0,
    "--nnodes": 1,
    "--node-rank": 1,
    "--master-addr": 1,
    "--master-port": 1,
    "--data-parallel-size-local": 1,
    "-dpl": 1,
    "--data-parallel-address": 1,
    "-dpa": 1,
    "--data-parallel-rpc-port": 1,
    "-dpp": 1,
    "--data-parallel-start-rank": 1,
    "--data-parallel-backend": 1,
    "--seed": 1,
    "--dtype": 1,
    # read by rules.effective from extra_args (vLLM merges them into the speculative config)
    "--spec-method": 1,
    "--spec-model": 1,
    "--spec-tokens": 1,
    "--ubatch-size": 1,
    "--mamba-backend": 1,
    "--all2all-backend": 1,
    "--quantization": 1,
    "-q": 1,
    "--tokenizer": 1,
    "--tokenizer-mode": 1,
    "--revision": 1,
    "--download-dir": 1,
    "--load-format": 1,
    "--block-size": 1,
    "--swap-space": 1,
    "--tool-call-parser": 1,
    "--reasoning-parser": 1,
    "--chat-template": 1,
    "--uvicorn-log-level": 1,
    "--hf-overrides": 1,
    "--generation-config": 1,
    "--max-logprobs": 1,
    "--api-server-count": 1,
    "--kv-transfer-config": 1,
}

# ---------------------------------------------------------------- parsing


def _tokenize(text: str) -> list[str]:
    joined = re.sub(r"\\\r?\n", " ", text)
    try:
        return shlex.split(joined, comments=False, posix=True)
    except ValueError as exc:
        raise InputError(
            f"Cannot split the command line into words ({exc}); check for an unclosed quote.",
        ) from exc


def _is_value_token(token: str) -> bool:
    return not token.startswith("-") or bool(_NUMBER.match(token))


def _parse_json_value(flag: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{flag} expects JSON, got {text!r} ({exc.msg} at column {exc.colno}); "
            f"write it as '{{\"key\": value}}' in single quotes, or use the dotted form "
            f"{flag}.KEY VALUE.",
        ) from exc


def _dotted_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _set_dotted(target: dict[str, Any], keys: list[str], value: Any, flag: str) -> None:
    node = target
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise InputError(f"{flag} sets a key under {key!r}, which already holds {child!r}.")
        node = child
    node[keys[-1]] = value


def _to_int(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError as exc:
        raise InputError(f"{flag} expects a whole number, got {text!r}.") from exc


def _to_float(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise InputError(f"{flag} expects a number, got {text!r}.") from exc
    if not math.isfinite(value):
        raise InputError(f"{flag} expects a finite number, got {text!r}.")
    return value


def parse_vllm_command(text: str | list[str]) -> ParseResult:
    """Parse `[VAR=value ...] vllm serve MODEL [flags]` (or just the flags) into a DeploymentSpec.

    Raises InputError with one sentence naming the flag and the value on anything unparsable.
    """
    tokens = _tokenize(text) if isinstance(text, str) else list(text)
    env: dict[str, str] = {}
    i = 0
    while i < len(tokens) and (m := _ENV_ASSIGN.match(tokens[i])):
        env[m.group(1)] = m.group(2)
        i += 1
    if i < len(tokens) and tokens[i] == "env":  # `env VAR=value vllm serve ...`
        i += 1
        while i < len(tokens) and (m := _ENV_ASSIGN.match(tokens[i])):
            env[m.group(1)] = m.group(2)
            i += 1
    rest = tokens[i:]
    if rest and (rest[0] == "vllm" or rest[0].endswith("/vllm")):
        if len(rest) < 2 or rest[1] != "serve":
            got = rest[1] if len(rest) > 1 else "nothing"
            raise InputError(f"Expected `vllm serve MODEL ...`, got `vllm {got}`.")
        rest = rest[2:]
    elif rest and Path(rest[0]).name.startswith("python"):
        raise InputError(
            f"Cannot read a `{' '.join(rest[:3])}` launch; write it as `vllm serve MODEL ...`.",
        )
    elif rest and not rest[0].startswith("-") and not _looks_like_model_first(rest):
        raise InputError(
            f"Expected a `vllm serve MODEL ...` command line, got {rest[0]!r} as the program.",
        )

    values: dict[str, Any] = {}
    given: dict[str, tuple[str, str]] = {}  # field -> (flag, text) of the value that stands
    json_values: dict[str, dict[str, Any]] = {}
    json_flags: dict[tuple[str, str], str] = {}  # (field, key) -> the flag that set it, as typed
    json_is_none: set[str] = set()
    dotted: dict[str, dict[str, dict[str, Any]]] = {}  # field -> flag spelling -> merged keys
    sizes_given: list[int] | None = None
    extra: list[str] = []
    unrecognised: list[str] = []
    model: str | None = None

    j = 0
    while j < len(rest):
        token = rest[j]
        j += 1
        if not token.startswith("-") or token == "-":
            if model is None:
                model = token
                continue
            raise InputError(
                f"Unexpected extra word {token!r} after the model {model!r}; "
                "only one model may be given.",
            )
        flag, has_inline, inline = token.partition("=")
        inline_value: str | None = inline if has_inline else None
        if flag.startswith("--"):  # vLLM accepts --tensor_parallel_size for --tensor-parallel-size
            name, dot, path_part = flag.partition(".")
            flag = name.replace("_", "-") + dot + path_part

        # -O3 (optimization level glued to the flag)
        if re.fullmatch(r"-O\d+", flag) and inline_value is None:
            values["optimization_level"] = int(flag[2:])
            given["optimization_level"] = ("-O", flag[2:])
            continue

        # vllm/utils/argparse_utils.py:FlexibleArgumentParser.parse_args turns any -O<x> into
        # --optimization-level <x>: `-O.mode 1` is an invalid level, and -O JSON is refused.
        if (
            flag.startswith("-O")
            and not flag.startswith("--")
            and (flag != "-O" and not re.fullmatch(r"-O=?\d+", token))
        ):
            raise InputError(
                f"{token} is not an optimization level: vLLM 0.33 reads -O<x> as "
                "--optimization-level <x> (0-3); set compilation keys with -cc.KEY VALUE."
            )

        # dotted JSON: --additional-config.decode_backend X, -cc.cudagraph_mode Y
        base, dot, path = flag.partition(".")
        if dot and base in _FLAGS and _FLAGS[base][1] == "json":
            field_name = _FLAGS[base][0]
            if inline_value is None:
                if j >= len(rest):
                    raise InputError(f"{flag} expects a value.")
                inline_value = rest[j]
                j += 1
            keys = path.split(".")
            if not all(keys):
                raise InputError(f"{flag} has an empty key in its dotted path.")
            target = dotted.setdefault(field_name, {}).setdefault(base, {})
            _set_dotted(target, keys, _dotted_value(inline_value), flag)
            json_flags[field_name, keys[0]] = f"{base}.{keys[0]}"
            continue

        # vllm/utils/argparse_utils.py:EnableDisableAction: every switch has a --no-X form and
        # --enable-X pairs with --disable-X.
        negated = False
        known = _FLAGS.get(flag)
        if known is None and flag.startswith("--no-") and f"--{flag[5:]}" in _FLAGS:
            candidate = _FLAGS[f"--{flag[5:]}"]
            if candidate[1] == "bool":
                known, negated = candidate, True
        if known is None and flag.startswith("--disable-"):
            enabling = _FLAGS.get("--enable-" + flag[len("--disable-") :])
            if enabling is not None and enabling[1] == "bool":
                known, negated = enabling, True

        if known is None:
            # not modelled: keep verbatim
            extra.append(token)
            arity = _PASSTHROUGH.get(flag)
            if arity is None:
                unrecognised.append(flag)
                arity = 1 if (inline_value is None and j < len(rest)) else 0
                if arity and not _is_value_token(rest[j]):
                    arity = 0
            if inline_value is None:
                for _ in range(arity):
                    if j >= len(rest):
                        break
                    extra.append(rest[j])
                    j += 1
            continue

        field_name, kind = known
        if kind == "bool":
            if inline_value is not None:
                # argparse: "ignored explicit argument" (vLLM's switches take no value)
                raise InputError(
                    f"{flag} is a switch and takes no value (got {token!r}); vLLM rejects "
                    f"{flag}=VALUE: write {flag} or its negative form."
                )
            values[field_name] = not negated
            continue

        if kind == "sizes":
            sizes_words: list[str] = []
            if inline_value is not None:
                sizes_words = [w for w in re.split(r"[,\s]+", inline_value) if w]
            else:
                while j < len(rest) and re.fullmatch(r"\d+", rest[j]):
                    sizes_words.append(rest[j])
                    j += 1
            if not sizes_words:
                raise InputError(f"{flag} expects one or more whole numbers, e.g. {flag} 1 2 4 8.")
            sizes_given = [_to_int(flag, w) for w in sizes_words]
            json_flags["compilation_config", "cudagraph_capture_sizes"] = flag
            continue

        if inline_value is None:
            if j >= len(rest):
                raise InputError(f"{flag} expects a value.")
            if kind != "json" and kind != "optlevel" and not _is_value_token(rest[j]):
                raise InputError(f"{flag} expects a value, got the flag {rest[j]!r}.")
            inline_value = rest[j]
            j += 1
        value_text = inline_value
        if kind in ("str", "int", "float", "maxlen"):
            given[field_name] = (flag, value_text)

        if kind == "str":
            if field_name == "model":
                model = value_text
            else:
                values[field_name] = value_text
        elif kind == "int":
            values[field_name] = _to_int(flag, value_text)
        elif kind == "float":
            values[field_name] = _to_float(flag, value_text)
        elif kind == "maxlen":
            values[field_name] = parse_max_model_len(value_text, flag=flag)
        elif kind == "apikey":
            env[ENV_VAR] = value_text
        elif kind == "optlevel":
            if not re.fullmatch(r"\d+", value_text):
                raise InputError(
                    f"{flag} expects an optimization level 0-3, got {value_text!r} (vLLM 0.33 "
                    "has no -O JSON form; use --compilation-config)."
                )
            values["optimization_level"] = int(value_text)
            given["optimization_level"] = (flag, value_text)
        elif kind == "json":
            parsed = _parse_json_value(flag, value_text)
            if parsed is None and field_name == "speculative_config":
                json_is_none.add(field_name)
                json_values.pop(field_name, None)
                continue
            if not isinstance(parsed, dict):
                raise InputError(f"{flag} expects a JSON object, got {value_text!r}.")
            json_is_none.discard(field_name)
            if field_name == "speculative_config":
                # EngineArgs.create_speculative_config: keys' '-' become '_'
                parsed = {str(k).replace("-", "_"): v for k, v in parsed.items()}
            elif field_name == "compilation_config":
                # CompilationConfig is validated strictly (pydantic): no key has a '-'
                dashed = [k for k in parsed if "-" in str(k)]
                if dashed:
                    raise InputError(
                        f"{flag} has the key {dashed[0]!r}, which vLLM's CompilationConfig "
                        f"does not have (did you mean {dashed[0].replace('-', '_')!r}?)."
                    )
            elif field_name == "custom_histogram_buckets":
                unknown = sorted(set(parsed) - buckets.FAMILIES)
                if unknown:
                    raise InputError(
                        f"{flag} names unknown bucket family {unknown[0]!r}; vLLM's families: "
                        f"{', '.join(sorted(buckets.FAMILIES))}."
                    )
            json_values[field_name] = parsed  # argparse: a later value replaces the earlier
            json_flags.update({(field_name, k): f"{flag}.{k}" for k in parsed})

    # vllm/utils/argparse_utils.py:FlexibleArgumentParser.parse_args collects the dotted forms of
    # each spelling (-cc.x, --compilation-config.x) into one JSON appended AFTER all other words,
    # so for argparse the last such JSON replaces every full JSON of that flag.
    for field_name, by_spelling in dotted.items():
        json_is_none.discard(field_name)
        json_values[field_name] = list(by_spelling.values())[-1]
    if sizes_given is not None:
        json_values.setdefault("compilation_config", {})["cudagraph_capture_sizes"] = sizes_given
    if not model:
        raise InputError("The command names no model: write `vllm serve MODEL ...`.")
    for field_name, (flag, value_text) in given.items():
        if field_name != "model":
            values[field_name] = _checked(field_name, values[field_name], flag, repr(value_text))
    for field_name, obj in json_values.items():
        for key, value in obj.items():
            # JSON null: vLLM's default; additional_config: judged by the rules (see FIELD_CHECKS)
            if value is not None and field_name != "additional_config":
                where = json_flags.get((field_name, key), f"{JSON_FLAG_NAME[field_name]}.{key}")
                obj[key] = _checked(f"{field_name}.{key}", value, where, dump_json(value))
        values[field_name] = obj
    spec = DeploymentSpec(model=model, env=env, extra_args=extra, **values)
    return ParseResult(spec=spec, unrecognised=unrecognised)


def _checked(name: str, value: Any, where: str, shown: str) -> Any:
    """FIELD_CHECKS[name] applied; a bad value is one sentence naming the flag and the value."""
    try:
        return check_field(name, value)
    except ValueError as exc:
        raise InputError(f"{where} expects {exc}, got {shown}.") from exc


def _looks_like_model_first(rest: list[str]) -> bool:
    """A bare `MODEL --flags...` (no `vllm serve` in front) is accepted."""
    return len(rest) == 1 or rest[1].startswith("-")
