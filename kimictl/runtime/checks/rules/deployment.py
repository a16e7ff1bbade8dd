"""The deployment side of the K3 fast-path rules: a DeploymentSpec (+ hardware report) -> checks.

vLLM's `unsupported(vllm_config)` stops at the FIRST failing condition; kimictl reports all 18 at
once, each with vLLM's own reason string (deployment.k3.RULES) and the exact flag change that
fixes it. On top: decode_backend value, FP8 KV cache (assumed by the MLA core, not checked by vLLM),
enough GPUs for TP x PP x DP, and fast-path coverage of the prepared token batches.

Rules 2 and 6-18 judge the values vLLM BUILDS from the flags (checks.rules.effective: V2 runner
default, env values parsed as vLLM parses them, config-class defaults, breakable CUDA graphs, -O
levels, dtypes, speculative method inference), and vLLM's refusals before its gate are FAIL lines
of their own (k3.vllm_refuses). Choices documented here (see docs/profiles.md, docs/doctor.md):
- Rule 1 (SM100/103) with no hardware report (`hw is None`) is UNKNOWN; with a report that has no
  GPUs at all it FAILS ("no GPU found"); a GPU whose compute capability is unreadable is UNKNOWN.
- Rule 2 (the MoE text config) reads `config.json` when `spec.model` is a local folder, fills the
  fields it lacks with KimiLinearConfig's defaults as vLLM does, and compares the eight fields
  exactly; a hub name containing "Kimi-K3" passes as assumed-from-name; any other name is UNKNOWN
  (kimictl downloads nothing).
- Coverage assumes that a decode step of T tokens is padded up to the smallest CUDA-graph capture
  size >= T, and takes the fast path only when that size is a prepared batch (1..8, 16, 32, 64).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kimictl.core.outputs import read_json_object
from kimictl.deployment import k3
from kimictl.deployment.spec import DeploymentSpec
from kimictl.runtime.checks.rules.base import Check, Section, Status
from kimictl.runtime.checks.rules.effective import Effective, effective_config

if TYPE_CHECKING:
    from kimictl.runtime.checks.hardware import HardwareReport

__all__ = ["Coverage", "deployment_checks", "fast_path_coverage", "read_model_config"]

_K3_NAME = re.compile(r"kimi[-_ ]?k3", re.IGNORECASE)


def _pass(rule: k3.Rule, message: str) -> Check:
    return Check(rule.id, Section.DEPLOYMENT, Status.PASS, f"rule {rule.number}: {message}")


def _fail(rule: k3.Rule, detail: str, remedy: str) -> Check:
    return Check(rule.id, Section.DEPLOYMENT, Status.FAIL, f"{rule.message} ({detail})", remedy)


def _unknown(rule: k3.Rule, detail: str, remedy: str) -> Check:
    message = f"rule {rule.number} ({rule.reason}) not checked: {detail}"
    return Check(rule.id, Section.DEPLOYMENT, Status.UNKNOWN, message, remedy)


# ---------------------------------------------------------------- the 18 rules


def _rule_gpu_arch(rule: k3.Rule, spec: DeploymentSpec, hw: HardwareReport | None) -> Check:
    if hw is None:
        return _unknown(
            rule,
            "no hardware report",
            "run kimictl doctor on the GPU node, or pass --from-snapshot FILE",
        )
    gpus = list(hw.gpus)
    if not gpus:
        return _fail(
            rule,
            "no GPU found",
            "run on a node with SM100/SM103 GPUs (B200, GB200, B300, GB300)",
        )
    bad: list[str] = []
    unread: list[str] = []
    for gpu in gpus:
        cc = gpu.compute_capability
        if not isinstance(cc, tuple):
            unread.append(f"GPU {gpu.index}")
        elif cc[0] != k3.SUPPORTED_COMPUTE_CAPABILITY_MAJOR:
            bad.append(f"GPU {gpu.index} is SM{cc[0]}{cc[1]}")
    if bad:
        shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
        return _fail(
            rule,
            shown,
            "deploy on SM100/SM103 GPUs (B200, GB200, B300, GB300); on other GPUs serve with "
            "--additional-config.decode_backend auto",
        )
    if unread:
        return _unknown(
            rule,
            f"compute capability unreadable on {', '.join(unread)}",
            "check the NVIDIA driver (nvidia-smi) on that node",
        )
    return _pass(rule, f"all {len(gpus)} GPUs are SM10x")


def read_model_config(model: str) -> dict[str, Any] | None:
    """The text config of a local model folder (its `text_config` when nested), else None."""
    path = Path(model).expanduser()
    config_file = path / "config.json"
    if not config_file.is_file():
        return None
    raw = read_json_object(config_file)
    if raw is None:
        return None
    text = raw.get("text_config")
    return text if isinstance(text, dict) else raw


def _rule_moe_config(rule: k3.Rule, spec: DeploymentSpec, eff: Effective) -> Check:
    config = eff.text_config
    if config is None:
        if _K3_NAME.search(spec.model):
            return _pass(rule, f"{spec.model} is Kimi K3 (assumed from the name)")
        return _unknown(
            rule,
            f"cannot read the text config of {spec.model!r} (no local config.json)",
            "point the model at a local checkout with config.json to check its MoE config",
        )
    diffs = [
        f"{key}={config.get(key)!r} (K3: {want!r})"
        for key, want in k3.K3_MOE_CONFIG.items()
        if config.get(key) != want
    ]
    if diffs:
        return _fail(
            rule,
            "; ".join(diffs[:3]) + (f"; {len(diffs) - 3} more" if len(diffs) > 3 else ""),
            "serve Kimi K3 itself; for other models use --additional-config.decode_backend auto",
        )
    return _pass(
        rule,
        "text config is Kimi K3's one-group sigmoid top-16 SiTU MoE "
        "(missing fields take KimiLinearConfig's defaults, as in vLLM)",
    )


def _rule_simple(rule: k3.Rule, spec: DeploymentSpec, eff: Effective) -> Check:
    """Rules 3-18, on the values vLLM builds (rules.effective), not the raw flags."""
    tp = spec.tensor_parallel_size
    n = rule.number
    if n == 3:
        if tp in k3.ALLOWED_TP:
            return _pass(rule, f"TP {tp}")
        return _fail(rule, f"-tp {tp}", f"change -tp {tp} to -tp 8 or -tp 16")
    if n == 4:
        pp = spec.pipeline_parallel_size
        if pp == 1:
            return _pass(rule, "no pipeline parallelism")
        return _fail(rule, f"-pp {pp}", f"drop -pp {pp} (use -pp 1)")
    if n == 5:
        if not spec.enable_expert_parallel:
            return _pass(rule, "no expert parallelism")
        return _fail(rule, "--enable-expert-parallel", "drop -ep / --enable-expert-parallel")
    if n == 6:
        if not eff.ubatching:
            return _pass(rule, "no DBO (micro-batching)")
        return _fail(
            rule, "--enable-dbo / --ubatch-size > 1", "drop --enable-dbo and --ubatch-size"
        )
    if n == 7:
        dcp = spec.decode_context_parallel_size
        if dcp in (1, tp):
            return _pass(rule, f"DCP {dcp}")
        return _fail(rule, f"-dcp {dcp} with -tp {tp}", f"change -dcp {dcp} to -dcp 1 or -dcp {tp}")
    if n == 8:
        if not spec.enable_sleep_mode:
            return _pass(rule, "no sleep mode")
        return _fail(rule, "--enable-sleep-mode", "drop --enable-sleep-mode")
    if n == 9:
        if not spec.enable_lora:
            return _pass(rule, "no LoRA")
        return _fail(rule, "--enable-lora", "drop --enable-lora")
    if n == 10:
        if eff.v2_model_runner:
            return _pass(rule, f"Model Runner V2 ({eff.v2_why})")
        return _fail(
            rule,
            eff.v2_why,
            f"set {k3.ENV_USE_V2_MODEL_RUNNER}=1 or leave it unset (profile: [env]), and drop "
            "what V2 does not support",
        )
    if n == 11:
        if eff.compilation_mode != "STOCK_TORCH_COMPILE":
            return _pass(rule, f"compilation mode {eff.compilation_mode} ({eff.compilation_why})")
        return _fail(
            rule,
            f"compilation mode STOCK_TORCH_COMPILE ({eff.compilation_why})",
            "drop -cc.mode (or set it to 3, VLLM_COMPILE), or unset VLLM_USE_BREAKABLE_CUDAGRAPH",
        )
    if n == 12:
        if eff.decode_cudagraphs_full:
            return _pass(rule, f"FULL decode CUDA graphs (cudagraph_mode {eff.cudagraph_mode})")
        return _fail(
            rule,
            f"cudagraph_mode {eff.cudagraph_mode}: {eff.cudagraph_why}",
            "drop --enforce-eager, -O0 and -O1 (the default -O2 captures FULL_AND_PIECEWISE), "
            "or set -cc.cudagraph_mode FULL_DECODE_ONLY",
        )
    if n == 13:
        method = eff.speculative_method
        if method is None or method == k3.REQUIRED_SPEC_METHOD:
            return _pass(rule, f"speculative method {method or 'none'}")
        return _fail(rule, eff.method_why, f"set -sc.method {k3.REQUIRED_SPEC_METHOD}")
    if n == 14:
        if not (eff.speculative_method is not None and eff.adaptive_verification):
            return _pass(rule, "no adaptive verification")
        return _fail(
            rule,
            "enable_adaptive_verification is on",
            "set -sc.enable_adaptive_verification false (or remove the key)",
        )
    if n == 15:
        if eff.kda_dtypes is None:
            return _unknown(rule, f"vLLM refuses {eff.kda_why}", "--mamba-ssm-cache-dtype auto")
        if eff.kda_dtypes == ("bfloat16", "float32"):
            return _pass(rule, f"KDA cache dtypes {eff.kda_why}")
        return _fail(
            rule,
            eff.kda_why,
            "use --mamba-cache-dtype auto (or bfloat16) with a BF16 model dtype (--dtype auto or "
            "bfloat16) and --mamba-ssm-cache-dtype auto (or float32)",
        )
    if n == 16:
        if not spec.use_replayssm:
            return _pass(rule, "no ReplaySSM")
        return _fail(rule, "--use-replayssm", "drop --use-replayssm")
    if n == 17:
        nst = eff.num_speculative_tokens if eff.speculative_method is not None else 0
        if nst <= k3.MAX_SPECULATIVE_TOKENS:
            return _pass(rule, f"{nst} speculative tokens")
        return _fail(
            rule,
            f"num_speculative_tokens {nst}",
            f"set -sc.num_speculative_tokens {k3.MAX_SPECULATIVE_TOKENS} (or fewer)",
        )
    if n == 18:
        if eff.speculative_method is not None and eff.aux_stream:
            value = spec.env[k3.ENV_AUX_ATTN_RES_STREAM]
            return _fail(
                rule,
                f"{k3.ENV_AUX_ATTN_RES_STREAM}={value} with speculation on",
                f"unset {k3.ENV_AUX_ATTN_RES_STREAM} (or set it to 0)",
            )
        return _pass(rule, "AttnRes aux stream not combined with speculation")
    raise AssertionError(f"no check for rule {n}")


# ---------------------------------------------------------------- beyond vLLM's 18


def _decode_backend_check(spec: DeploymentSpec) -> Check:
    backend = spec.decode_backend
    cid = "k3.decode_backend"
    if backend == k3.DECODE_BACKEND_SPECIALIZED:
        return Check(cid, Section.DEPLOYMENT, Status.PASS, f"decode_backend {backend}")
    if backend == k3.DECODE_BACKEND_AUTO:
        return Check(
            cid,
            Section.DEPLOYMENT,
            Status.WARN,
            "decode_backend auto: stock decode, the fast path is off (right for a stock A/B twin)",
            f"--additional-config.decode_backend {k3.DECODE_BACKEND_SPECIALIZED}",
        )
    return Check(
        cid,
        Section.DEPLOYMENT,
        Status.FAIL,
        f"{k3.DECODE_BACKEND_ERROR} (got decode_backend {backend!r})",
        f"--additional-config.decode_backend {k3.DECODE_BACKEND_SPECIALIZED}",
    )


def _additional_config_check(spec: DeploymentSpec) -> Check | None:
    bad = [
        f"{key}={spec.additional_config[key]!r} (allowed: {'/'.join(allowed)})"
        for key, allowed in k3.ADDITIONAL_CONFIG_CHOICES.items()
        if key != "decode_backend"
        and key in spec.additional_config
        and spec.additional_config[key] not in allowed
    ]
    if not bad:
        return None
    return Check(
        "k3.additional_config",
        Section.DEPLOYMENT,
        Status.FAIL,
        "additional_config has values K3 does not accept: " + "; ".join(bad),
        "use one of the allowed values, or drop the key (auto)",
    )


def _refusal_checks(eff: Effective) -> list[Check]:
    """What vLLM raises while building the config, before its gate runs (vLLM's words)."""
    return [
        Check(
            "k3.vllm_refuses",
            Section.DEPLOYMENT,
            Status.FAIL,
            f"vLLM refuses this configuration before the K3 gate: {refusal.message}",
            refusal.fix,
        )
        for refusal in eff.refusals
    ]


def _kv_cache_check(spec: DeploymentSpec) -> Check:
    dtype = spec.kv_cache_dtype
    cid = "k3.kv_cache_fp8"
    if dtype.startswith("fp8"):
        return Check(cid, Section.DEPLOYMENT, Status.PASS, f"KV cache {dtype}")
    return Check(
        cid,
        Section.DEPLOYMENT,
        Status.FAIL,
        f"the specialized MLA core reads the KV cache as FP8, but kv_cache_dtype is {dtype} "
        "(not checked by vLLM)",
        "--kv-cache-dtype fp8",
    )


def _gpu_count_check(spec: DeploymentSpec, hw: HardwareReport | None) -> Check:
    cid = "k3.gpu_count"
    need = spec.gpus_needed
    shape = (
        f"TP {spec.tensor_parallel_size} x PP {spec.pipeline_parallel_size} "
        f"x DP {spec.data_parallel_size} = {need} GPUs"
    )
    if hw is None:
        return Check(
            cid,
            Section.DEPLOYMENT,
            Status.UNKNOWN,
            f"{shape} needed; no hardware report to count GPUs",
            "pass --from-snapshot FILE (one per node) or run on the GPU node",
        )
    have = len(hw.gpus)
    nodes = len(hw.nodes)
    if have >= need:
        return Check(cid, Section.DEPLOYMENT, Status.PASS, f"{shape} needed, {have} in the report")
    return Check(
        cid,
        Section.DEPLOYMENT,
        Status.FAIL,
        f"{shape} needed, the report has {have} GPU{'' if have == 1 else 's'} "
        f"on {nodes} node{'' if nodes == 1 else 's'}",
        "add the other nodes' snapshots (--from-snapshot once per node) or lower -tp/-dp",
    )


@dataclass(frozen=True)
class Coverage:
    """Which decode steps take the fast path (prepared batches are counted in tokens)."""

    q: int  # tokens per request per step (1 + draft tokens)
    max_requests: int  # most requests per step that fit in the largest prepared batch
    max_num_seqs: int | None  # None: vLLM's default (at least 256)
    capture_sizes: tuple[int, ...]  # the CUDA-graph sizes used (given or vLLM's default)
    capture_sizes_assumed: bool  # True when the spec gives none and vLLM's default is assumed
    eager: bool  # no CUDA graphs at all: every step runs the stock forward
    fast_requests: tuple[int, ...]  # step sizes (in requests) that take the fast path
    missed: tuple[tuple[int, int, int | None], ...]  # (requests, tokens, padded size or None)

    @property
    def steps_checked(self) -> int:
        limit = self.max_requests
        return min(limit, self.max_num_seqs) if self.max_num_seqs is not None else limit

    def to_json(self) -> dict[str, Any]:
        return {
            "q": self.q,
            "max_requests": self.max_requests,
            "max_num_seqs": self.max_num_seqs,
            "capture_sizes": list(self.capture_sizes),
            "capture_sizes_assumed": self.capture_sizes_assumed,
            "eager": self.eager,
            "fast_requests": list(self.fast_requests),
            "missed": [list(m) for m in self.missed],
        }


def fast_path_coverage(spec: DeploymentSpec) -> Coverage:
    """For step sizes 1..min(max_num_seqs, 64 // q) requests: which pad to a prepared batch."""
    q = spec.tokens_per_request
    max_requests = k3.MAX_PREPARED_TOKENS // q
    given = spec.cudagraph_capture_sizes
    sizes = tuple(sorted(set(given))) if given else k3.DEFAULT_CUDAGRAPH_CAPTURE_SIZES
    eager = (
        spec.enforce_eager
        or spec.optimization_level == 0
        or str(spec.compilation_config.get("cudagraph_mode", "")).upper() == "NONE"
    )
    limit = max_requests if spec.max_num_seqs is None else min(max_requests, spec.max_num_seqs)
    fast: list[int] = []
    missed: list[tuple[int, int, int | None]] = []
    for requests in range(1, limit + 1):
        tokens = requests * q
        padded = None if eager else next((s for s in sizes if s >= tokens), None)
        if padded is not None and padded in k3.PREPARED_TOKEN_BATCHES:
            fast.append(requests)
        else:
            missed.append((requests, tokens, padded))
    return Coverage(
        q=q,
        max_requests=max_requests,
        max_num_seqs=spec.max_num_seqs,
        capture_sizes=sizes,
        capture_sizes_assumed=not given,
        eager=eager,
        fast_requests=tuple(fast),
        missed=tuple(missed),
    )


def _coverage_checks(spec: DeploymentSpec) -> list[Check]:
    cov = fast_path_coverage(spec)
    q = cov.q
    prepared = ", ".join(str(p) for p in k3.PREPARED_TOKEN_BATCHES)
    checks: list[Check] = []

    mns = cov.max_num_seqs
    if mns is None or mns * q > k3.MAX_PREPARED_TOKENS:
        now = "the vLLM default (256 or more)" if mns is None else str(mns)
        checks.append(
            Check(
                "k3.max_num_seqs",
                Section.DEPLOYMENT,
                Status.WARN,
                f"max-num-seqs is {now} and q = {q} tokens per request: steps with more than "
                f"{cov.max_requests} requests exceed the largest prepared batch "
                f"({k3.MAX_PREPARED_TOKENS} tokens) and run the stock forward",
                f"--max-num-seqs {cov.max_requests} keeps every decode step on the fast path",
            )
        )
    else:
        checks.append(
            Check(
                "k3.max_num_seqs",
                Section.DEPLOYMENT,
                Status.PASS,
                f"max-num-seqs {mns} x q {q} = {mns * q} tokens <= {k3.MAX_PREPARED_TOKENS}",
            )
        )

    span = f"1-{cov.steps_checked}" if cov.steps_checked > 1 else "1"
    if cov.eager:
        checks.append(
            Check(
                "k3.fast_path_coverage",
                Section.DEPLOYMENT,
                Status.WARN,
                "no CUDA graphs: every decode step runs eagerly on the stock forward "
                "(0 requests per step on the fast path)",
                "drop --enforce-eager / -O0 / cudagraph_mode NONE",
            )
        )
    elif cov.missed:
        shown = ", ".join(
            f"{r} req = {t} tok -> " + (f"graph {p}" if p is not None else "no graph")
            for r, t, p in cov.missed[:4]
        )
        more = f" and {len(cov.missed) - 4} more" if len(cov.missed) > 4 else ""
        wanted = [p for p in k3.PREPARED_TOKEN_BATCHES if p >= q] or [k3.MAX_PREPARED_TOKENS]
        source = (
            "vLLM's default capture sizes (assumed)"
            if cov.capture_sizes_assumed
            else ("the capture sizes")
        )
        checks.append(
            Check(
                "k3.fast_path_coverage",
                Section.DEPLOYMENT,
                Status.WARN,
                f"q = {q}: {len(cov.fast_requests)} of {cov.steps_checked} step sizes "
                f"({span} requests) take the fast path; {source} miss the prepared batches "
                f"({prepared} tokens): {shown}{more}",
                "-cc.cudagraph_capture_sizes '["
                + ",".join(str(p) for p in wanted)
                + "]' (the prepared batches)",
            )
        )
    else:
        checks.append(
            Check(
                "k3.fast_path_coverage",
                Section.DEPLOYMENT,
                Status.PASS,
                f"q = {q}: every step of {span} concurrent requests "
                f"({q}-{cov.steps_checked * q} tokens) pads to a prepared batch",
            )
        )
    return checks


def deployment_checks(
    spec: DeploymentSpec,
    hw: HardwareReport | None = None,
    *,
    model_config: dict[str, Any] | None = None,
) -> list[Check]:
    """All deployment findings at once: decode_backend, the 18 rules in vLLM's order, FP8 KV,
    GPU count, and fast-path coverage. `model_config` overrides reading config.json (rule 2)."""
    eff = effective_config(spec, model_config)
    checks: list[Check] = [_decode_backend_check(spec)]
    extra = _additional_config_check(spec)
    if extra is not None:
        checks.append(extra)
    checks.extend(_refusal_checks(eff))
    for rule in k3.RULES:
        if rule.number == 1:
            checks.append(_rule_gpu_arch(rule, spec, hw))
        elif rule.number == 2:
            checks.append(_rule_moe_config(rule, spec, eff))
        else:
            checks.append(_rule_simple(rule, spec, eff))
    checks.append(_kv_cache_check(spec))
    checks.append(_gpu_count_check(spec, hw))
    checks.extend(_coverage_checks(spec))
    return checks
