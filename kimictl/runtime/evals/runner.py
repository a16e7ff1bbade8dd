"""Run the selected checks against a candidate and a reference endpoint and build the report.

Each check has three pure-ish steps: `prepare` (token-id prompts, tokenized once on the reference),
`collect` (the HTTP requests, the same on both endpoints, run side by side) and `score` (math only,
on the recorded responses: what the unit tests exercise on captured fixtures).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from typing import Any

from kimictl.core.errors import EndpointError, InputError
from kimictl.runtime.evals import fullctx, greedy, longctx, sampling, structured
from kimictl.runtime.evals.client import Endpoint
from kimictl.runtime.evals.plan import CHECKS, Plan, Thresholds
from kimictl.runtime.evals.report import (
    CheckResult,
    CheckSkipped,
    CheckStatus,
    EndpointInfo,
    ValidationReport,
)

__all__ = ["collect", "prepare", "run_validation", "score_check"]

_PROBE = "Tokenizer probe: the quick brown fox, 12345 {json} <tags>."


def _both(cand: Endpoint, ref: Endpoint, fn: Callable[[Endpoint], Any]) -> tuple[Any, Any]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        fc = pool.submit(fn, cand)
        fr = pool.submit(fn, ref)
        return fc.result(), fr.result()


def _info(ep: Endpoint) -> EndpointInfo:
    return EndpointInfo(name=ep.name, url=ep.base, model=ep.model, max_model_len=ep.max_model_len)


def score_check(name: str, cand: Any, ref: Any, thresholds: Thresholds, plan: Plan) -> CheckResult:
    """Score one check from recorded candidate/reference responses (no network)."""
    if name == "greedy":
        return greedy.score(cand, ref, thresholds, top_k=plan.top_k)
    if name == "long_context":
        return longctx.score(cand, ref, thresholds, bands=plan.lc_bands)
    if name == "sampling":
        return sampling.score(cand, ref, thresholds)
    if name == "structured":
        return structured.score(cand, ref, thresholds)
    if name == "full_context":
        return fullctx.score(cand, ref, thresholds, gen_tokens=plan.fullctx_gen_tokens)
    raise InputError(f"unknown check {name!r}; allowed: {', '.join(CHECKS)}")


def prepare(tokenizer: Endpoint, name: str, plan: Plan, max_len: int) -> Any:
    """Token-id inputs of one check (tokenized on `tokenizer`, shared by both endpoints)."""
    if name == "greedy":
        return greedy.prepare(tokenizer, plan, max_len)
    if name == "long_context":
        return longctx.prepare(tokenizer, plan, max_len)
    if name == "sampling":
        return sampling.prepare(tokenizer, plan, max_len)
    if name == "structured":
        return structured.prepare(tokenizer, plan, max_len)
    if name == "full_context":
        return fullctx.prepare(tokenizer, plan, max_len)
    raise InputError(f"unknown check {name!r}; allowed: {', '.join(CHECKS)}")


def collect(ep: Endpoint, name: str, prepared: Any, plan: Plan) -> Any:
    """One endpoint's raw responses for one check (JSON-serializable; what fixtures record)."""
    module = {
        "greedy": greedy,
        "long_context": longctx,
        "sampling": sampling,
        "structured": structured,
        "full_context": fullctx,
    }[name]
    return module.collect(ep, prepared, plan)


def _foreign_traffic(before: dict[str, tuple[Endpoint, float | None, int]]) -> list[str]:
    """Requests other clients sent during the run: they change batch shapes, hence numerics."""
    warnings = []
    for name, (ep, count, sent_before) in before.items():
        after = ep.finished_requests()
        if count is None or after is None:
            warnings.append(
                f"{name}: /metrics unreadable, so other traffic during the run is unknown"
            )
            continue
        foreign = int(after - count) - (ep.sequences_requested - sent_before)
        if foreign > 0:
            warnings.append(
                f"{name}: {foreign} requests from other clients finished during validation; "
                "batching with them changes numerics (greedy, long-context, seeded): "
                "validate idle endpoints"
            )
    return warnings


def run_validation(
    candidate: Endpoint,
    reference: Endpoint,
    *,
    checks: tuple[str, ...] = CHECKS,
    plan: Plan | None = None,
    thresholds: Thresholds | None = None,
    quick: bool = False,
    progress: Callable[[str], None] = lambda _msg: None,
    capture: dict[str, Any] | None = None,
) -> ValidationReport:
    """Run `checks` in the canonical order; `capture` (if given) receives the raw responses."""
    from kimictl.runtime.evals.plan import plan_for

    unknown = [c for c in checks if c not in CHECKS]
    if unknown or not checks:
        raise InputError(
            f"unknown check(s) {', '.join(unknown) or '(none)'}; allowed: {', '.join(CHECKS)}"
        )
    plan = plan or plan_for(quick)
    thresholds = thresholds or Thresholds()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    cand_info, ref_info = _info(candidate), _info(reference)
    if candidate.tokenize(_PROBE) != reference.tokenize(_PROBE):
        raise InputError(
            f"candidate {cand_info.url} and reference {ref_info.url} tokenize text differently: "
            "they do not serve the same model",
            hint="validate compares two deployments of one model; check --candidate/--reference",
        )
    max_len = min(cand_info.max_model_len, ref_info.max_model_len)
    before = {
        ep.name: (ep, ep.finished_requests(), ep.sequences_requested)
        for ep in (candidate, reference)
    }
    results: list[CheckResult] = []
    for name in CHECKS:
        if name not in checks:
            continue
        progress(name)
        start = time.monotonic()
        try:
            prepared = prepare(reference, name, plan, max_len)
            cand_raw, ref_raw = _both(
                candidate, reference, partial(collect, name=name, prepared=prepared, plan=plan)
            )
        except CheckSkipped as skip:
            results.append(
                CheckResult(
                    name=name,
                    status=CheckStatus.SKIP,
                    summary=str(skip),
                    seconds=time.monotonic() - start,
                )
            )
            continue
        except EndpointError as exc:
            results.append(
                CheckResult(
                    name=name,
                    status=CheckStatus.ERROR,
                    summary=f"could not run: {exc.message}",
                    failures=[exc.message],
                    seconds=time.monotonic() - start,
                )
            )
            continue
        if capture is not None:
            capture[name] = {"candidate": cand_raw, "reference": ref_raw}
        result = score_check(name, cand_raw, ref_raw, thresholds, plan)
        results.append(CheckResult(**{**result.__dict__, "seconds": time.monotonic() - start}))
    return ValidationReport(
        warnings=_foreign_traffic(before),
        candidate=cand_info,
        reference=ref_info,
        mode="quick" if quick else "full",
        checks=results,
        started_at=started_at,
        seconds=time.monotonic() - t0,
    )
