"""The correctness gate between two endpoints serving one model (`kimictl validate`).

Five checks, each with a threshold, a result and the evidence: greedy agreement, long-context
numerics and retrieval, temperature sampling, structured output, full context.
"""

from __future__ import annotations

from kimictl.runtime.evals.client import Endpoint
from kimictl.runtime.evals.plan import CHECKS, Plan, Thresholds, plan_for
from kimictl.runtime.evals.report import (
    PROVENANCE_KEYS,
    CheckResult,
    CheckStatus,
    EndpointInfo,
    ValidationReport,
    provenance_updates,
)
from kimictl.runtime.evals.runner import run_validation, score_check

__all__ = [
    "CHECKS",
    "PROVENANCE_KEYS",
    "CheckResult",
    "CheckStatus",
    "Endpoint",
    "EndpointInfo",
    "Plan",
    "Thresholds",
    "ValidationReport",
    "plan_for",
    "provenance_updates",
    "run_validation",
    "score_check",
]
