"""kimictl's deployment verdict vs vLLM 0.33.0's own parser, config builder and K3 gate.

vLLM's real Python sources (tests/vllm_src.py: the release wheel, cached, torch/CUDA stubbed,
platform answering as GB300) run in a child process beside kimictl's rules on generated
deployments (tests/vllm_cases.py). Outcomes compared:

| vLLM                                   | kimictl                                                 |
| -------------------------------------- | ------------------------------------------------------- |
| parser rejects (bad_input)             | InputError (exit 2)                                     |
| config build raises (refused)          | a FAIL; where kimictl models the refusal, vLLM's words  |
| gate's first reason (not_ready)        | a FAIL whose message is vLLM's "does not support ..."   |
| decode_backend auto (stock)            | k3.decode_backend WARN (fast path off)                  |
| gate passes (ready)                    | no FAIL among the checks vLLM makes                     |
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kimictl.core.errors import InputError
from kimictl.deployment import k3
from kimictl.deployment.vllm_args import parse_vllm_command
from kimictl.runtime.checks.hardware import HardwareReport, load_snapshots
from kimictl.runtime.checks.rules.base import Check, Status
from kimictl.runtime.checks.rules.deployment import deployment_checks

sys.path.insert(0, str(Path(__file__).parent))
import vllm_cases
import vllm_src

pytestmark = pytest.mark.vllm_src

ROOT = Path(__file__).resolve().parent.parent
GB300 = sorted((ROOT / "tests/fixtures/snapshots/gb300-tp16-healthy").glob("*.json"))
SEED, COUNT = 14, 520
# kimictl's own findings beyond vLLM's config build and gate (its added value, not compared)
KIMICTL_ONLY = {"k3.kv_cache_fp8", "k3.gpu_count", "k3.max_num_seqs", "k3.fast_path_coverage"}


class VllmWorker:
    """One child process with vLLM's sources loaded; one JSON line per deployment."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests/vllm_src.py"), "worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )

    def verdicts(self, deployments: list[vllm_cases.Deployment]) -> list[dict[str, Any]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        payload = "".join(json.dumps({"args": d.words, "env": d.env}) + "\n" for d in deployments)
        out: list[dict[str, Any]] = []
        # one at a time keeps the pipe from filling; the child answers each line at once
        for line in payload.splitlines():
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            out.append(json.loads(self.proc.stdout.readline()))
        return out

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def worker() -> Iterator[VllmWorker]:
    sources, why = vllm_src.ensure_sources()
    if sources is None:
        pytest.skip(f"vLLM {vllm_src.VLLM_VERSION} sources unavailable: {why}")
    w = VllmWorker()
    yield w
    w.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return vllm_cases.make_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def gb300() -> HardwareReport:
    return load_snapshots(GB300)


@dataclass
class Kimictl:
    outcome: str  # bad_input | refused | not_ready | stock | ready
    failing: list[Check]
    error: str = ""


def kimictl_outcome(dep: vllm_cases.Deployment, hw: HardwareReport) -> Kimictl:
    try:
        spec = parse_vllm_command(dep.command()).spec
    except InputError as exc:
        return Kimictl("bad_input", [], exc.message)
    checks = [c for c in deployment_checks(spec, hw) if c.id not in KIMICTL_ONLY]
    failing = [c for c in checks if c.status is Status.FAIL]
    backend = next(c for c in checks if c.id == "k3.decode_backend")
    if any(c.id == "k3.vllm_refuses" for c in failing) or backend.status is Status.FAIL:
        return Kimictl("refused", failing)
    if backend.status is Status.WARN:
        return Kimictl("stock", failing)
    return Kimictl("not_ready" if failing else "ready", failing)


def disagreement(vllm: dict[str, Any], ours: Kimictl) -> str | None:
    """None when kimictl agrees with vLLM, else the class of the disagreement."""
    theirs = vllm["outcome"]
    if theirs == "harness_error":
        return f"harness error: {vllm['message']}"
    if theirs == "refused":
        if ours.outcome not in ("refused", "not_ready"):
            return f"vLLM refuses ({vllm['message'][:80]}), kimictl says {ours.outcome}"
        return None
    if theirs != ours.outcome:
        return f"vLLM {theirs}, kimictl {ours.outcome}"
    if theirs == "not_ready":
        wanted = k3.unsupported_message(vllm["reason"])
        if not any(c.message.startswith(wanted) for c in ours.failing):
            return f"vLLM's first reason {vllm['reason']!r} not among kimictl's failing checks"
    return None


def compare(
    worker: VllmWorker, deployments: list[vllm_cases.Deployment], hw: HardwareReport
) -> tuple[Counter[str], Counter[str], list[str]]:
    verdicts = worker.verdicts(deployments)
    classes: Counter[str] = Counter()
    outcomes: Counter[str] = Counter(v["outcome"] for v in verdicts)
    examples: list[str] = []
    for dep, vllm in zip(deployments, verdicts, strict=True):
        why = disagreement(vllm, kimictl_outcome(dep, hw))
        if why is not None:
            classes[why] += 1
            if len(examples) < 8:
                examples.append(f"{why}: {dep.command()}")
    return classes, outcomes, examples


def test_generated_deployments_agree_with_vllm(
    worker: VllmWorker, models: dict[str, Path], gb300: HardwareReport
) -> None:
    sources, _ = vllm_src.ensure_sources()
    assert sources is not None  # the worker fixture skipped otherwise
    choices = vllm_cases.cache_dtype_choices(sources)
    # vLLM's own lists, so a new dtype in vLLM is generated without editing this suite
    assert "float16" in choices["--mamba-ssm-cache-dtype"] and "fp8" in choices["--kv-cache-dtype"]
    extra = vllm_cases.cache_dtype_mutations(choices)
    deployments = vllm_cases.generate(models, seed=SEED, count=COUNT + 2 * len(extra), extra=extra)
    assert len(deployments) >= 500
    tags = {t for d in deployments for t in d.tags}
    assert set(extra) <= tags  # every value of every cache dtype option, each alone
    classes, outcomes, examples = compare(worker, deployments, gb300)
    # the generator reaches every outcome, so agreement is not agreement on one kind
    assert {"ready", "not_ready", "refused", "stock", "bad_input"} <= set(outcomes), outcomes
    assert not classes, (
        f"{sum(classes.values())} of {len(deployments)} disagree: {dict(classes)}; {examples}"
    )
    assert not examples


def run_one(worker: VllmWorker, dep: vllm_cases.Deployment, hw: HardwareReport) -> None:
    (vllm,) = worker.verdicts([dep])
    ours = kimictl_outcome(dep, hw)
    assert disagreement(vllm, ours) is None, (vllm, ours.outcome, [c.message for c in ours.failing])


def deployment(models: dict[str, Path], *words: str, **env: str) -> vllm_cases.Deployment:
    base = [str(models["k3"]), "-tp", "8", "--kv-cache-dtype", "fp8"]
    base += ["--additional-config", '{"decode_backend": "latency_specialized"}']
    return vllm_cases.Deployment([*base, *words], dict(env))


SPEC = '{"method": "dspark", "model": "%s", "num_speculative_tokens": 7}'


# ---- named tests, one per disagreement class of issue 14 (each checks vLLM AND kimictl)


def expect(worker: VllmWorker, dep: vllm_cases.Deployment, hw: HardwareReport, outcome: str,
           reason: str | None = None) -> None:  # fmt: skip
    (vllm,) = worker.verdicts([dep])
    assert vllm["outcome"] == outcome, vllm
    if reason is not None:
        assert vllm["reason"] == reason, vllm
    ours = kimictl_outcome(dep, hw)
    assert disagreement(vllm, ours) is None, (vllm, ours.outcome, [c.message for c in ours.failing])


def test_v2_runner_is_the_default(worker, models, gb300) -> None:  # type: ignore[no-untyped-def]
    expect(worker, deployment(models), gb300, "ready")
    expect(worker, deployment(models, VLLM_USE_V2_MODEL_RUNNER="0"), gb300, "not_ready",
           "the V1 model runner")  # fmt: skip


def test_env_values_parse_like_vllm_envs(worker, models, gb300) -> None:  # type: ignore[no-untyped-def]
    spec = ["--speculative-config", SPEC % models["k3-dspark-draft"]]
    expect(worker, deployment(models, *spec, VLLM_KIMI_K3_AUX_ATTN_RES_STREAM="0"), gb300, "ready")
    expect(worker, deployment(models, *spec, VLLM_KIMI_K3_AUX_ATTN_RES_STREAM="2"), gb300,
           "not_ready", "the AttnRes aux stream")  # fmt: skip
    # without speculation vLLM never reads the variable
    expect(worker, deployment(models, VLLM_KIMI_K3_AUX_ATTN_RES_STREAM="1"), gb300, "ready")
    expect(worker, deployment(models, VLLM_USE_V2_MODEL_RUNNER="true"), gb300, "refused")


@pytest.mark.parametrize("variant", ["no-router-func", "no-expert-groups", "int-betas"])
def test_config_json_missing_fields_take_class_defaults(worker, models, gb300, variant) -> None:  # type: ignore[no-untyped-def]
    dep = deployment(models)
    dep.words[0] = str(models[variant])
    expect(worker, dep, gb300, "ready")


def test_config_json_default_that_fails(worker, models, gb300) -> None:  # type: ignore[no-untyped-def]
    dep = deployment(models)
    dep.words[0] = str(models["no-hidden-act"])  # KimiLinearConfig default: silu
    expect(worker, dep, gb300, "not_ready", k3.RULES[1].reason)


def test_breakable_cudagraphs_force_compilation_mode_none(worker, models, gb300) -> None:  # type: ignore[no-untyped-def]
    expect(worker, deployment(models, "-cc", '{"mode": 1}'), gb300, "ready")
    expect(worker, deployment(models, "-cc", '{"mode": 1}', VLLM_USE_BREAKABLE_CUDAGRAPH="0"),
           gb300, "not_ready", "torch.compile")  # fmt: skip


@pytest.mark.parametrize(
    ("words", "outcome"),
    [(["-O1"], "not_ready"), (["-O0"], "not_ready"), (["--enforce-eager"], "not_ready"),
     (["-O2"], "ready"), (["-O", "3"], "ready"), (["-O0", "-cc.cudagraph_mode", "FULL"], "ready")],
)  # fmt: skip
def test_optimization_levels_pick_the_cudagraph_mode(worker, models, gb300, words, outcome) -> None:  # type: ignore[no-untyped-def]
    expect(worker, deployment(models, *words), gb300, outcome)


@pytest.mark.parametrize(
    ("dtype", "outcome"), [("half", "not_ready"), ("float32", "not_ready"), ("bfloat16", "ready")]
)
def test_dtype_decides_the_kda_conv_state(worker, models, gb300, dtype, outcome) -> None:  # type: ignore[no-untyped-def]
    expect(worker, deployment(models, "--dtype", dtype), gb300, outcome)


def test_spec_model_without_method_is_a_draft_model(worker, models, gb300) -> None:  # type: ignore[no-untyped-def]
    plain = json.dumps({"model": str(models["draft"]), "num_speculative_tokens": 7})
    expect(worker, deployment(models, "--speculative-config", plain), gb300, "not_ready",
           "speculative methods but DSpark")  # fmt: skip
    named = json.dumps({"model": str(models["k3-dspark-draft"]), "num_speculative_tokens": 7})
    expect(worker, deployment(models, "--speculative-config", named), gb300, "ready")


def test_dbo_is_refused_before_the_gate(worker, models, gb300) -> None:  # type: ignore[no-untyped-def]
    expect(worker, deployment(models, "--ubatch-size", "2"), gb300, "refused")
    expect(worker, deployment(models, "--enable-dbo", VLLM_USE_V2_MODEL_RUNNER="1"), gb300,
           "refused")  # fmt: skip


def test_spec_flag_spellings(worker, models, gb300) -> None:  # type: ignore[no-untyped-def]
    words = ["--spec-method", "dspark", "--spec-model", str(models["k3-dspark-draft"])]
    expect(worker, deployment(models, *words, "--spec-tokens", "7"), gb300, "ready")
    expect(worker, deployment(models, *words, "--spec-tokens", "8"), gb300, "not_ready",
           "more than 7 speculative tokens")  # fmt: skip


def test_disable_forms_turn_switches_off(worker, models, gb300) -> None:  # type: ignore[no-untyped-def]
    on_off = ["--enable-expert-parallel", "--disable-expert-parallel"]
    expect(worker, deployment(models, *on_off), gb300, "ready")
    expect(worker, deployment(models, "--enforce-eager", "--no-enforce-eager"), gb300, "ready")


def test_json_keys_with_dashes(worker, models, gb300) -> None:  # type: ignore[no-untyped-def]
    spec = json.dumps({"method": "dspark", "model": str(models["k3-dspark-draft"]),
                       "num-speculative-tokens": 8})  # fmt: skip
    expect(worker, deployment(models, "--speculative-config", spec), gb300, "not_ready",
           "more than 7 speculative tokens")  # fmt: skip
    expect(worker, deployment(models, "-cc", '{"cudagraph-mode": "FULL"}'), gb300, "bad_input")


@pytest.mark.parametrize(
    "words", [["-O.mode", "1"], ["--enforce-eager=true"], ["-O", '{"mode": 1}'], ["-O", "7"]]
)
def test_spellings_vllm_rejects_are_bad_input(worker, models, gb300, words) -> None:  # type: ignore[no-untyped-def]
    expect(worker, deployment(models, *words), gb300, "bad_input")


def test_refusals_carry_vllms_words(worker, models, gb300) -> None:  # type: ignore[no-untyped-def]
    dep = deployment(models, "--enable-lora")
    (vllm,) = worker.verdicts([dep])
    assert vllm["outcome"] == "refused"
    ours = kimictl_outcome(dep, gb300)
    assert ours.outcome == "refused"
    assert any(vllm["message"] in c.message for c in ours.failing if c.id == "k3.vllm_refuses")


def test_doctor_cli_json_agrees(worker, models) -> None:  # type: ignore[no-untyped-def]
    """A handful through `python -m kimictl doctor --vllm-args ... --json` (the shipped path)."""
    cases = [
        deployment(models),
        deployment(models, "-O1"),
        deployment(models, "-cc", '{"mode": 1}'),
        deployment(models, "--dtype", "half"),
        deployment(models, VLLM_USE_V2_MODEL_RUNNER="0"),
        deployment(models, "-O.mode", "1"),
    ]
    snapshots = [a for p in GB300 for a in ("--from-snapshot", str(p))]
    for dep, vllm in zip(cases, worker.verdicts(cases), strict=True):
        done = subprocess.run(
            [sys.executable, "-m", "kimictl", "doctor", "--vllm-args", dep.command(), "--json",
             *snapshots],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
        )  # fmt: skip
        if vllm["outcome"] == "bad_input":
            assert done.returncode == 2 and done.stderr.startswith("error:"), done.stderr
            continue
        doc = json.loads(done.stdout)
        failing = [c for c in doc["checks"] if c["section"] == "Deployment"
                   and c["status"] == "fail" and c["id"] not in KIMICTL_ONLY]  # fmt: skip
        if vllm["outcome"] == "ready":
            assert not failing, failing
        else:
            wanted = k3.unsupported_message(vllm["reason"])
            assert any(c["message"].startswith(wanted) for c in failing), (wanted, failing)


def test_doctor_runs_vllms_gate_where_vllm_is_importable(worker, models) -> None:  # type: ignore[no-untyped-def]
    """Doctor with vLLM importable (here: the stubbed sources) adds vLLM's verdict as a check."""
    snapshots = [a for p in GB300 for a in ("--from-snapshot", str(p))]
    for words, status in ((["-O1"], "fail"), ([], "pass")):
        dep = deployment(models, *words)
        done = subprocess.run(
            [sys.executable, str(ROOT / "tests/vllm_src.py"), "kimictl", "doctor", "--json",
             "--vllm-args", dep.command(), *snapshots],
            capture_output=True, text=True, cwd=ROOT, timeout=300,
        )  # fmt: skip
        doc = json.loads(done.stdout)
        by_id = {c["id"]: c for c in doc["checks"]}
        assert by_id["vllm.gate"]["status"] == status, by_id["vllm.gate"]
        assert "vllm.agreement" not in by_id  # kimictl's rules agree
        if status == "fail":
            assert by_id["vllm.gate"]["message"].endswith(k3.RULES[11].message)


def test_a_disagreement_is_flagged_as_a_kimictl_bug() -> None:
    from kimictl.runtime.checks.rules.base import Section
    from kimictl.runtime.checks.rules.vllm_check import _agrees
    from kimictl.runtime.checks.vllm_gate import VllmVerdict

    passing = [Check("k3.decode_backend", Section.DEPLOYMENT, Status.PASS, "ok")]
    failing = [*passing, Check("k3.tp", Section.DEPLOYMENT, Status.FAIL, k3.RULES[2].message)]
    assert _agrees(VllmVerdict("ready"), passing)
    assert not _agrees(VllmVerdict("ready"), failing)
    assert _agrees(VllmVerdict("not_ready", reason=k3.RULES[2].reason), failing)
    assert not _agrees(VllmVerdict("not_ready", reason=k3.RULES[3].reason), failing)
