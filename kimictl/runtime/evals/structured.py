"""Check 4, structured output: JSON-schema-constrained requests (vLLM `structured_outputs`) on both
endpoints. Every output must finish by itself (not cut by max_tokens), parse as JSON and validate
against its schema (kimictl.runtime.evals.schema). The schemas are bounded (enums, ranges, lengths)
so even a random model's constrained output ends well within max_tokens.

JSON allows any amount of whitespace between tokens, and vLLM's switch against it
(`disable_any_whitespace`) is server-wide only. A random model mostly samples whitespace where the
grammar allows it and never finishes, so the requests bias the tokenizer's pure-whitespace tokens
away (`logit_bias` -100; the ids are found with /tokenize). The grammar path is what is under test.

Free-form strings are left out of the schemas on purpose: with vLLM 0.32's xgrammar 0.2.8 a random
model got raw control characters (e.g. U+0006) into a JSON string, which no strict parser accepts;
identical servers then fail alike, which says nothing about the candidate (docs/validate.md).
"""

from __future__ import annotations

import json
from typing import Any

from kimictl.runtime.evals.client import Endpoint
from kimictl.runtime.evals.plan import Plan, Thresholds
from kimictl.runtime.evals.report import CheckResult, CheckStatus, require_context
from kimictl.runtime.evals.schema import unsupported_keywords, validate

__all__ = ["SCHEMAS", "collect", "prepare", "score"]

SCHEMAS: dict[str, dict[str, Any]] = {
    "verdict": {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no", "unsure"]},
            "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
        },
        "required": ["answer", "confidence"],
        "additionalProperties": False,
    },
    "city": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Lisbon", "Osaka", "Quito", "Perth"]},
            "capital": {"type": "boolean"},
            "rank": {"type": "integer", "minimum": 1, "maximum": 999},
        },
        "required": ["city", "capital", "rank"],
        "additionalProperties": False,
    },
    "tags": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "enum": ["fast", "slow", "safe", "risky", "new"]},
                "minItems": 1,
                "maxItems": 3,
            },
            "priority": {"type": "string", "enum": ["low", "medium", "high"]},
        },
        "required": ["tags", "priority"],
        "additionalProperties": False,
    },
}

_QUESTIONS = (
    "Reply in JSON. Is the deployment ready for traffic?",
    "Reply in JSON. Describe one city.",
    "Reply in JSON. Tag this change: a faster decode kernel.",
    "Reply in JSON. Is long-context accuracy preserved?",
    "Reply in JSON. Which city hosts the data center?",
)


def _whitespace_runs() -> list[str]:
    runs = [" " * k for k in range(1, 41)] + ["\t", "\r", "\r\n", "\t\t", "\n\t"]
    for newlines in range(1, 4):
        runs += ["\n" * newlines + " " * k for k in range(0, 41)]
    return runs


def whitespace_token_ids(tokenizer: Endpoint) -> list[int]:
    """Ids of tokens that are nothing but whitespace (each run that is one token)."""
    ids = set()
    for run in _whitespace_runs():
        tokens = tokenizer.tokenize(run)
        if len(tokens) == 1:
            ids.add(tokens[0])
    return sorted(ids)


def prepare(tokenizer: Endpoint, plan: Plan, max_len: int) -> dict[str, Any]:
    for name, schema in SCHEMAS.items():
        bad = unsupported_keywords(schema)
        if bad:  # a programming error, not user input
            raise ValueError(f"schema {name} uses keywords the validator lacks: {bad}")
    requests: list[dict[str, Any]] = []
    i = 0
    for name in SCHEMAS:
        for _ in range(plan.structured_per_schema):
            text = _QUESTIONS[i % len(_QUESTIONS)] + "\n"
            prompt = tokenizer.tokenize(text, add_special_tokens=True)
            requests.append({"schema": name, "seed": 100 + i, "prompt": prompt})
            i += 1
    # a shorter max_tokens would cut JSON objects short and fail a correct server
    longest = max(len(r["prompt"]) for r in requests)
    require_context("structured", longest + plan.structured_max_tokens, max_len)
    return {
        "requests": requests,
        "logit_bias": {str(t): -100 for t in whitespace_token_ids(tokenizer)},
    }


def collect(ep: Endpoint, prepared: dict[str, Any], plan: Plan) -> list[dict[str, Any]]:
    out = []
    for req in prepared["requests"]:
        reply = ep.complete(
            req["prompt"],
            max_tokens=plan.structured_max_tokens,
            temperature=1.0,
            seed=req["seed"],
            logit_bias=prepared["logit_bias"],
            structured_outputs={"json": SCHEMAS[req["schema"]]},
        )
        choice = reply["choices"][0]
        out.append(
            {
                "schema": req["schema"],
                "text": choice["text"],
                "finish_reason": choice["finish_reason"],
            }
        )
    return out


def problems(output: dict[str, Any]) -> list[str]:
    """Why one output is not acceptable (empty when it parses, validates and ended by itself)."""
    found = []
    if output["finish_reason"] != "stop":
        found.append(
            f"finish_reason {output['finish_reason']!r} (cut off, not ended by the grammar)"
        )
    try:
        value = json.loads(output["text"])
    except ValueError as exc:
        return [*found, f"not JSON: {exc}"]
    return found + validate(value, SCHEMAS[output["schema"]])


def score(cand: list[dict[str, Any]], ref: list[dict[str, Any]], th: Thresholds) -> CheckResult:
    failures = []
    evidence = []
    counts = {}
    for side, outputs in (("candidate", cand), ("reference", ref)):
        valid = 0
        for i, out in enumerate(outputs):
            bad = problems(out)
            if bad:
                evidence.append(
                    f"{side} #{i} ({out['schema']}): {bad[0]}; text {out['text'][:80]!r}"
                )
            else:
                valid += 1
        rate = valid / len(outputs) if outputs else 0.0
        counts[side] = {"outputs": len(outputs), "valid": valid, "valid_rate": rate}
        if rate < th.structured_min_valid:
            failures.append(f"{side}: {len(outputs) - valid}/{len(outputs)} outputs invalid")
    if not failures and cand:
        evidence.append(f"example candidate output ({cand[0]['schema']}): {cand[0]['text'][:120]}")
    summary = (
        f"candidate {counts['candidate']['valid']}/{counts['candidate']['outputs']} valid, "
        f"reference {counts['reference']['valid']}/{counts['reference']['outputs']} valid "
        f"({len(SCHEMAS)} schemas)"
    )
    return CheckResult(
        name="structured",
        status=CheckStatus.FAIL if failures else CheckStatus.PASS,
        summary=summary,
        thresholds={"valid_rate": f">= {th.structured_min_valid}"},
        metrics={"schemas": sorted({o["schema"] for o in ref}), **counts},
        evidence=evidence[:8],
        failures=failures,
    )
