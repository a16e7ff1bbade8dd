"""Check 1, greedy agreement: N prompts at temperature 0 on both endpoints, with top-k logprobs.

Compared only where the two contexts are identical (up to and including the first divergence):
chosen-token |delta logprob|, and the overlap of the two top-k sets. After the first divergence the
texts differ and nothing is comparable, so the agreement rate is the matched prefix over all tokens.
"""

from __future__ import annotations

from typing import Any

from kimictl.runtime.evals.client import Endpoint, token_id
from kimictl.runtime.evals.plan import Plan, Thresholds
from kimictl.runtime.evals.prompts import greedy_prompts
from kimictl.runtime.evals.report import CheckResult, CheckStatus, require_context
from kimictl.runtime.evals.stats import mean

__all__ = ["collect", "prepare", "score"]


def prepare(tokenizer: Endpoint, plan: Plan, max_len: int) -> list[list[int]]:
    prompts = [
        tokenizer.tokenize(p, add_special_tokens=True) for p in greedy_prompts(plan.greedy_prompts)
    ]
    require_context("greedy", max(map(len, prompts)) + plan.greedy_max_tokens, max_len)
    return prompts


def collect(ep: Endpoint, prompts: list[list[int]], plan: Plan) -> list[dict[str, Any]]:
    """Per prompt: chosen token ids, their logprobs, and the top-k {token id: logprob} per step."""
    out = []
    for prompt in prompts:
        reply = ep.complete(
            prompt,
            max_tokens=plan.greedy_max_tokens,
            temperature=0.0,
            logprobs=plan.top_k,
            return_tokens_as_token_ids=True,
            ignore_eos=True,
        )
        lp = reply["choices"][0]["logprobs"]
        out.append(
            {
                "tokens": [token_id(t) for t in lp["tokens"]],
                "logprobs": [float(x) for x in lp["token_logprobs"]],
                "top": [
                    {str(token_id(k)): float(v) for k, v in (d or {}).items()}
                    for d in lp["top_logprobs"]
                ],
            }
        )
    return out


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def score(
    cand: list[dict[str, Any]], ref: list[dict[str, Any]], th: Thresholds, *, top_k: int
) -> CheckResult:
    if len(cand) != len(ref) or not cand:
        raise ValueError("greedy: candidate and reference need the same, non-empty prompt list")
    total = matched = identical = 0
    deltas: list[float] = []
    overlaps: list[float] = []
    divergences: list[int | None] = []
    worst: tuple[float, int, int] = (0.0, -1, -1)
    for i, (c, r) in enumerate(zip(cand, ref, strict=True)):
        n = max(len(c["tokens"]), len(r["tokens"]))
        div = _first_divergence(c["tokens"], r["tokens"])
        divergences.append(div)
        total += n
        matched += n if div is None else div
        identical += div is None
        aligned = n if div is None else min(div + 1, len(c["tokens"]), len(r["tokens"]))
        for j in range(aligned):
            rt = r["tokens"][j]
            if j < len(c["tokens"]) and c["tokens"][j] == rt:
                d = abs(c["logprobs"][j] - r["logprobs"][j])
            elif str(rt) in c["top"][j]:
                # the divergence step: the reference's token as the candidate scored it
                d = abs(c["top"][j][str(rt)] - r["logprobs"][j])
            else:
                d = None
            if d is not None:
                deltas.append(d)
                if d > worst[0]:
                    worst = (d, i, j)
            kc, kr = set(c["top"][j]), set(r["top"][j])
            overlaps.append(len(kc & kr) / max(1, min(top_k, len(kr))))
    agreement = matched / total if total else 1.0
    max_d = max(deltas, default=0.0)
    mean_d = mean(deltas)
    overlap = round(mean(overlaps), 4) if overlaps else 1.0
    metrics: dict[str, Any] = {
        "prompts": len(cand),
        "tokens_per_prompt": max(len(r["tokens"]) for r in ref),
        "prompts_identical": identical,
        "token_agreement": round(agreement, 4),
        "first_divergence": divergences,
        "mean_abs_dlogprob": mean_d,
        "max_abs_dlogprob": max_d,
        "topk_overlap": overlap,
        "compared_positions": len(deltas),
    }
    thresholds = {
        "token_agreement": f">= {th.greedy_min_token_agreement}",
        "max_abs_dlogprob": f"<= {th.greedy_max_abs_dlogprob}",
        "mean_abs_dlogprob": f"<= {th.greedy_mean_abs_dlogprob}",
        "topk_overlap": f">= {th.greedy_min_topk_overlap}",
    }
    failures = []
    if agreement < th.greedy_min_token_agreement:
        failures.append(f"token agreement {agreement:.3f} < {th.greedy_min_token_agreement}")
    if max_d > th.greedy_max_abs_dlogprob:
        failures.append(f"max |dlogprob| {max_d:.4g} > {th.greedy_max_abs_dlogprob}")
    if mean_d > th.greedy_mean_abs_dlogprob:
        failures.append(f"mean |dlogprob| {mean_d:.4g} > {th.greedy_mean_abs_dlogprob}")
    if overlap < th.greedy_min_topk_overlap:
        failures.append(f"top-{top_k} overlap {overlap:.3f} < {th.greedy_min_topk_overlap}")
    evidence = []
    for i, div in enumerate(divergences):
        if div is not None:
            evidence.append(
                f"prompt {i}: first divergence at token {div} "
                f"(candidate {cand[i]['tokens'][div] if div < len(cand[i]['tokens']) else 'end'}, "
                f"reference {ref[i]['tokens'][div] if div < len(ref[i]['tokens']) else 'end'})"
            )
    if worst[1] >= 0:
        evidence.append(f"largest |dlogprob| {worst[0]:.4g} at prompt {worst[1]}, token {worst[2]}")
    summary = (
        f"{identical}/{len(cand)} identical, agreement {agreement:.3f}, "
        f"max |dlp| {max_d:.3g}, top-{top_k} overlap {overlap:.3f}"
    )
    return CheckResult(
        name="greedy",
        status=CheckStatus.FAIL if failures else CheckStatus.PASS,
        summary=summary,
        thresholds=thresholds,
        metrics=metrics,
        evidence=evidence[:8],
        failures=failures,
    )
