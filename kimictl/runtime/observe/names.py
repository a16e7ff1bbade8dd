"""vLLM (V1, 0.33) metric family and trace span attribute names: the one place they live."""

from __future__ import annotations

__all__ = [
    "COUNTERS",
    "E2E_LATENCY",
    "GAUGES",
    "GENERATION_TOKENS",
    "HISTOGRAMS",
    "INTER_TOKEN_LATENCY",
    "KV_CACHE_USAGE",
    "NUM_PREEMPTIONS",
    "PROCESS_START",
    "PROMPT_TOKENS",
    "REQUESTS_RUNNING",
    "REQUESTS_WAITING",
    "REQUEST_QUEUE_TIME",
    "REQUEST_SUCCESS",
    "SAMPLE_NAMES",
    "SPAN_DECODE_TIME",
    "SPAN_E2E",
    "SPAN_OUTPUT_TOKENS",
    "SPAN_PROMPT_TOKENS",
    "SPAN_QUEUE_TIME",
    "SPAN_REQUEST_ID",
    "SPAN_TTFT",
    "SPEC_ACCEPTED_PER_POS",
    "SPEC_ACCEPTED_TOKENS",
    "SPEC_DRAFTS",
    "SPEC_DRAFT_TOKENS",
    "TIME_PER_OUTPUT_TOKEN",
    "TIME_TO_FIRST_TOKEN",
]

# --- vLLM (V1, 0.33) metric families: the one place these names live ------------------------
# Gauges.
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # a fraction 0..1 despite the name
# Counters (exposed with a `_total` suffix).
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"  # label finished_reason; summed
NUM_PREEMPTIONS = "vllm:num_preemptions"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"  # label position
# Histograms (seconds).
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
TIME_PER_OUTPUT_TOKEN = "vllm:request_time_per_output_token_seconds"  # per request: 1/interactivity
E2E_LATENCY = "vllm:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME = "vllm:request_queue_time_seconds"

GAUGES = (REQUESTS_RUNNING, REQUESTS_WAITING, KV_CACHE_USAGE)
COUNTERS = (
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    REQUEST_SUCCESS,
    NUM_PREEMPTIONS,
    SPEC_DRAFTS,
    SPEC_DRAFT_TOKENS,
    SPEC_ACCEPTED_TOKENS,
)
HISTOGRAMS = (
    TIME_TO_FIRST_TOKEN,
    INTER_TOKEN_LATENCY,
    TIME_PER_OUTPUT_TOKEN,
    E2E_LATENCY,
    REQUEST_QUEUE_TIME,
)

# prometheus_client's process collector: a change means the server restarted (counter reset).
PROCESS_START = "process_start_time_seconds"

# Every sample name a snapshot reads (a counter's samples end in _total; a histogram's in
# _bucket/_count/_sum). prometheus_client filters /metrics by these sample names, not by family.
SAMPLE_NAMES = (
    PROCESS_START,
    *GAUGES,
    *(c + "_total" for c in (*COUNTERS, SPEC_ACCEPTED_PER_POS)),
    *(h + suffix for h in HISTOGRAMS for suffix in ("_bucket", "_count", "_sum")),
)

# --- vLLM's per-request trace span ("llm_request") attributes ------------------------------------
# vllm/tracing/utils.py `SpanAttributes`, set in vllm/v1/engine/output_processor.py `do_tracing`
# (the same in the 0.32 CPU build and 0.33). Times in seconds, from the request's stats.
SPAN_TTFT = "gen_ai.latency.time_to_first_token"  # first_token_latency, as the TTFT histogram
SPAN_E2E = "gen_ai.latency.e2e"
SPAN_QUEUE_TIME = "gen_ai.latency.time_in_queue"  # scheduled - queued, as the queue histogram
SPAN_DECODE_TIME = "gen_ai.latency.time_in_model_decode"  # last token - first token
SPAN_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
SPAN_OUTPUT_TOKENS = "gen_ai.usage.completion_tokens"
SPAN_REQUEST_ID = "gen_ai.request.id"
