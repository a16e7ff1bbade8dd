"""Check 2, long-context numerics and retrieval.

Teacher-forced: the same long document (token ids) at 25%, 50% and 90% of the served max context,
`prompt_logprobs=0`, so every prompt position yields log p(token | prefix) on both endpoints. The
|delta| statistics are grouped into position bands over the max context: errors that only appear
deep in the context (the ones kernel tests with short mock inputs miss) show up in the last bands.

Retrieval: a needle (passphrase at a depth of a haystack) and an MRCR-style prompt (repeat the k-th
of several notes on one topic) at the same lengths, greedy, scored by exact match. A random tiny
model scores 0 on both sides; the check compares candidate with reference, it does not grade the
model.
"""

from __future__ import annotations

from typing import Any

from kimictl.runtime.evals.client import Endpoint
from kimictl.runtime.evals.plan import Plan, Thresholds
from kimictl.runtime.evals.prompts import RetrievalTask, filler_text, mrcr_task, needle_task
from kimictl.runtime.evals.report import CheckResult, CheckStatus, require_context
from kimictl.runtime.evals.stats import mean

__all__ = ["collect", "prepare", "score"]

_DEPTHS = (0.1, 0.5, 0.9)
_MIN_HAYSTACK = 16  # filler tokens a retrieval prompt needs around its insert
_MIN_DOC = 32  # shortest teacher-forced document worth scoring


def _filler_tokens(tokenizer: Endpoint, seed: int, length: int) -> list[int]:
    words = max(64, int(length * 1.2))
    while True:
        tokens = tokenizer.tokenize(filler_text(seed, words), add_special_tokens=True)
        if len(tokens) >= length:
            return tokens[:length]
        words = int(words * 1.5) + 64


def _fit(
    task: RetrievalTask, filler: list[int], insert: list[int], question: list[int], length: int
) -> list[int] | None:
    """The task's prompt at `length` tokens, or None when insert + question leave no haystack."""
    budget = length - len(insert) - len(question)
    if budget < _MIN_HAYSTACK:
        return None
    at = max(1, int(task.depth * budget))
    return filler[:at] + insert + filler[at:budget] + question


def prepare(tokenizer: Endpoint, plan: Plan, max_len: int) -> dict[str, Any]:
    """Token-id prompts for every length: documents and retrieval tasks (tokenized once).

    Retrieval tasks that cannot fit a length (an MRCR prompt needs a few hundred tokens) are left
    out and listed in `skipped`; the check SKIPs only when not even the documents fit."""
    # leave room for the retrieval answer inside the served context
    room = plan.retrieval_max_tokens + 1
    require_context("long_context", _MIN_DOC + room, max_len)
    lengths = [max(_MIN_DOC, int(f * max_len)) for f in plan.lc_fractions]
    longest = max(lengths)
    docs = [_filler_tokens(tokenizer, 1000 + d, longest) for d in range(plan.lc_docs)]
    filler = _filler_tokens(tokenizer, 2000, longest)
    tasks: list[dict[str, Any]] = []
    skipped: list[str] = []
    n = 0
    for f, length in zip(plan.lc_fractions, lengths, strict=True):
        for _ in range(plan.retrieval_tasks):
            for make in (needle_task, mrcr_task):
                task = make(3000 + n, _DEPTHS[n % len(_DEPTHS)])
                n += 1
                insert = tokenizer.tokenize(task.insert)
                question = tokenizer.tokenize(task.question)
                fit_len = min(length, max_len - room)
                prompt = _fit(task, filler, insert, question, fit_len)
                if prompt is None:
                    need = len(insert) + len(question) + _MIN_HAYSTACK + room
                    skipped.append(
                        f"{task.kind} at {fit_len} tokens (needs {need} with its answer)"
                    )
                    continue
                tasks.append(
                    {
                        "kind": task.kind,
                        "fraction": f,
                        "depth": task.depth,
                        "answer": task.answer,
                        "prompt": prompt,
                    }
                )
    return {
        "lengths": lengths,
        "docs": docs,
        "tasks": tasks,
        "max_len": max_len,
        "skipped": skipped,
    }


def _prompt_token_logprobs(reply: dict[str, Any], prompt: list[int]) -> list[float | None]:
    entries = reply["choices"][0].get("prompt_logprobs")
    if entries is None:
        raise ValueError("server returned no prompt_logprobs")
    out: list[float | None] = []
    for tok, entry in zip(prompt, entries, strict=True):
        if entry is None:
            out.append(None)
            continue
        item = entry.get(str(tok))
        out.append(None if item is None else float(item["logprob"]))
    return out


def collect(ep: Endpoint, prepared: dict[str, Any], plan: Plan) -> dict[str, Any]:
    docs = []
    for d, doc in enumerate(prepared["docs"]):
        for length in prepared["lengths"]:
            prompt = doc[:length]
            reply = ep.complete(prompt, max_tokens=1, temperature=0.0, prompt_logprobs=0)
            docs.append(
                {"doc": d, "length": length, "logprobs": _prompt_token_logprobs(reply, prompt)}
            )
    retrieval = []
    for task in prepared["tasks"]:
        reply = ep.complete(task["prompt"], max_tokens=plan.retrieval_max_tokens, temperature=0.0)
        retrieval.append(
            {
                "kind": task["kind"],
                "fraction": task["fraction"],
                "depth": task["depth"],
                "answer": task["answer"],
                "prompt_tokens": len(task["prompt"]),
                "text": reply["choices"][0]["text"],
            }
        )
    return {
        "max_len": prepared["max_len"],
        "docs": docs,
        "retrieval": retrieval,
        "retrieval_skipped": prepared.get("skipped", []),
    }


def exact_match(text: str, answer: str) -> bool:
    return text.strip().startswith(answer)


def score(
    cand: dict[str, Any], ref: dict[str, Any], th: Thresholds, *, bands: int = 4
) -> CheckResult:
    max_len = min(int(cand["max_len"]), int(ref["max_len"]))
    band_deltas: list[list[float]] = [[] for _ in range(bands)]
    worst = (0.0, -1, -1)
    for c, r in zip(cand["docs"], ref["docs"], strict=True):
        if c["length"] != r["length"] or len(c["logprobs"]) != len(r["logprobs"]):
            raise ValueError("long context: candidate and reference documents differ in length")
        for pos, (a, b) in enumerate(zip(c["logprobs"], r["logprobs"], strict=True)):
            if a is None or b is None:
                continue
            d = abs(a - b)
            band_deltas[min(bands - 1, pos * bands // max_len)].append(d)
            if d > worst[0]:
                worst = (d, c["length"], pos)
    band_rows: list[dict[str, Any]] = []
    failures = []
    for i, ds in enumerate(band_deltas):
        lo, hi = i * max_len // bands, (i + 1) * max_len // bands
        band_max, band_mean = max(ds, default=0.0), mean(ds)
        band = f"{lo}-{hi}"
        band_rows.append(
            {
                "band": band,
                "positions": len(ds),
                "mean_abs_dlogprob": band_mean,
                "max_abs_dlogprob": band_max,
            }
        )
        if band_max > th.lc_max_abs_dlogprob:
            failures.append(
                f"band {band}: max |dlogprob| {band_max:.4g} > {th.lc_max_abs_dlogprob}"
            )
        if band_mean > th.lc_mean_abs_dlogprob:
            failures.append(
                f"band {band}: mean |dlogprob| {band_mean:.4g} > {th.lc_mean_abs_dlogprob}"
            )
    ret: dict[str, dict[str, Any]] = {}
    for kind in sorted({t["kind"] for t in ref["retrieval"]}):
        cs = [t for t in cand["retrieval"] if t["kind"] == kind]
        rs = [t for t in ref["retrieval"] if t["kind"] == kind]
        c_ok = sum(exact_match(t["text"], t["answer"]) for t in cs)
        r_ok = sum(exact_match(t["text"], t["answer"]) for t in rs)
        same = sum(a["text"] == b["text"] for a, b in zip(cs, rs, strict=True))
        ret[kind] = {
            "tasks": len(rs),
            "candidate_exact_match": c_ok / len(cs) if cs else 0.0,
            "reference_exact_match": r_ok / len(rs) if rs else 0.0,
            "identical_answers": same,
        }
        drop = ret[kind]["reference_exact_match"] - ret[kind]["candidate_exact_match"]
        if drop > th.retrieval_max_drop:
            failures.append(
                f"{kind}: candidate exact match {c_ok}/{len(cs)} trails reference {r_ok}/{len(rs)}"
            )
    metrics = {
        "lengths": sorted({d["length"] for d in ref["docs"]}),
        "max_model_len": max_len,
        "bands": band_rows,
        "max_abs_dlogprob": max((b["max_abs_dlogprob"] for b in band_rows), default=0.0),
        "retrieval": ret,
    }
    evidence = []
    if worst[1] >= 0:
        evidence.append(
            f"largest |dlogprob| {worst[0]:.4g} at position {worst[2]} "
            f"of a {worst[1]}-token document"
        )
    for kind, row in ret.items():
        evidence.append(
            f"{kind}: candidate {row['candidate_exact_match']:.2f}, reference "
            f"{row['reference_exact_match']:.2f} exact match, "
            f"{row['identical_answers']}/{row['tasks']} answers identical"
        )
    skipped = ref.get("retrieval_skipped", [])
    if skipped:
        metrics["retrieval_skipped"] = skipped
        evidence.append(f"retrieval prompts too long for this context, skipped: {len(skipped)}")
    deepest = band_rows[-1] if band_rows else {"max_abs_dlogprob": 0.0}
    summary = (
        f"lengths {metrics['lengths']}, max |dlp| {metrics['max_abs_dlogprob']:.3g} "
        f"(deepest band {deepest['max_abs_dlogprob']:.3g}), "
        + ", ".join(
            f"{k} {v['candidate_exact_match']:.2f} vs {v['reference_exact_match']:.2f}"
            for k, v in ret.items()
        )
    )
    return CheckResult(
        name="long_context",
        status=CheckStatus.FAIL if failures else CheckStatus.PASS,
        summary=summary,
        thresholds={
            "max_abs_dlogprob (per band)": f"<= {th.lc_max_abs_dlogprob}",
            "mean_abs_dlogprob (per band)": f"<= {th.lc_mean_abs_dlogprob}",
            "retrieval exact-match drop": f"<= {th.retrieval_max_drop}",
        },
        metrics=metrics,
        evidence=evidence,
        failures=failures,
    )
