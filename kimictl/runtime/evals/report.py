"""Result types of the correctness gate: a `CheckResult` per check, a `ValidationReport` per run.

Every check states its thresholds, its measured numbers and the evidence (the worst examples), so a
FAIL can be argued with and a PASS can be trusted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "PROVENANCE_KEYS",
    "CheckResult",
    "CheckSkipped",
    "CheckStatus",
    "EndpointInfo",
    "ValidationReport",
    "provenance_updates",
    "require_context",
]

# Keys `validate --gate` writes into a profile's [provenance] (tune and serve read them).
PROVENANCE_KEYS = (
    "validation",
    "validated_at",
    "validation_mode",
    "validation_candidate",
    "validation_reference",
    "validation_evidence",
)


class CheckStatus(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    # The check could not be run (endpoint refused a feature): blocks the gate like a FAIL.
    ERROR = "error"
    # The served context is too short for what the check sends: reported, not gating.
    SKIP = "skip"


class CheckSkipped(Exception):
    """Raised by a check's `prepare` when it cannot fit the served context; the reason is shown."""


def require_context(check: str, needed: int, max_len: int) -> None:
    """SKIP `check` when it needs `needed` tokens (prompt + output) and the server serves fewer."""
    if needed > max_len:
        raise CheckSkipped(
            f"{check} needs {needed} tokens of context (prompt + output); "
            f"the servers serve {max_len} (max_model_len)"
        )


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome. `thresholds` and `metrics` share key names where they compare."""

    name: str
    status: CheckStatus
    summary: str
    thresholds: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status is CheckStatus.PASS

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "summary": self.summary,
            "thresholds": self.thresholds,
            "metrics": self.metrics,
            "failures": self.failures,
            "evidence": self.evidence,
            "seconds": round(self.seconds, 2),
        }


@dataclass(frozen=True)
class EndpointInfo:
    name: str
    url: str
    model: str
    max_model_len: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "model": self.model,
            "max_model_len": self.max_model_len,
        }


@dataclass(frozen=True)
class ValidationReport:
    candidate: EndpointInfo
    reference: EndpointInfo
    mode: str
    checks: list[CheckResult]
    started_at: str
    seconds: float
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No check failed or errored, and at least one ran (a skipped check does not gate)."""
        ran = [c for c in self.checks if c.status is not CheckStatus.SKIP]
        return bool(ran) and all(c.passed for c in ran)

    @property
    def skipped(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status is CheckStatus.SKIP]

    @property
    def verdict(self) -> str:
        return "pass" if self.passed else "fail"

    def evidence_summary(self) -> str:
        """One line per check, short enough for a profile's provenance."""
        return "; ".join(f"{c.name} {c.status.value}: {c.summary}" for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "mode": self.mode,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 1),
            "candidate": self.candidate.to_json(),
            "reference": self.reference.to_json(),
            "checks": [c.to_json() for c in self.checks],
            "warnings": self.warnings,
        }


def provenance_updates(report: ValidationReport) -> dict[str, str]:
    """What `validate --gate PROFILE` writes into the profile's [provenance]."""
    values = (
        report.verdict,
        report.started_at,
        report.mode,
        f"{report.candidate.name} {report.candidate.url}",
        f"{report.reference.name} {report.reference.url}",
        report.evidence_summary(),
    )
    return dict(zip(PROVENANCE_KEYS, values, strict=True))
