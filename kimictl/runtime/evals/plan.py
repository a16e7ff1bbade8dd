"""How much each check measures (`Plan`: full or quick) and where it draws the line (`Thresholds`).

The default thresholds were measured on the CPU embedded server (tiny K2-architecture model):
two identically built servers never exceed them, a twin with one layer scaled by 1+1e-2 always does.
Numbers and runs: docs/results.md. On GPUs a candidate with different kernels
differs from stock by bf16 rounding; loosen with `--threshold NAME=VALUE` where that is expected.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from kimictl.core.errors import InputError

__all__ = ["CHECKS", "Plan", "Thresholds", "parse_checks", "plan_for"]

# The five checks, in the order they run and are reported.
CHECKS = ("greedy", "long_context", "sampling", "structured", "full_context")


def parse_checks(text: str | None) -> tuple[str, ...]:
    """`--checks a,b`: the named checks in CHECKS order (all when None); InputError otherwise."""
    if text is None:
        return CHECKS
    chosen = []
    for part in text.split(","):
        name = part.strip().replace("-", "_")
        if not name:
            continue
        if name not in CHECKS:
            raise InputError(
                f"--checks {text!r}: unknown check {part.strip()!r}; allowed: {', '.join(CHECKS)}"
            )
        chosen.append(name)
    if not chosen:
        raise InputError(f"--checks {text!r} names no check; allowed: {', '.join(CHECKS)}")
    return tuple(c for c in CHECKS if c in chosen)


@dataclass(frozen=True)
class Plan:
    greedy_prompts: int = 12
    greedy_max_tokens: int = 48
    top_k: int = 5
    lc_fractions: tuple[float, ...] = (0.25, 0.5, 0.9)
    lc_docs: int = 2  # teacher-forced documents per length
    lc_bands: int = 4  # position bands over the served max context
    retrieval_tasks: int = 2  # needle + MRCR prompts per length, each
    retrieval_max_tokens: int = 16
    sampling_prefixes: int = 3
    samples: int = 400  # next-token samples per prefix and setting, per endpoint
    top_p: float = 0.9
    seeded_prompts: int = 3
    seeded_max_tokens: int = 16
    structured_per_schema: int = 3
    structured_max_tokens: int = 160
    fullctx_gen_tokens: int = 8


_QUICK = Plan(
    greedy_prompts=6,
    greedy_max_tokens=32,
    lc_docs=1,
    retrieval_tasks=1,
    sampling_prefixes=2,
    samples=300,
    seeded_prompts=2,
    structured_per_schema=1,
)


def plan_for(quick: bool) -> Plan:
    return _QUICK if quick else Plan()


@dataclass(frozen=True)
class Thresholds:
    # greedy: chosen-token |logprob(candidate) - logprob(reference)| where contexts are identical
    greedy_min_token_agreement: float = 0.95
    greedy_max_abs_dlogprob: float = 0.02
    greedy_mean_abs_dlogprob: float = 0.002
    greedy_min_topk_overlap: float = 0.95
    # long context: teacher-forced prompt-token |delta logprob|, per position band
    lc_max_abs_dlogprob: float = 0.02
    lc_mean_abs_dlogprob: float = 0.002
    # retrieval (needle, MRCR): candidate exact-match rate may trail the reference by at most this
    retrieval_max_drop: float = 0.2
    # sampling: family-wise significance of the chi-square two-sample tests (Bonferroni split)
    sampling_alpha: float = 0.001
    # structured output: fraction of outputs that must parse and validate
    structured_min_valid: float = 1.0

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    def with_overrides(self, items: list[str]) -> Thresholds:
        """Apply 'name=value' strings (from --threshold); unknown names are an InputError."""
        known = {f.name for f in fields(self)}
        changes: dict[str, Any] = {}
        for item in items:
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or name not in known:
                raise InputError(
                    f"--threshold {item!r}: expected NAME=VALUE with NAME one of "
                    f"{', '.join(sorted(known))}"
                )
            try:
                changes[name] = float(value)
            except ValueError as exc:
                raise InputError(f"--threshold {item!r}: {value!r} is not a number") from exc
        return replace(self, **changes)
