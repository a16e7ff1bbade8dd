"""`vllm serve ...` command lines -> DeploymentSpec: the flag table and the parser.

The conventions it follows (vLLM 0.33 syntax, kimictl's defaults) are listed in
kimictl.deployment.spec's docstring; rendering back to argv lives there too.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass, field
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
    Stages: the launcher's environment and program (`_split_launcher`), each word in turn
    (`_read_word`: the model, then flags as vLLM's argparse reads them), and the values checked
    and merged as argparse would leave them (`_finish`).
    """
    tokens = _tokenize(text) if isinstance(text, str) else list(text)
    env, rest = _split_launcher(tokens)
    state = _Parse(words=rest, env=env)
    while state.more():
        _read_word(state, state.take())
    return _finish(state)


def _split_launcher(tokens: list[str]) -> tuple[dict[str, str], list[str]]:
    """`VAR=value ... [env VAR=value ...] vllm serve` -> (the environment, the words after it)."""
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
    return env, rest


@dataclass
class _Parse:
    """A parse in progress: the words after `vllm serve`, a cursor, and what they set so far."""

    words: list[str]
    env: dict[str, str]
    j: int = 0  # the next word
    model: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    given: dict[str, tuple[str, str]] = field(default_factory=dict)  # field -> (flag, text)
    json_values: dict[str, dict[str, Any]] = field(default_factory=dict)
    # (field, key) -> the flag that set it, as typed
    json_flags: dict[tuple[str, str], str] = field(default_factory=dict)
    # field -> flag spelling -> merged keys
    dotted: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    sizes_given: list[int] | None = None
    extra: list[str] = field(default_factory=list)
    unrecognised: list[str] = field(default_factory=list)

    def more(self) -> bool:
        return self.j < len(self.words)

    def take(self) -> str:
        word = self.words[self.j]
        self.j += 1
        return word

    def value_of(self, flag: str) -> str:
        """The next word as `flag`'s value."""
        if not self.more():
            raise InputError(f"{flag} expects a value.")
        return self.take()


def _read_word(state: _Parse, token: str) -> None:
    """One word: the model, or a flag (with the value words it takes)."""
    if not token.startswith("-") or token == "-":
        if state.model is None:
            state.model = token
            return
        raise InputError(
            f"Unexpected extra word {token!r} after the model {state.model!r}; "
            "only one model may be given.",
        )
    flag, has_inline, inline = token.partition("=")
    inline_value: str | None = inline if has_inline else None
    if flag.startswith("--"):  # vLLM accepts --tensor_parallel_size for --tensor-parallel-size
        name, dot, path_part = flag.partition(".")
        flag = name.replace("_", "-") + dot + path_part
    if _read_glued_level(state, token, flag, inline_value):
        return
    # dotted JSON: --additional-config.decode_backend X, -cc.cudagraph_mode Y
    base, dot, path = flag.partition(".")
    if dot and base in _FLAGS and _FLAGS[base][1] == "json":
        _read_dotted(state, flag, base, path, inline_value)
        return
    known, negated = _known_flag(flag)
    if known is None:
        _read_passthrough(state, token, flag, inline_value)
        return
    field_name, kind = known
    if kind == "bool":
        if inline_value is not None:
            # argparse: "ignored explicit argument" (vLLM's switches take no value)
            raise InputError(
                f"{flag} is a switch and takes no value (got {token!r}); vLLM rejects "
                f"{flag}=VALUE: write {flag} or its negative form."
            )
        state.values[field_name] = not negated
        return
    if kind == "sizes":
        _read_sizes(state, flag, inline_value)
        return
    if inline_value is None:
        if state.more() and kind not in ("json", "optlevel"):
            if not _is_value_token(state.words[state.j]):
                raise InputError(f"{flag} expects a value, got the flag {state.words[state.j]!r}.")
        inline_value = state.value_of(flag)
    _set_value(state, flag, field_name, kind, inline_value)


def _read_glued_level(state: _Parse, token: str, flag: str, inline_value: str | None) -> bool:
    """-O3 (the optimization level glued to the flag): read, True. Any other -O<x> is refused:
    vllm/utils/argparse_utils.py:FlexibleArgumentParser.parse_args turns it into
    --optimization-level <x>, so `-O.mode 1` is an invalid level and -O JSON is refused."""
    if re.fullmatch(r"-O\d+", flag) and inline_value is None:
        state.values["optimization_level"] = int(flag[2:])
        state.given["optimization_level"] = ("-O", flag[2:])
        return True
    if (
        flag.startswith("-O")
        and not flag.startswith("--")
        and (flag != "-O" and not re.fullmatch(r"-O=?\d+", token))
    ):
        raise InputError(
            f"{token} is not an optimization level: vLLM 0.33 reads -O<x> as "
            "--optimization-level <x> (0-3); set compilation keys with -cc.KEY VALUE."
        )
    return False


def _read_dotted(state: _Parse, flag: str, base: str, path: str, inline_value: str | None) -> None:
    """`--additional-config.KEY VALUE`: one key of a JSON flag (merged in `_finish`)."""
    field_name = _FLAGS[base][0]
    if inline_value is None:
        inline_value = state.value_of(flag)
    keys = path.split(".")
    if not all(keys):
        raise InputError(f"{flag} has an empty key in its dotted path.")
    target = state.dotted.setdefault(field_name, {}).setdefault(base, {})
    _set_dotted(target, keys, _dotted_value(inline_value), flag)
    state.json_flags[field_name, keys[0]] = f"{base}.{keys[0]}"


def _known_flag(flag: str) -> tuple[tuple[str, str] | None, bool]:
    """(field, kind) of a modelled flag, and whether it is a switch's negative form:
    vllm/utils/argparse_utils.py:EnableDisableAction gives every switch a --no-X form and pairs
    --enable-X with --disable-X."""
    known = _FLAGS.get(flag)
    if known is not None:
        return known, False
    if flag.startswith("--no-") and f"--{flag[5:]}" in _FLAGS:
        candidate = _FLAGS[f"--{flag[5:]}"]
        if candidate[1] == "bool":
            return candidate, True
    if flag.startswith("--disable-"):
        enabling = _FLAGS.get("--enable-" + flag[len("--disable-") :])
        if enabling is not None and enabling[1] == "bool":
            return enabling, True
    return None, False


def _read_passthrough(state: _Parse, token: str, flag: str, inline_value: str | None) -> None:
    """A flag kimictl does not model: kept verbatim with its values (unknown ones reported)."""
    state.extra.append(token)
    arity = _PASSTHROUGH.get(flag)
    if arity is None:
        state.unrecognised.append(flag)
        arity = 1 if (inline_value is None and state.more()) else 0
        if arity and not _is_value_token(state.words[state.j]):
            arity = 0
    if inline_value is None:
        for _ in range(arity):
            if not state.more():
                break
            state.extra.append(state.take())


def _read_sizes(state: _Parse, flag: str, inline_value: str | None) -> None:
    """--cudagraph-capture-sizes 1 2 4 (or =1,2,4): the compilation config's capture sizes."""
    sizes_words: list[str] = []
    if inline_value is not None:
        sizes_words = [w for w in re.split(r"[,\s]+", inline_value) if w]
    else:
        while state.more() and re.fullmatch(r"\d+", state.words[state.j]):
            sizes_words.append(state.take())
    if not sizes_words:
        raise InputError(f"{flag} expects one or more whole numbers, e.g. {flag} 1 2 4 8.")
    state.sizes_given = [_to_int(flag, w) for w in sizes_words]
    state.json_flags["compilation_config", "cudagraph_capture_sizes"] = flag


def _set_value(state: _Parse, flag: str, field_name: str, kind: str, value_text: str) -> None:
    """A modelled flag's value, converted by its kind (checked against the field in `_finish`)."""
    if kind in ("str", "int", "float", "maxlen"):
        state.given[field_name] = (flag, value_text)
    if kind == "str":
        if field_name == "model":
            state.model = value_text
        else:
            state.values[field_name] = value_text
    elif kind == "int":
        state.values[field_name] = _to_int(flag, value_text)
    elif kind == "float":
        state.values[field_name] = _to_float(flag, value_text)
    elif kind == "maxlen":
        state.values[field_name] = parse_max_model_len(value_text, flag=flag)
    elif kind == "apikey":
        state.env[ENV_VAR] = value_text
    elif kind == "optlevel":
        if not re.fullmatch(r"\d+", value_text):
            raise InputError(
                f"{flag} expects an optimization level 0-3, got {value_text!r} (vLLM 0.33 "
                "has no -O JSON form; use --compilation-config)."
            )
        state.values["optimization_level"] = int(value_text)
        state.given["optimization_level"] = (flag, value_text)
    elif kind == "json":
        _read_json(state, flag, field_name, value_text)


def _read_json(state: _Parse, flag: str, field_name: str, value_text: str) -> None:
    """A whole JSON flag (`--speculative-config '{...}'`); a later one replaces the earlier."""
    parsed = _parse_json_value(flag, value_text)
    if parsed is None and field_name == "speculative_config":
        state.json_values.pop(field_name, None)
        return
    if not isinstance(parsed, dict):
        raise InputError(f"{flag} expects a JSON object, got {value_text!r}.")
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
    state.json_values[field_name] = parsed  # argparse: a later value replaces the earlier
    state.json_flags.update({(field_name, k): f"{flag}.{k}" for k in parsed})


def _finish(state: _Parse) -> ParseResult:
    """The spec the words give, every value checked against its field."""
    json_values = state.json_values
    # vllm/utils/argparse_utils.py:FlexibleArgumentParser.parse_args collects the dotted forms of
    # each spelling (-cc.x, --compilation-config.x) into one JSON appended AFTER all other words,
    # so for argparse the last such JSON replaces every full JSON of that flag.
    for field_name, by_spelling in state.dotted.items():
        json_values[field_name] = list(by_spelling.values())[-1]
    if state.sizes_given is not None:
        json_values.setdefault("compilation_config", {})["cudagraph_capture_sizes"] = (
            state.sizes_given
        )
    if not state.model:
        raise InputError("The command names no model: write `vllm serve MODEL ...`.")
    values = state.values
    for field_name, (flag, value_text) in state.given.items():
        if field_name != "model":
            values[field_name] = _checked(field_name, values[field_name], flag, repr(value_text))
    for field_name, obj in json_values.items():
        for key, value in obj.items():
            # JSON null: vLLM's default; additional_config: judged by the rules (see FIELD_CHECKS)
            if value is not None and field_name != "additional_config":
                where = state.json_flags.get(
                    (field_name, key), f"{JSON_FLAG_NAME[field_name]}.{key}"
                )
                obj[key] = _checked(f"{field_name}.{key}", value, where, dump_json(value))
        values[field_name] = obj
    spec = DeploymentSpec(model=state.model, env=state.env, extra_args=state.extra, **values)
    return ParseResult(spec=spec, unrecognised=state.unrecognised)


def _checked(name: str, value: Any, where: str, shown: str) -> Any:
    """FIELD_CHECKS[name] applied; a bad value is one sentence naming the flag and the value."""
    try:
        return check_field(name, value)
    except ValueError as exc:
        raise InputError(f"{where} expects {exc}, got {shown}.") from exc


def _looks_like_model_first(rest: list[str]) -> bool:
    """A bare `MODEL --flags...` (no `vllm serve` in front) is accepted."""
    return len(rest) == 1 or rest[1].startswith("-")
