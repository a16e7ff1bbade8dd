"""Deployment rules: each of vLLM's 18 K3 conditions alone, all at once, and coverage."""

from __future__ import annotations

import json

import pytest

from kimictl.deployment import k3
from kimictl.deployment.vllm_args import parse_vllm_command
from kimictl.runtime.checks.hardware import (
    FabricInfo,
    GpuInfo,
    HardwareReport,
    NodeReport,
    Unavailable,
)
from kimictl.runtime.checks.rules.base import Status
from kimictl.runtime.checks.rules.deployment import deployment_checks, fast_path_coverage

SPEC_JSON = '{"method":"dspark","model":"moonshotai/Kimi-K3-DSpark","num_speculative_tokens":7}'
UPSTREAM = (
    "VLLM_USE_V2_MODEL_RUNNER=1 vllm serve moonshotai/Kimi-K3 -tp 8 --kv-cache-dtype fp8 "
    f"--speculative-config '{SPEC_JSON}' "
    '--additional-config \'{"decode_backend":"latency_specialized"}\''
)
UPSTREAM_DCP = UPSTREAM.replace("-tp 8", "-tp 8 -dcp 8")
RULE_IDS = {rule.id for rule in k3.RULES}


def _gpu(index: int, cc: tuple[int, int] | Unavailable) -> GpuInfo:
    return GpuInfo(
        index=index,
        name="NVIDIA GB300" if cc == (10, 3) else "NVIDIA H200",
        uuid=f"GPU-{index:04d}",
        compute_capability=cc,
        memory_total_mib=284_000,
        mig_mode=False,
        ecc=True,
        persistence=True,
        throttle_reasons=[],
        nvlinks=[],
        fabric=FabricInfo("completed", "success", "cluster-a", 1),
        multicast_supported=True,
    )


def _report(cc: tuple[int, int] | Unavailable, gpus_per_node: int = 4, nodes: int = 4):
    return HardwareReport(
        nodes=[
            NodeReport(
                hostname=f"tray{n}",
                captured_at="2026-11-30T07:00:00Z",
                driver_version="580.95.05",
                cuda_driver_version="13.0",
                gpus=[_gpu(i, cc) for i in range(gpus_per_node)],
                p2p=[],
                imex_channels=["channel0"],
            )
            for n in range(nodes)
        ],
        source="simulated",
    )


GB300_X16 = _report((10, 3))


def _by_id(checks):
    return {c.id: c for c in checks}


@pytest.mark.parametrize("line", [UPSTREAM, UPSTREAM_DCP, UPSTREAM.replace("-tp 8", "-tp 16")])
def test_upstream_enable_line_passes_every_rule(line):
    checks = deployment_checks(parse_vllm_command(line).spec, GB300_X16)
    by_id = _by_id(checks)
    assert RULE_IDS <= set(by_id)
    for rule in k3.RULES:
        assert by_id[rule.id].status is Status.PASS, by_id[rule.id]
    assert not [c for c in checks if c.status is Status.FAIL]


def _k2_model_dir(tmp_path):
    config = dict(k3.K3_MOE_CONFIG, num_experts=384, num_experts_per_token=8)
    (tmp_path / "config.json").write_text(json.dumps({"text_config": config}))
    return str(tmp_path)


# rule number -> (how to break only that rule, the detail the message must name)
VIOLATIONS: dict[int, tuple[str, str]] = {
    3: ("-tp 4", "-tp 4"),
    4: ("-pp 2", "-pp 2"),
    5: ("-ep", "--enable-expert-parallel"),
    6: ("--enable-dbo", "--enable-dbo"),
    7: ("-dcp 4", "-dcp 4"),
    8: ("--enable-sleep-mode", "--enable-sleep-mode"),
    9: ("--enable-lora", "--enable-lora"),
    # K3 is on vLLM's breakable-CUDA-graph list: that forces compilation mode none unless opted out
    11: ("-cc.mode 1", "STOCK_TORCH_COMPILE"),
    12: ("--enforce-eager", "--enforce-eager"),
    # a dotted -sc.KEY replaces the whole --speculative-config JSON in vLLM: give the full JSON
    13: (f"-sc '{SPEC_JSON.replace('dspark', 'eagle3', 1)}'", "eagle3"),
    14: (
        f"-sc '{SPEC_JSON[:-1]},\"enable_adaptive_verification\":true}}'",
        "enable_adaptive_verification",
    ),
    15: ("--mamba-ssm-cache-dtype bfloat16", "recurrent bfloat16"),
    16: ("--use-replayssm", "--use-replayssm"),
    17: (f"-sc '{SPEC_JSON.replace(':7', ':8')}'", "8"),
}
# env a violation needs besides its flags
VIOLATION_ENV = {11: "VLLM_USE_BREAKABLE_CUDAGRAPH=0 "}
# rules whose violation vLLM already refuses while building the config (k3.vllm_refuses, too)
REFUSED_BEFORE_GATE = {6, 9, 10}
# stock torch.compile on Model Runner V2 also turns CUDA graphs off (vLLM does the same)
ALSO_FAILS = {11: ["k3.full_cudagraphs"]}


def _only_rule_fails(checks, rule: k3.Rule, detail: str) -> None:
    refused = [c for c in checks if c.id == "k3.vllm_refuses"]
    assert bool(refused) == (rule.number in REFUSED_BEFORE_GATE), refused
    also = ALSO_FAILS.get(rule.number, [])
    failing = [
        c
        for c in checks
        if c.status is Status.FAIL and c.id != "k3.vllm_refuses" and c.id not in also
    ]
    assert [c.id for c in failing] == [rule.id], failing
    (check,) = failing
    assert check.message.startswith(f"Kimi K3 specialized decode does not support {rule.reason}")
    assert detail in check.message
    assert check.remedy


@pytest.mark.parametrize("number", sorted(VIOLATIONS))
def test_flag_violation_flags_only_that_rule(number):
    flags, detail = VIOLATIONS[number]
    spec = parse_vllm_command(f"{VIOLATION_ENV.get(number, '')}{UPSTREAM} {flags}").spec
    _only_rule_fails(deployment_checks(spec, GB300_X16), k3.RULES[number - 1], detail)


def test_rule_1_gpu_arch_on_hopper():
    checks = deployment_checks(parse_vllm_command(UPSTREAM).spec, _report((9, 0), 8, 1))
    _only_rule_fails(checks, k3.RULES[0], "GPU 0 is SM90")


def test_rule_2_moe_config_from_local_checkout(tmp_path):
    line = UPSTREAM.replace("moonshotai/Kimi-K3 ", f"{_k2_model_dir(tmp_path)} ")
    checks = deployment_checks(parse_vllm_command(line).spec, GB300_X16)
    _only_rule_fails(checks, k3.RULES[1], "num_experts=384 (K3: 896)")


def test_rule_2_accepts_exact_k3_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(k3.K3_MOE_CONFIG))
    spec = parse_vllm_command(UPSTREAM).spec.with_(model=str(tmp_path))
    assert _by_id(deployment_checks(spec, GB300_X16))["k3.moe_config"].status is Status.PASS


def test_rule_10_v1_model_runner():
    # unset means V2 in vLLM 0.33; =0 forces V1 (which also refuses DSpark before the gate)
    unset = UPSTREAM.replace("VLLM_USE_V2_MODEL_RUNNER=1 ", "")
    assert _by_id(deployment_checks(parse_vllm_command(unset).spec, GB300_X16))[
        "k3.model_runner"
    ].status is (Status.PASS)
    line = UPSTREAM.replace("VLLM_USE_V2_MODEL_RUNNER=1 ", "VLLM_USE_V2_MODEL_RUNNER=0 ")
    checks = deployment_checks(parse_vllm_command(line).spec, GB300_X16)
    _only_rule_fails(checks, k3.RULES[9], "VLLM_USE_V2_MODEL_RUNNER=0")
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in _by_id(checks)["k3.model_runner"].remedy


def test_rule_18_aux_stream_only_with_speculation():
    line = f"{k3.ENV_AUX_ATTN_RES_STREAM}=1 {UPSTREAM}"
    checks = deployment_checks(parse_vllm_command(line).spec, GB300_X16)
    _only_rule_fails(checks, k3.RULES[17], k3.ENV_AUX_ATTN_RES_STREAM)
    no_spec = parse_vllm_command(line).spec.with_(speculative_config=None)
    assert _by_id(deployment_checks(no_spec, GB300_X16))["k3.aux_attn_res_stream"].status is (
        Status.PASS
    )


def test_all_failing_rules_are_reported_at_once():
    line = (
        "vllm serve moonshotai/Kimi-K3 -tp 4 -pp 2 -ep --enable-dbo -dcp 2 --enable-sleep-mode "
        "--enable-lora -cc.mode 1 -cc.cudagraph_mode NONE -sc.method eagle "
        "-sc.num_speculative_tokens 9 -sc.enable_adaptive_verification true "
        "--mamba-cache-dtype float32 --use-replayssm"
    )
    env = "VLLM_USE_V2_MODEL_RUNNER=0 VLLM_USE_BREAKABLE_CUDAGRAPH=0 "
    env += f"{k3.ENV_AUX_ATTN_RES_STREAM}=1"
    checks = deployment_checks(parse_vllm_command(f"{env} {line}").spec, _report((9, 0), 8, 1))
    failing = {c.id for c in checks if c.status is Status.FAIL}
    assert RULE_IDS - {"k3.moe_config"} <= failing
    assert {"k3.kv_cache_fp8"} <= failing


def test_rule_1_without_report_is_unknown_and_with_no_gpus_fails():
    spec = parse_vllm_command(UPSTREAM).spec
    assert _by_id(deployment_checks(spec, None))["k3.gpu_arch"].status is Status.UNKNOWN
    empty = HardwareReport(nodes=[], source="live")
    check = _by_id(deployment_checks(spec, empty))["k3.gpu_arch"]
    assert check.status is Status.FAIL and "no GPU found" in check.message
    unread = _by_id(deployment_checks(spec, _report(Unavailable("NVML error"), 8, 1)))
    assert unread["k3.gpu_arch"].status is Status.UNKNOWN


def test_gpu_count_counts_tp_pp_dp_not_dcp():
    spec = parse_vllm_command(UPSTREAM_DCP.replace("-tp 8", "-tp 16")).spec
    one_tray = _report((10, 3), 4, 1)
    check = _by_id(deployment_checks(spec, one_tray))["k3.gpu_count"]
    assert check.status is Status.FAIL and "16 GPUs needed" in check.message
    assert "the report has 4 GPUs on 1 node" in check.message
    four_trays = _by_id(deployment_checks(spec, GB300_X16))["k3.gpu_count"]
    assert four_trays.status is Status.PASS
    dp2 = spec.with_(data_parallel_size=2)
    assert _by_id(deployment_checks(dp2, GB300_X16))["k3.gpu_count"].status is Status.FAIL


def test_fp8_kv_and_decode_backend_values():
    spec = parse_vllm_command(UPSTREAM).spec
    by_id = _by_id(deployment_checks(spec.with_(kv_cache_dtype="auto"), GB300_X16))
    assert by_id["k3.kv_cache_fp8"].status is Status.FAIL
    assert by_id["k3.kv_cache_fp8"].remedy == "--kv-cache-dtype fp8"
    stock = spec.with_(additional_config={"decode_backend": "auto"})
    assert _by_id(deployment_checks(stock, GB300_X16))["k3.decode_backend"].status is Status.WARN
    bad = _by_id(deployment_checks(spec.with_(additional_config={"decode_backend": "x"})))
    assert bad["k3.decode_backend"].status is Status.FAIL
    assert k3.DECODE_BACKEND_ERROR in bad["k3.decode_backend"].message
    mla = spec.with_(additional_config={"decode_backend": "latency_specialized", "mla_core": "x"})
    assert _by_id(deployment_checks(mla))["k3.additional_config"].status is Status.FAIL


# ---------------------------------------------------------------- coverage of prepared batches

PREPARED_SIZES = "-cc.cudagraph_capture_sizes [1,2,3,4,5,6,7,8,16,32,64]"


def test_coverage_q8_with_prepared_capture_sizes_and_8_seqs_is_complete():
    spec = parse_vllm_command(f"{UPSTREAM} --max-num-seqs 8 {PREPARED_SIZES}").spec
    cov = fast_path_coverage(spec)
    assert (cov.q, cov.max_requests) == (8, 8)
    assert cov.fast_requests == tuple(range(1, 9)) and cov.missed == ()
    by_id = _by_id(deployment_checks(spec, GB300_X16))
    assert by_id["k3.fast_path_coverage"].status is Status.PASS
    assert by_id["k3.max_num_seqs"].status is Status.PASS


def test_coverage_with_vllm_default_capture_sizes_misses_odd_steps():
    cov = fast_path_coverage(parse_vllm_command(f"{UPSTREAM} --max-num-seqs 8").spec)
    # default sizes (1, 2, 4, 8, 16, 24, ...): 24/40/48/56-token steps pad to non-prepared graphs
    assert cov.capture_sizes_assumed
    assert cov.fast_requests == (1, 2, 4, 8)
    assert [m[0] for m in cov.missed] == [3, 5, 6, 7]
    assert cov.missed[0] == (3, 24, 24)


@pytest.mark.parametrize(("draft", "max_requests"), [(0, 64), (1, 32), (3, 16), (5, 10), (7, 8)])
def test_coverage_max_requests_is_64_over_q(draft, max_requests):
    spec = parse_vllm_command(
        f"{UPSTREAM} -sc.num_speculative_tokens {draft} {PREPARED_SIZES}"
    ).spec
    cov = fast_path_coverage(spec)
    assert cov.q == 1 + draft and cov.max_requests == max_requests
    by_id = _by_id(deployment_checks(spec.with_(max_num_seqs=max_requests + 1), GB300_X16))
    assert by_id["k3.max_num_seqs"].status is Status.WARN
    assert f"--max-num-seqs {max_requests}" in by_id["k3.max_num_seqs"].remedy


def test_coverage_q6_pads_through_prepared_batches():
    # q = 6: 10 requests fit in 64 tokens; 2 req = 12 tok pads to 16, 6 req = 36 tok pads to 64
    spec = parse_vllm_command(f"{UPSTREAM} -sc.num_speculative_tokens 5 {PREPARED_SIZES}").spec
    cov = fast_path_coverage(spec.with_(max_num_seqs=10))
    assert cov.fast_requests == tuple(range(1, 11))


def test_coverage_missing_prepared_size_and_eager():
    spec = parse_vllm_command(f"{UPSTREAM} --max-num-seqs 8 -cc.cudagraph_capture_sizes [8,16,32]")
    cov = fast_path_coverage(spec.spec)
    assert cov.fast_requests == (1, 2, 3, 4) and cov.missed[-1] == (8, 64, None)
    check = _by_id(deployment_checks(spec.spec))["k3.fast_path_coverage"]
    assert check.status is Status.WARN and "4 of 8 step sizes" in check.message
    eager = fast_path_coverage(spec.spec.with_(enforce_eager=True))
    assert eager.eager and eager.fast_requests == ()


UNSUPPORTED = "vllm/models/kimi_k3/nvidia/specialized_decode/runtime/__init__.py"


@pytest.mark.vllm_src
def test_reason_strings_are_quoted_exactly_from_vllm():
    """k3.RULES' reasons, in order, are the (condition, reason) pairs of vLLM 0.33.0's own
    `unsupported(vllm_config)` (read from the wheel's source, not imported)."""
    import ast

    from tests.vllm_src import ensure_sources

    src, why = ensure_sources()
    if src is None:
        pytest.skip(why)
    tree = ast.parse((src / UNSUPPORTED).read_text())
    fn = next(
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "unsupported"
    )
    checks = next(n for n in ast.walk(fn) if isinstance(n, ast.Tuple) and len(n.elts) > 10)
    pairs = [pair for pair in checks.elts if isinstance(pair, ast.Tuple)]
    reasons = [ast.literal_eval(pair.elts[1]) for pair in pairs]
    assert reasons == [r.reason for r in k3.RULES]


def test_rule_table_shape():
    assert [r.number for r in k3.RULES] == list(range(1, 19))
    assert len({r.id for r in k3.RULES}) == 18
    assert k3.PREPARED_TOKEN_BATCHES == (*range(1, 9), 16, 32, 64)
