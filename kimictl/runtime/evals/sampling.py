"""Check 3, temperature sampling and seeded reproducibility.

Distribution: at fixed prefixes, `samples` draws of the next token at temperature 1.0 (top_p 1.0,
then the plan's top_p) on both endpoints (`n` choices of one token each). Per prefix and setting a
two-sample chi-square test of homogeneity; the family-wise significance `sampling_alpha` is split
over the tests (Bonferroni), so with identical servers the gate fails falsely with probability at
most alpha. Total variation distance is reported beside it.

Seeded: the same request with a fixed `seed` sent twice must give identical tokens on the candidate
(and on the reference: a reference that is not reproducible is reported as well).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kimictl.runtime.evals.client import Endpoint, token_id
from kimictl.runtime.evals.plan import Plan, Thresholds
from kimictl.runtime.evals.prompts import greedy_prompts
from kimictl.runtime.evals.report import CheckResult, CheckStatus, require_context
from kimictl.runtime.evals.stats import chi2_homogeneity, total_variation

__all__ = ["collect", "prepare", "score"]


def prepare(tokenizer: Endpoint, plan: Plan, max_len: int) -> dict[str, Any]:
    texts = greedy_prompts(plan.sampling_prefixes + plan.seeded_prompts, seed=7)
    toks = [tokenizer.tokenize(t, add_special_tokens=True) for t in texts]
    require_context("sampling", max(map(len, toks)) + plan.seeded_max_tokens, max_len)
    return {
        "prefixes": toks[: plan.sampling_prefixes],
        "seeded": toks[plan.sampling_prefixes :],
        "settings": [{"temperature": 1.0, "top_p": 1.0}, {"temperature": 1.0, "top_p": plan.top_p}],
    }


def _draw(ep: Endpoint, prefix: list[int], n: int, setting: dict[str, float]) -> list[int]:
    reply = ep.complete(
        prefix,
        max_tokens=1,
        n=n,
        logprobs=0,
        return_tokens_as_token_ids=True,
        ignore_eos=True,
        **setting,
    )
    return [token_id(ch["logprobs"]["tokens"][0]) for ch in reply["choices"]]


def collect(ep: Endpoint, prepared: dict[str, Any], plan: Plan) -> dict[str, Any]:
    draws = []
    for p, prefix in enumerate(prepared["prefixes"]):
        for setting in prepared["settings"]:
            draws.append(
                {"prefix": p, **setting, "tokens": _draw(ep, prefix, plan.samples, setting)}
            )
    seeded = []
    for p, prompt in enumerate(prepared["seeded"]):
        runs = []
        for _ in range(2):
            reply = ep.complete(
                prompt,
                max_tokens=plan.seeded_max_tokens,
                temperature=1.0,
                seed=1234 + p,
                logprobs=0,
                return_tokens_as_token_ids=True,
                ignore_eos=True,
            )
            runs.append([token_id(t) for t in reply["choices"][0]["logprobs"]["tokens"]])
        seeded.append({"prompt": p, "seed": 1234 + p, "runs": runs})
    return {"draws": draws, "seeded": seeded}


def score(cand: dict[str, Any], ref: dict[str, Any], th: Thresholds) -> CheckResult:
    tests = []
    m = len(ref["draws"])
    if m == 0 or len(cand["draws"]) != m:
        raise ValueError("sampling: candidate and reference need the same, non-empty set of draws")
    per_test_alpha = th.sampling_alpha / m
    failures = []
    for c, r in zip(cand["draws"], ref["draws"], strict=True):
        ca, ra = Counter(c["tokens"]), Counter(r["tokens"])
        chi = chi2_homogeneity(ca, ra)
        row = {
            "prefix": r["prefix"],
            "temperature": r["temperature"],
            "top_p": r["top_p"],
            "samples": [len(c["tokens"]), len(r["tokens"])],
            "distinct_tokens": len(set(ca) | set(ra)),
            "chi2": round(chi.statistic, 3),
            "df": chi.df,
            "p_value": chi.p_value,
            "total_variation": round(total_variation(ca, ra), 4),
        }
        tests.append(row)
        if chi.p_value < per_test_alpha:
            failures.append(
                f"prefix {r['prefix']} (T={r['temperature']}, top_p={r['top_p']}): chi-square p "
                f"{chi.p_value:.2e} < {per_test_alpha:.2e} (distributions differ)"
            )
    cand_repro = sum(s["runs"][0] == s["runs"][1] for s in cand["seeded"])
    ref_repro = sum(s["runs"][0] == s["runs"][1] for s in ref["seeded"])
    cross = sum(
        a["runs"][0] == b["runs"][0] for a, b in zip(cand["seeded"], ref["seeded"], strict=True)
    )
    n_seeded = len(cand["seeded"])
    if cand_repro < n_seeded:
        failures.append(
            f"candidate: {n_seeded - cand_repro}/{n_seeded} seeded requests not reproducible"
        )
    if ref_repro < len(ref["seeded"]):
        failures.append(
            f"reference: {len(ref['seeded']) - ref_repro}/{len(ref['seeded'])} seeded requests "
            "not reproducible"
        )
    min_p = min(t["p_value"] for t in tests)
    metrics = {
        "tests": tests,
        "min_p_value": min_p,
        "max_total_variation": max(t["total_variation"] for t in tests),
        "seeded_reproducible_candidate": f"{cand_repro}/{n_seeded}",
        "seeded_reproducible_reference": f"{ref_repro}/{len(ref['seeded'])}",
        "seeded_identical_across_endpoints": f"{cross}/{n_seeded}",
    }
    evidence = [
        f"prefix {t['prefix']} T={t['temperature']} top_p={t['top_p']}: chi2 {t['chi2']} "
        f"df {t['df']} p {t['p_value']:.3g}, TV {t['total_variation']}"
        for t in tests
    ]
    summary = (
        f"{m} chi-square tests, min p {min_p:.3g} (alpha {th.sampling_alpha}/{m}), "
        f"seeded reproducible {cand_repro}/{n_seeded}"
    )
    return CheckResult(
        name="sampling",
        status=CheckStatus.FAIL if failures else CheckStatus.PASS,
        summary=summary,
        thresholds={
            "family-wise alpha": th.sampling_alpha,
            "per-test alpha (Bonferroni)": per_test_alpha,
            "seeded reproducible": "all",
        },
        metrics=metrics,
        evidence=evidence,
        failures=failures,
    )
