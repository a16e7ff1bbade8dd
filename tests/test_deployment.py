"""DeploymentSpec: vLLM serve syntax in, argv + env out, lossless round trip."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimictl.cli import main
from kimictl.core.errors import InputError
from kimictl.deployment.spec import (
    FIELD_CHECKS,
    DeploymentSpec,
    parse_max_model_len,
)
from kimictl.deployment.vllm_args import parse_vllm_command

UPSTREAM = (
    "VLLM_USE_V2_MODEL_RUNNER=1 vllm serve moonshotai/Kimi-K3 -tp 8 -dcp 8 --kv-cache-dtype fp8 "
    '--speculative-config \'{"method":"dspark","model":"moonshotai/Kimi-K3-DSpark",'
    '"num_speculative_tokens":7}\' '
    '--additional-config \'{"decode_backend":"latency_specialized"}\''
)


def test_upstream_enable_line_fields():
    result = parse_vllm_command(UPSTREAM)
    spec = result.spec
    assert result.unrecognised == []
    assert spec.model == "moonshotai/Kimi-K3"
    assert spec.env == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert spec.tensor_parallel_size == 8
    assert spec.decode_context_parallel_size == 8
    assert spec.kv_cache_dtype == "fp8"
    assert spec.speculative_method == "dspark"
    assert spec.num_speculative_tokens == 7
    assert spec.tokens_per_request == 8
    assert spec.decode_backend == "latency_specialized"
    assert spec.extra_args == []


def test_long_short_and_equals_forms_agree():
    short = parse_vllm_command("vllm serve m -tp 16 -pp 2 -dp 2 -dcp 16 -ep").spec
    long = parse_vllm_command(
        "vllm serve m --tensor-parallel-size=16 --pipeline-parallel-size 2 --data-parallel-size=2 "
        "--decode-context-parallel-size 16 --enable-expert-parallel"
    ).spec
    assert short == long
    assert (short.tensor_parallel_size, short.pipeline_parallel_size) == (16, 2)
    assert short.data_parallel_size == 2 and short.enable_expert_parallel
    assert short.gpus_needed == 64


def test_dotted_json_merges_and_replaces_json_like_vllm():
    spec = parse_vllm_command(
        "vllm serve m --additional-config.decode_backend latency_specialized "
        "-cc.cudagraph_mode FULL_DECODE_ONLY -cc.cudagraph_capture_sizes [1,2,4] "
        '-sc \'{"method":"dspark"}\' -sc.num_speculative_tokens 3 '
        "--additional-config.kda.nested=true"
    ).spec
    assert spec.additional_config == {
        "decode_backend": "latency_specialized",
        "kda": {"nested": True},
    }
    assert spec.compilation_config == {
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "cudagraph_capture_sizes": [1, 2, 4],
    }
    # vLLM's parser appends the dotted keys as one JSON after every other word: it replaces the
    # full JSON of the same flag (argparse keeps the last value)
    assert spec.speculative_config == {"num_speculative_tokens": 3}
    assert spec.cudagraph_capture_sizes == [1, 2, 4]
    twice = 'vllm serve m -cc \'{"mode": 1}\' -cc \'{"cudagraph_mode": "FULL"}\''
    later = parse_vllm_command(twice)
    assert later.spec.compilation_config == {"cudagraph_mode": "FULL"}


def test_optimization_level_forms_and_refused_O_json():
    assert parse_vllm_command("vllm serve m -O3").spec.optimization_level == 3
    assert parse_vllm_command("vllm serve m -O 0").spec.optimization_level == 0
    assert parse_vllm_command("vllm serve m --optimization-level=2").spec.optimization_level == 2
    assert parse_vllm_command("vllm serve m -O=1").spec.optimization_level == 1
    # vLLM 0.33 reads any -O<x> as --optimization-level <x>: the old -O JSON forms are refused
    for legacy in ("-O '{\"mode\": 1}'", "-O.cudagraph_mode NONE", "-O.mode 1"):
        with pytest.raises(InputError, match="optimization level"):
            parse_vllm_command(f"vllm serve m {legacy}")


def test_capture_sizes_flag_lands_in_compilation_config():
    spec = parse_vllm_command(
        "vllm serve m --cudagraph-capture-sizes 1 2 4 8 --max-num-seqs 8"
    ).spec
    assert spec.compilation_config == {"cudagraph_capture_sizes": [1, 2, 4, 8]}
    assert spec.max_num_seqs == 8


def test_env_assignments_multiline_and_api_key_moves_to_env():
    text = "A=1 B='x y' vllm serve /models/k3 \\\n  --port 9000 \\\n  --api-key sk-secret"
    spec = parse_vllm_command(text).spec
    assert spec.env == {"A": "1", "B": "x y", "VLLM_API_KEY": "sk-secret"}
    assert spec.port == 9000
    assert "sk-secret" not in " ".join(spec.to_argv())
    assert "sk-secret" not in spec.to_command()
    assert "VLLM_API_KEY='***'" in spec.to_command()
    assert spec.to_json()["env"]["VLLM_API_KEY"] == "***"


def test_unrecognised_flags_are_reported_and_kept_in_order():
    result = parse_vllm_command(
        "vllm serve m --trust-remote-code --frobnicate 3 --seed 7 --shiny --nnodes 2"
    )
    assert result.unrecognised == ["--frobnicate", "--shiny"]
    assert result.spec.extra_args == [
        "--trust-remote-code",
        "--frobnicate",
        "3",
        "--seed",
        "7",
        "--shiny",
        "--nnodes",
        "2",
    ]


def test_underscore_flag_spelling_is_accepted():
    spec = parse_vllm_command(
        "vllm serve m --tensor_parallel_size 8 --additional_config.decode_backend auto"
    ).spec
    assert spec.tensor_parallel_size == 8
    assert spec.additional_config == {"decode_backend": "auto"}


def test_no_prefix_negates_switches():
    spec = parse_vllm_command("vllm serve m --enforce-eager --no-enforce-eager --enable-lora").spec
    assert spec.enforce_eager is False and spec.enable_lora is True


@pytest.mark.parametrize(
    ("text", "value"),
    [("4096", 4096), ("1k", 1000), ("1K", 1024), ("32k", 32000), ("1M", 1048576), ("auto", -1)],
)
def test_max_model_len_forms(text, value):
    assert parse_max_model_len(text) == value
    spec = parse_vllm_command(f"vllm serve m --max-model-len {text}").spec
    assert spec.max_model_len == value


def test_host_defaults_to_loopback_and_renders():
    spec = parse_vllm_command("vllm serve m").spec
    assert spec.host == "127.0.0.1"
    argv = spec.to_argv()
    assert argv[:3] == ["vllm", "serve", "m"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert spec.to_argv("/venv/bin/vllm")[0] == "/venv/bin/vllm"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("vllm serve m --speculative-config '{\"method\": dspark}'", "--speculative-config"),
        ("vllm serve m -cc '{oops'", "-cc expects JSON"),
        ("vllm serve m --additional-config '[1,2]'", "expects a JSON object"),
        ("vllm serve m -tp eight", "-tp expects a whole number, got 'eight'"),
        ("vllm serve m --max-model-len lots", "--max-model-len expects a number"),
        ("vllm serve m --gpu-memory-utilization high", "--gpu-memory-utilization expects a number"),
        ("vllm serve m --port", "--port expects a value"),
        # the same bounds the profile schema applies
        ("vllm serve m --port 999999", "--port expects a port number 1-65535, got '999999'"),
        ("vllm serve m --gpu-memory-utilization nan", "expects a finite number, got 'nan'"),
        ("vllm serve m --enforce-eager=maybe", "is a switch"),
        ("vllm serve", "names no model"),
        ("vllm bench serve m", "Expected `vllm serve MODEL ...`"),
        ("vllm serve m 'unclosed", "unclosed quote"),
        ("vllm serve m other", "only one model"),
        ("python -m vllm.entrypoints.openai.api_server --model m", "write it as `vllm serve"),
    ],
)
def test_bad_input_is_one_clear_input_error(text, needle):
    with pytest.raises(InputError) as info:
        parse_vllm_command(text)
    assert needle in info.value.message
    assert "\n" not in info.value.message


# a value of the wrong type or out of bounds, wherever it sits on the line: flag, JSON, dotted
WRONG_VALUES = [
    (
        '--speculative-config \'{"method": "dspark", "num_speculative_tokens": "seven"}\'',
        "--speculative-config.num_speculative_tokens expects a whole number >= 0 "
        '(the K3 fast path takes at most 7), got "seven".',
    ),
    (
        "-sc.num_speculative_tokens 2.5",
        "-sc.num_speculative_tokens expects a whole number >= 0 "
        "(the K3 fast path takes at most 7), got 2.5.",
    ),
    (
        "-sc.enable_adaptive_verification yes",
        '-sc.enable_adaptive_verification expects true or false, got "yes".',
    ),
    (
        '--speculative-config \'{"rejection_sample_method": "fast"}\'',
        '--speculative-config.rejection_sample_method expects "standard" | "synthetic" | "block" '
        '| "fly", got "fast".',
    ),
    ("-cc.cudagraph_mode FULLY", '-cc.cudagraph_mode expects "NONE" | "PIECEWISE" | "FULL"'),
    ("-O.mode 1", "-O.mode is not an optimization level: vLLM 0.33 reads -O<x> as"),
    (
        "-cc '{\"cudagraph_capture_sizes\": [0, 8]}'",
        "-cc.cudagraph_capture_sizes expects a non-empty list of whole numbers >= 1, "
        "e.g. [1, 2, 4, 8], got [0,8].",
    ),
    (
        "--cudagraph-capture-sizes 0 8",
        "--cudagraph-capture-sizes expects a non-empty list of whole numbers >= 1, "
        "e.g. [1, 2, 4, 8], got [0,8].",
    ),
    ("--enforce-eager=true", "--enforce-eager is a switch and takes no value"),
    ("-tp 0", "-tp expects a whole number >= 1, got '0'."),
    ("--max-num-seqs -4", "--max-num-seqs expects a whole number >= 1, got '-4'."),
    ("-O5", "-O expects 0, 1, 2 or 3, got '5'."),
    ("--optimization-level 9", "--optimization-level expects 0, 1, 2 or 3, got '9'."),
    (
        "--max-model-len 0",
        '--max-model-len expects a whole number >= 1, a size like "128k", or "auto", got \'0\'.',
    ),
    ("--gpu-memory-utilization 1.5", "--gpu-memory-utilization expects a number in (0, 1], got"),
    ("--distributed-executor-backend k8s", '"mp" | "ray" | "uni" | "external_launcher", got'),
    ("--kv-cache-dtype=", "--kv-cache-dtype expects a non-empty string, got ''."),
]


def test_additional_config_values_on_a_command_line_are_for_the_rules():
    """vLLM's parser takes any JSON in --additional-config and refuses a bad decode_backend only
    when it builds the model: a command line keeps the value, the rules fail it."""
    from kimictl.runtime.checks.rules.deployment import deployment_checks

    spec = parse_vllm_command("vllm serve m --additional-config.decode_backend fast").spec
    assert spec.additional_config == {"decode_backend": "fast"}
    backend = next(c for c in deployment_checks(spec) if c.id == "k3.decode_backend")
    assert backend.status == "fail" and "auto/latency_specialized" in backend.message


@pytest.mark.parametrize(("flags", "message"), WRONG_VALUES)
def test_wrong_type_or_bound_is_one_sentence_naming_flag_value_and_allowed(flags, message):
    with pytest.raises(InputError) as info:
        parse_vllm_command(f"vllm serve m {flags}")
    assert message in info.value.message
    assert info.value.message.endswith(".") and "\n" not in info.value.message


@pytest.mark.parametrize(("flags", "message"), WRONG_VALUES[:2] + WRONG_VALUES[9:10])
def test_doctor_vllm_args_with_a_wrong_value_exits_2_with_the_sentence(flags, message, capsys):
    line = f"vllm serve moonshotai/Kimi-K3 -tp 8 {flags}"
    assert main(["doctor", "--vllm-args", line, "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_values_inside_the_bounds_pass_and_json_null_means_vllms_default():
    spec = parse_vllm_command(
        "vllm serve m -sc.num_speculative_tokens 9 -sc.model null -cc.cudagraph_mode full "
        "--gpu-memory-utilization 1 -O0 --port 65535 --max-model-len auto"
    ).spec
    # more than K3's 7 draft tokens is legal vLLM: rule 17 reports it (test_rules_deployment)
    assert spec.speculative_config == {"num_speculative_tokens": 9, "model": None}
    assert spec.compilation_config == {"cudagraph_mode": "full"}  # vLLM upper-cases it
    assert (spec.gpu_memory_utilization, spec.optimization_level, spec.port) == (1.0, 0, 65535)


def test_with_changes_and_rejects_unknown_fields():
    spec = DeploymentSpec(model="m")
    assert spec.with_(tensor_parallel_size=8).tensor_parallel_size == 8
    assert spec.tensor_parallel_size == 1
    with pytest.raises(InputError, match="no field tensor_parallel"):
        spec.with_(tensor_parallel=8)


# ---------------------------------------------------------------- property: parse(render(x)) == x

_word = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-./", min_size=1, max_size=12
).filter(lambda s: not s.startswith("-"))
_json_scalar = st.one_of(
    st.integers(-(10**6), 10**6),
    st.booleans(),
    st.text(max_size=10),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.none(),
)
_json = st.recursive(
    _json_scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
# keys kimictl checks (FIELD_CHECKS) would need typed values: the free-form part uses other keys;
# no '-' in top-level keys (vLLM rewrites them to '_' in the speculative config and refuses them
# in the compilation config, so they do not round-trip)
_checked_keys = {name.partition(".")[2] for name in FIELD_CHECKS if "." in name}
_json_obj = st.dictionaries(
    st.text(max_size=8).filter(lambda k: k not in _checked_keys and "-" not in k),
    _json,
    max_size=4,
)
_extra = st.sampled_from(
    [
        [],
        ["--trust-remote-code"],
        ["--seed", "-1"],
        ["--nnodes", "2", "--headless"],
        ["--some-new-flag", "v", "--other-switch"],
    ]
)
_env_name = st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True)


_bucket_tables = st.dictionaries(
    st.sampled_from(["inter_token_latency", "time_to_first_token", "request_latency"]),
    st.lists(st.floats(1e-6, 1e4), min_size=1, max_size=8, unique=True).map(sorted),
    min_size=1,
    max_size=2,
)


@st.composite
def specs(draw) -> DeploymentSpec:
    opt_int = st.none() | st.integers(1, 10**6)
    return DeploymentSpec(
        model=draw(_word),
        served_model_name=draw(st.none() | _word),
        tensor_parallel_size=draw(st.integers(1, 64)),
        pipeline_parallel_size=draw(st.integers(1, 8)),
        data_parallel_size=draw(st.integers(1, 8)),
        decode_context_parallel_size=draw(st.integers(1, 16)),
        enable_expert_parallel=draw(st.booleans()),
        enable_dbo=draw(st.booleans()),
        kv_cache_dtype=draw(st.sampled_from(["auto", "fp8", "fp8_e4m3", "bfloat16"])),
        max_model_len=draw(st.none() | st.just(-1) | st.integers(1, 2**21)),
        max_num_seqs=draw(opt_int),
        max_num_batched_tokens=draw(opt_int),
        speculative_config=draw(st.none() | _json_obj),
        compilation_config=draw(_json_obj),
        optimization_level=draw(st.none() | st.integers(0, 3)),
        enforce_eager=draw(st.booleans()),
        additional_config=draw(_json_obj),
        mamba_cache_dtype=draw(st.sampled_from(["auto", "float32", "bfloat16"])),
        mamba_ssm_cache_dtype=draw(st.sampled_from(["auto", "float32", "float16"])),
        use_replayssm=draw(st.booleans()),
        enable_sleep_mode=draw(st.booleans()),
        enable_lora=draw(st.booleans()),
        host=draw(st.sampled_from(["127.0.0.1", "0.0.0.0", "::1", "node-1"])),
        port=draw(st.none() | st.integers(1, 65535)),
        gpu_memory_utilization=draw(st.none() | st.floats(0.01, 1.0)),
        distributed_executor_backend=draw(st.sampled_from([None, "mp", "ray"])),
        env=draw(st.dictionaries(_env_name, st.text(max_size=10), max_size=3)),
        extra_args=draw(_extra),
        custom_histogram_buckets=draw(st.none() | _bucket_tables),
    )


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(specs())
def test_parse_render_round_trip(spec):
    command = spec.to_command(redact=False)
    assert parse_vllm_command(command).spec == spec
    # the argv form (what the launcher uses) is lossless too, with env passed separately
    argv_spec = parse_vllm_command(spec.to_argv()).spec
    assert argv_spec.with_(env=spec.env) == spec
