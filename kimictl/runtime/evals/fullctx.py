"""Check 5, full context: one request whose prompt plus output fills the served max context exactly
must complete on the candidate (and, for comparison, on the reference): HTTP 200, every prompt
token counted, every requested output token produced.
"""

from __future__ import annotations

import time
from typing import Any

from kimictl.core.errors import EndpointError
from kimictl.runtime.evals.client import Endpoint
from kimictl.runtime.evals.plan import Plan, Thresholds
from kimictl.runtime.evals.prompts import filler_text
from kimictl.runtime.evals.report import CheckResult, CheckStatus, require_context

__all__ = ["collect", "prepare", "score"]


def prepare(tokenizer: Endpoint, plan: Plan, max_len: int) -> list[int]:
    length = max_len - plan.fullctx_gen_tokens
    require_context("full_context", 2 * plan.fullctx_gen_tokens, max_len)
    words = int(length * 1.2) + 64
    while True:
        tokens = tokenizer.tokenize(filler_text(4000, words), add_special_tokens=True)
        if len(tokens) >= length:
            return tokens[:length]
        words = int(words * 1.5)


def collect(ep: Endpoint, prompt: list[int], plan: Plan) -> dict[str, Any]:
    started = time.monotonic()
    try:
        reply = ep.complete(
            prompt, max_tokens=plan.fullctx_gen_tokens, temperature=0.0, ignore_eos=True
        )
    except EndpointError as exc:
        return {
            "ok": False,
            "error": exc.message,
            "seconds": time.monotonic() - started,
            "prompt_tokens_sent": len(prompt),
        }
    usage = reply.get("usage") or {}
    return {
        "ok": True,
        "prompt_tokens_sent": len(prompt),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "finish_reason": reply["choices"][0].get("finish_reason"),
        "text": reply["choices"][0].get("text", ""),
        "seconds": time.monotonic() - started,
    }


def _problems(result: dict[str, Any], gen: int) -> list[str]:
    if not result["ok"]:
        return [f"request failed: {result['error']}"]
    found = []
    if result["prompt_tokens"] != result["prompt_tokens_sent"]:
        found.append(
            f"server counted {result['prompt_tokens']} prompt tokens "
            f"of {result['prompt_tokens_sent']} sent"
        )
    if result["completion_tokens"] != gen:
        found.append(f"{result['completion_tokens']} output tokens of {gen} requested")
    return found


def score(
    cand: dict[str, Any], ref: dict[str, Any], th: Thresholds, *, gen_tokens: int
) -> CheckResult:
    cand_bad = _problems(cand, gen_tokens)
    ref_bad = _problems(ref, gen_tokens)
    total = cand["prompt_tokens_sent"] + gen_tokens
    failures = [f"candidate: {p}" for p in cand_bad]
    evidence = [f"reference: {p}" for p in ref_bad]
    if cand["ok"] and ref["ok"]:
        evidence.append(
            "same output text on both"
            if cand["text"] == ref["text"]
            else "output text differs from reference"
        )
    evidence.append(f"candidate {cand['seconds']:.1f} s, reference {ref['seconds']:.1f} s")
    summary = (
        f"{total}-token request {'completed' if not cand_bad else 'FAILED'} on the candidate "
        f"({cand['seconds']:.1f} s)"
    )
    del th  # no numeric threshold: completion is the criterion
    return CheckResult(
        name="full_context",
        status=CheckStatus.FAIL if failures else CheckStatus.PASS,
        summary=summary,
        thresholds={"completes at max context": True, "output tokens": gen_tokens},
        metrics={
            "context_tokens": total,
            "candidate": {k: v for k, v in cand.items() if k != "text"},
            "reference": {k: v for k, v in ref.items() if k != "text"},
        },
        evidence=evidence,
        failures=failures,
    )
