"""vLLM's own verdict as a doctor check, and a kimictl-bug flag when kimictl's rules disagree.

Runs only where vLLM 0.33 is importable (kimictl.runtime.checks.vllm_gate); elsewhere doctor has
kimictl's rules alone (kimictl.runtime.checks.rules.effective models vLLM's build, and
tests/test_doctor_vs_vllm.py checks that model against vLLM's real code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kimictl.deployment import k3
from kimictl.runtime.checks.rules.base import Check, Section, Status

if TYPE_CHECKING:
    from kimictl.deployment.spec import DeploymentSpec
    from kimictl.runtime.checks.vllm_gate import VllmVerdict

__all__ = ["KIMICTL_ONLY", "kimictl_outcome", "vllm_gate_checks"]

# kimictl's findings beyond vLLM's config build and gate (not compared with vLLM)
KIMICTL_ONLY = frozenset(
    {"k3.kv_cache_fp8", "k3.gpu_count", "k3.max_num_seqs", "k3.fast_path_coverage"}
)


def kimictl_outcome(checks: list[Check]) -> str:
    """kimictl's rules in vLLM's terms: refused | not_ready | stock | ready."""
    mine = [c for c in checks if c.section is Section.DEPLOYMENT and c.id.startswith("k3.")]
    mine = [c for c in mine if c.id not in KIMICTL_ONLY]
    failing = [c for c in mine if c.status is Status.FAIL]
    backend = next((c for c in mine if c.id == "k3.decode_backend"), None)
    if any(c.id == "k3.vllm_refuses" for c in failing) or (
        backend is not None and backend.status is Status.FAIL
    ):
        return "refused"
    if backend is not None and backend.status is Status.WARN:
        return "stock"
    return "not_ready" if failing else "ready"


def _agrees(verdict: VllmVerdict, checks: list[Check]) -> bool:
    ours = kimictl_outcome(checks)
    if verdict.outcome == "refused":
        return ours in ("refused", "not_ready")
    if verdict.outcome != ours:
        return False
    if verdict.outcome == "not_ready" and verdict.reason is not None:
        wanted = k3.unsupported_message(verdict.reason)
        return any(c.status is Status.FAIL and c.message.startswith(wanted) for c in checks)
    return True


def vllm_gate_checks(spec: DeploymentSpec, checks: list[Check]) -> list[Check]:
    """[] where vLLM 0.33 is not importable; else vLLM's verdict, plus a FAIL when kimictl's
    rules (`checks`) disagree with it."""
    from kimictl.runtime.checks.vllm_gate import vllm_available, vllm_verdict

    if vllm_available() is not None:
        return []
    verdict = vllm_verdict(spec.to_argv()[2:], spec.to_env())
    cid = "vllm.gate"
    if verdict.outcome == "ready":
        found = Check(cid, Section.DEPLOYMENT, Status.PASS, "vLLM's gate: ready")
    elif verdict.outcome == "stock":
        found = Check(
            cid, Section.DEPLOYMENT, Status.WARN, "vLLM's gate: not run (decode_backend auto)"
        )
    elif verdict.outcome == "not_ready":
        found = Check(cid, Section.DEPLOYMENT, Status.FAIL, f"vLLM's gate: {verdict.message}")
    elif verdict.outcome == "refused":
        found = Check(
            cid, Section.DEPLOYMENT, Status.FAIL, f"vLLM refuses the config: {verdict.message}"
        )
    else:
        found = Check(
            cid, Section.DEPLOYMENT, Status.FAIL, f"vLLM's parser rejects it: {verdict.message}"
        )
    out = [found]
    if not _agrees(verdict, checks):
        out.append(
            Check(
                "vllm.agreement",
                Section.DEPLOYMENT,
                Status.FAIL,
                f"kimictl bug: kimictl's rules say {kimictl_outcome(checks)}, vLLM says "
                f"{verdict.outcome}; trust vLLM's line above",
                "report it to kimictl with this launch line",
            )
        )
    return out
