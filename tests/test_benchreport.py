"""Summaries (vllm bench serve's keys and definitions), SLO goodput, A/B verdicts with bootstrap
intervals, the server view from real /metrics captures, CSV and plots."""

from __future__ import annotations

import csv
import random
import re
from pathlib import Path

import numpy as np
import pytest

from kimictl.runtime.load.ab import HEADLINE, NOT_MEASURED, compare
from kimictl.runtime.load.exports import write_csv, write_plots
from kimictl.runtime.load.loadgen import LoadPoint, LoadTarget, RecordList, RequestRecord
from kimictl.runtime.load.slo import parse_slo
from kimictl.runtime.load.summary import summarize, summarize_run
from kimictl.runtime.observe.snapshot import snapshot_from_text
from kimictl.runtime.observe.window import percentile

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"

# Every key `vllm bench serve --save-result` writes without --save-detailed (0.32/0.33 serve.py),
# for the default percentile metrics plus e2el, at the percentiles kimictl writes.
VLLM_KEYS = {
    "date",
    "endpoint_type",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "latencies",
    "queue_times",
    "rtfx",
} | {
    f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99") for m in ("ttft", "tpot", "itl", "e2el")
}


def rec(
    target="a",
    point="c=1",
    *,
    start=0.0,
    ttft=0.1,
    gap=0.01,
    n=10,
    ok=True,
    kind=None,
    repeat=0,
    tokens_per_chunk=1,
) -> RequestRecord:
    chunks = [ttft + i * gap for i in range(0, n, tokens_per_chunk)]
    r = RequestRecord(
        target=target,
        point=point,
        repeat=repeat,
        index=0,
        warmup=False,
        session=0,
        turn=0,
        input_len=20,
        output_len=n,
        start=start,
    )
    if ok:
        r.ttft, r.latency = chunks[0], chunks[-1]
        r.chunk_times = chunks
        r.chunk_tokens = [tokens_per_chunk] * len(chunks)
        r.output_tokens, r.prompt_tokens, r.status, r.ok = n, 21, 200, True
    else:
        r.error_kind, r.error, r.status = kind, "x", 500 if kind == "http_5xx" else 0
    r.end = start + (r.latency or 0.05)
    return r


def test_percentile_matches_numpy() -> None:
    rng = random.Random(0)
    xs = [rng.random() for _ in range(101)]
    for p in (0, 10, 50, 90, 99, 99.9, 100):
        assert percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)))
    assert percentile([], 50) is None


def test_summary_definitions_and_vllm_keys() -> None:
    records = [
        rec(start=0.0, ttft=0.1, gap=0.01, n=11),
        rec(start=0.5, ttft=0.3, gap=0.02, n=6),
        rec(start=0.6, ok=False, kind="http_5xx"),
        rec(start=0.7, ok=False, kind="cancelled"),
    ]
    s = summarize(records, window=(0.0, 2.0), gpus=4, model_id="m", max_concurrency=2)
    assert VLLM_KEYS <= set(s)
    assert (s["completed"], s["failed"]) == (2, 1)  # cancelled is neither
    assert s["kimictl"]["cancelled"] == 1 and s["kimictl"]["errors_by_kind"] == {"http_5xx": 1}
    assert s["duration"] == 2.0
    assert s["total_output_tokens"] == 17 and s["total_input_tokens"] == 42
    assert s["output_throughput"] == pytest.approx(8.5)
    assert s["kimictl"]["output_throughput_per_gpu"] == pytest.approx(8.5 / 4)
    # TPOT = (latency - ttft) / (n - 1): 0.01 and 0.02 s
    assert s["mean_tpot_ms"] == pytest.approx(15.0)
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    itls = [10.0] * 10 + [20.0] * 5  # pooled gaps
    assert s["mean_itl_ms"] == pytest.approx(np.mean(itls))
    assert s["p99_itl_ms"] == pytest.approx(np.percentile(itls, 99))
    assert s["std_itl_ms"] == pytest.approx(np.std(itls))
    inter = s["kimictl"]["interactivity_tok_s_per_user"]
    assert inter["p10_slow_tail"] == pytest.approx(np.percentile([100.0, 50.0], 10))
    assert inter["p10_slow_tail"] < inter["p50"] < inter["p90_fast_tail"]
    assert s["request_goodput"] is None and s["request_rate"] == "inf"


def test_multi_token_chunks_make_itl_differ_from_tpot() -> None:
    s = summarize([rec(n=12, gap=0.01, tokens_per_chunk=3)], window=(0, 1))
    assert s["mean_tpot_ms"] == pytest.approx(90 / 11)  # 0.09 s over 11 tokens
    assert s["mean_itl_ms"] == pytest.approx(30.0)  # chunks 30 ms apart


def test_goodput_counts_requests_meeting_every_term() -> None:
    records = [rec(ttft=0.1, gap=0.005), rec(ttft=0.1, gap=0.02), rec(ttft=3.0, gap=0.005)]
    slo = parse_slo("interactivity_p10>=100,ttft_p99<=2000ms")
    s = summarize(records, window=(0, 10), slo=slo)
    # only the first meets both (200 tok/s and 100 ms); the second is too slow per token,
    # the third waits 3 s for its first token
    assert s["kimictl"]["slo"]["good_requests"] == 1
    assert s["request_goodput"] == pytest.approx(0.1)
    terms = {t["key"]: t for t in s["kimictl"]["slo"]["terms"]}
    assert terms["ttft_p99"]["observed"] == pytest.approx(np.percentile([100, 100, 3000], 99))
    assert not s["kimictl"]["slo"]["met"]


def _ab_records(ratio: float, n: int = 60, seed: int = 1) -> list[RequestRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        out.append(rec("a", start=i, gap=0.010 * rng.uniform(0.9, 1.1)))
        out.append(rec("b", start=i, gap=0.010 * ratio * rng.uniform(0.9, 1.1)))
    return out


def _summaries(records: list[RequestRecord]) -> list[dict]:
    return [
        summarize(
            [r for r in records if r.target == t],
            window=(0, 60),
            extras={"target": t, "point": "c=1", "repeat": 0},
        )
        for t in ("a", "b")
    ]


@pytest.mark.parametrize(("ratio", "verdict"), [(2.0, "faster"), (0.5, "slower"), (1.0, None)])
def test_ab_ratio_ci_and_verdict(ratio: float, verdict: str | None) -> None:
    records = _ab_records(ratio)
    rows = compare(_summaries(records), records, a="a", b="b", seed=3)
    head = next(r for r in rows if r["metric"] == HEADLINE)
    assert head["ratio"] == pytest.approx(ratio, rel=0.1)
    lo, hi = head["ci95"]
    assert lo <= head["ratio"] <= hi
    if verdict is None:
        assert lo < 1 < hi and head["verdict"] == "no significant difference"
    else:
        assert head["verdict"] == verdict
    tpot = next(r for r in rows if r["metric"] == "TPOT mean ms")
    assert tpot["ratio"] == pytest.approx(1 / ratio, rel=0.1)


def test_ab_headline_says_not_measured_when_every_response_came_in_one_read() -> None:
    # a stalled server flushes each whole response in one chunk: TTFT = latency, no TPOT
    records = [rec(t, start=i, gap=0.01, tokens_per_chunk=10) for i in range(8) for t in "ab"]
    rows = compare(_summaries(records), records, a="a", b="b", seed=3)
    head = next(r for r in rows if r["metric"] == HEADLINE)
    assert head["verdict"] == NOT_MEASURED
    assert head["a"] is None and head["b"] is None and head["ratio"] is None
    assert any(r["metric"] == "output tokens/s" and r["ratio"] for r in rows)


def test_server_view_from_real_metrics_captures() -> None:
    t0 = (FIXTURES / "spec_t0.txt").read_text()
    t1 = (FIXTURES / "spec_t1.txt").read_text()

    def total(text: str, name: str) -> float:
        return sum(float(m) for m in re.findall(rf"^{name}_total{{[^}}]*}} (\S+)$", text, re.M))

    d_acc = total(t1, "vllm:spec_decode_num_accepted_tokens") - total(
        t0, "vllm:spec_decode_num_accepted_tokens"
    )
    d_drafts = total(t1, "vllm:spec_decode_num_drafts") - total(t0, "vllm:spec_decode_num_drafts")
    d_tok = total(t1, "vllm:spec_decode_num_draft_tokens") - total(
        t0, "vllm:spec_decode_num_draft_tokens"
    )
    assert d_drafts > 0
    result = RecordList()
    result.extend([rec("s", start=0.0), rec("s", start=0.2)])
    result.metrics[("s", "c=1", 0)] = (
        snapshot_from_text(t0, monotonic=100.0),
        snapshot_from_text(t1, monotonic=105.0),
    )
    (s,) = summarize_run(
        result,
        targets={"s": LoadTarget("s", "http://x", "tiny-k2")},
        points={"c=1": LoadPoint(concurrency=1)},
        gpus={"s": None},
    )
    assert s["spec_decode_acceptance_length"] == pytest.approx(1 + d_acc / d_drafts)
    assert s["spec_decode_acceptance_rate"] == pytest.approx(d_acc / d_tok * 100)  # vLLM: percent
    assert (s["spec_decode_num_drafts"], s["spec_decode_draft_tokens"]) == (d_drafts, d_tok)
    assert s["spec_decode_accepted_tokens"] == d_acc
    rates = s["spec_decode_per_position_acceptance_rates"]
    assert rates and all(0 <= x <= 1 for x in rates)
    assert sum(rates) * d_drafts == pytest.approx(d_acc)  # positions add up to the accepted
    assert s["kimictl"]["server_view"]["window_s"] == pytest.approx(5.0)


def test_csv_one_row_per_request(tmp_path: Path) -> None:
    records = [rec(n=5, gap=0.01), rec(ok=False, kind="http_429")]
    p = write_csv(records, tmp_path / "r.csv")
    rows = list(csv.DictReader(p.open()))
    assert len(rows) == 2
    assert float(rows[0]["tpot_ms"]) == pytest.approx(10.0)
    assert float(rows[0]["interactivity_tok_s"]) == pytest.approx(100.0)
    assert rows[1]["ok"] == "0" and rows[1]["error_kind"] == "http_429" and rows[1]["tpot_ms"] == ""


def test_plots_are_written_as_png(tmp_path: Path) -> None:
    records = _ab_records(1.5, n=10)
    files = write_plots(_summaries(records), records, tmp_path / "p")
    assert {f.name for f in files} == {"pareto.png", "latency_cdf.png", "throughput_time.png"}
    for f in files:
        data = f.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_two_turns_of_one_server_join_into_one_window_without_the_gap() -> None:
    """An A/B side's two turns (real captures before and after a load), 95 s apart while the other
    side ran: the server's view counts both turns' work over their 10 s, not over 105 s."""
    from kimictl.runtime.observe.window import compute_window, join_windows

    t0 = (FIXTURES / "spec_t0.txt").read_text()
    t1 = (FIXTURES / "spec_t1.txt").read_text()
    turn1 = (snapshot_from_text(t0, monotonic=100.0), snapshot_from_text(t1, monotonic=105.0))
    turn2 = (snapshot_from_text(t0, monotonic=200.0), snapshot_from_text(t1, monotonic=205.0))
    one = compute_window(*turn1)
    both = compute_window(*join_windows([turn1, turn2]))
    assert both.window_s == pytest.approx(10.0) and both.resets == 0
    assert one.requests_finished and one.tokens_per_s
    assert both.requests_finished == pytest.approx(2 * one.requests_finished)
    assert both.tokens_per_s == pytest.approx(one.tokens_per_s)
    assert compute_window(turn1[0], turn2[1]).window_s == pytest.approx(105.0)
