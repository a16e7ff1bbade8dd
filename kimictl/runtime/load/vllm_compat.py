"""The parts of a bench summary that must match `vllm bench serve` exactly, and `--save-result`.

Read from vLLM 0.33's vllm/lab/bench/serve.py (the CPU build 0.32 writes the same keys):
- speculative decoding: `spec_decode_acceptance_rate` is a PERCENTAGE (accepted / draft tokens
  x 100), `spec_decode_acceptance_length` = 1 + accepted / drafts, and the counts
  `spec_decode_num_drafts`, `spec_decode_draft_tokens`, `spec_decode_accepted_tokens` (ints) and
  `spec_decode_per_position_acceptance_rates` (fractions, accepted at position i / drafts). All
  are deltas of the server's counters over the run, written only when draft tokens were counted.
- `queue_times`: per request, seconds from its arrival at the client to its send. vLLM's
  `--request-rate inf` lets every request arrive at the start and wait for a concurrency slot,
  which is kimictl's closed loop: the queue time is the send time minus the point's start. An
  open loop without a cap sends on arrival (0). An open loop WITH a cap is None per request:
  kimictl does not record when a request waited for the cap.
- `rtfx`: inverse real-time factor of audio benchmarks; 0.0 for text, as vLLM writes it.
- `max_concurrent_requests`: the most requests active in one whole second counted from the first
  send (a request counts in every second it touches), not the instantaneous peak: a 1 s run of 8
  short requests at concurrency 2 is 8. kimictl's instantaneous peak is `kimictl.max_in_flight`.

A saved result (`save_result`) is vLLM's flat dict without `--save-detailed` (no per-request lists
but `latencies` and `queue_times`): what tools reading `vllm bench serve --save-result` files load.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kimictl.core.jsondoc import dumps
from kimictl.core.outputs import save_or_keep

if TYPE_CHECKING:
    from kimictl.runtime.load.records import RequestRecord
    from kimictl.runtime.observe.snapshot import MetricsSnapshot

__all__ = [
    "SPEC_KEYS",
    "VLLM_RESULT_KEYS",
    "max_concurrent_requests",
    "queue_times",
    "save_result",
    "spec_decode_fields",
]

# The keys `vllm bench serve --save-result` writes for a text run (no --save-detailed, no goodput
# SLO, default --percentile-metrics), in its order; spec keys only when speculation ran.
VLLM_RESULT_KEYS: tuple[str, ...] = (
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
    "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "latencies", "queue_times",
    "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p99_itl_ms",
)  # fmt: skip
SPEC_KEYS: tuple[str, ...] = (
    "spec_decode_acceptance_rate",
    "spec_decode_acceptance_length",
    "spec_decode_num_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
    "spec_decode_per_position_acceptance_rates",
)


def spec_decode_fields(old: MetricsSnapshot, new: MetricsSnapshot) -> dict[str, Any]:
    """vLLM's spec_decode_* keys from two scrapes around a run; {} when no draft tokens counted."""
    from kimictl.runtime.observe.names import SPEC_ACCEPTED_TOKENS, SPEC_DRAFT_TOKENS, SPEC_DRAFTS

    def delta(name: str) -> float:
        return new.counters.get(name, 0.0) - old.counters.get(name, 0.0)

    drafts, draft_tokens = delta(SPEC_DRAFTS), delta(SPEC_DRAFT_TOKENS)
    accepted = delta(SPEC_ACCEPTED_TOKENS)
    if draft_tokens <= 0:
        return {}
    per_pos: list[float] = []
    if drafts > 0:
        before = list(old.accepted_per_pos) + [0.0] * len(new.accepted_per_pos)
        per_pos = [(a - before[i]) / drafts for i, a in enumerate(new.accepted_per_pos)]
    return {
        "spec_decode_acceptance_rate": accepted / draft_tokens * 100,
        "spec_decode_acceptance_length": 1 + accepted / drafts if drafts > 0 else 0.0,
        "spec_decode_num_drafts": int(drafts),
        "spec_decode_draft_tokens": int(draft_tokens),
        "spec_decode_accepted_tokens": int(accepted),
        "spec_decode_per_position_acceptance_rates": per_pos,
    }


def queue_times(
    records: Sequence[RequestRecord], start: float, rate: float | None, capped: bool
) -> list[float | None]:
    """vLLM's `queue_times` for the measured records of one point (see the module docstring)."""
    if rate is None or math.isinf(rate):
        return [max(0.0, r.start - start) for r in records]
    return [None if capped else 0.0 for _ in records]


def max_concurrent_requests(ok: Sequence[RequestRecord]) -> int:
    """vLLM's `max_concurrent_requests` over the successful records (per-second buckets)."""
    timed = [r for r in ok if r.latency is not None]
    if not timed:
        return 0
    t0 = min(r.start for r in timed)
    seconds = math.ceil(max(r.start + (r.latency or 0.0) for r in timed) - t0) + 1
    active = [0] * seconds
    for r in timed:
        first, last = int(r.start - t0), int(r.start + (r.latency or 0.0) - t0)
        for s in range(first, min(last, seconds - 1) + 1):
            active[s] += 1
    return max(active)


def save_result(summary: Mapping[str, Any], path: str | Path, *, force: bool = False) -> Path:
    """Write one point's summary as `vllm bench serve --save-result` does: one flat JSON object
    with vLLM's keys (kimictl's extras, which vLLM does not write, stay out). Through the one
    no-overwrite writer: an existing file is refused unless `force` (WriteFailed, the result kept
    in the state folder; the command checks the target before the run)."""
    flat = {k: v for k, v in summary.items() if k != "kimictl"}
    return save_or_keep(path, dumps(flat, indent=False), flag="--save-result", overwrite=force)
