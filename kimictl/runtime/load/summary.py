"""Per-point bench summaries from loadgen's per-request records.

Definitions (as `vllm bench serve`, see shared notes "Metric conventions"):
- TTFT: first chunk - send. E2EL (latency): last chunk - send.
- TPOT per request: (latency - TTFT) / (output_tokens - 1), requests with >= 2 output tokens.
- ITL: every gap between two chunks of a request, pooled over requests (a chunk may carry several
  tokens with speculative decoding, so ITL != TPOT).
- Interactivity (tokens/s/user) per request = 1 / TPOT. Its p10 is the SLOW tail (the users an SLO
  protects; equals 1000 / p90 TPOT ms up to interpolation), p90 the optimistic tail.
- Throughputs divide by the measured window: first send to last response of the point, summed
  over its turns when an A/B schedule split it (the other target's turn is not its time).
- Tokens/s per GPU divides output throughput by the GPU count (tp x pp x dp; DCP adds none).
- Percentiles interpolate linearly between order statistics (numpy's default).

`summarize()` returns one dict with every key `vllm bench serve --save-result` writes (without
`--save-detailed`; same names, units and meaning) plus kimictl's extras under the key `kimictl`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kimictl.runtime.load import vllm_compat
from kimictl.runtime.load.clientlag import client_health
from kimictl.runtime.load.records import RecordList, RequestRecord
from kimictl.runtime.load.slo import SLO
from kimictl.runtime.observe.window import percentile

if TYPE_CHECKING:
    from kimictl.runtime.observe.otlp import TraceStore

__all__ = [
    "PERCENTILES",
    "percentile",
    "slo_stats",
    "summarize",
    "summarize_run",
    "interactivity_of",
    "request_values",
]

PERCENTILES = (90, 99)  # p{P}_..._ms keys written besides mean/median/std
_METRICS = ("ttft", "tpot", "itl", "e2el")


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "std": None, **{f"p{p}": None for p in PERCENTILES}}
    xs = sorted(values)
    out: dict[str, float | None] = {
        "mean": statistics.fmean(xs),
        "median": percentile(xs, 50),
        "std": statistics.pstdev(xs) if len(xs) > 1 else 0.0,
    }
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(xs, p)
    return out


def interactivity_of(r: RequestRecord) -> float | None:
    tpot = r.tpot
    return 1.0 / tpot if tpot else None


def request_values(r: RequestRecord) -> dict[str, float | None]:
    """Per-request values in SLO units (ms, tokens/s)."""
    itls = r.itls
    tpot = r.tpot
    return {
        "ttft": None if r.ttft is None else r.ttft * 1000,
        "tpot": None if tpot is None else tpot * 1000,
        "itl": statistics.fmean(itls) * 1000 if itls else None,
        "e2el": None if r.latency is None else r.latency * 1000,
        "interactivity": interactivity_of(r),
    }


def _timeline(records: Sequence[RequestRecord], t0: float) -> list[float]:
    """Output tokens per 1-second bucket from chunk arrival times."""
    buckets: list[float] = []
    for r in records:
        for t, n in zip(r.chunk_times, r.chunk_tokens, strict=False):
            i = int(r.start + t - t0)
            if i < 0:
                continue
            while len(buckets) <= i:
                buckets.append(0.0)
            buckets[i] += n
    return buckets


def summarize(
    records: Sequence[RequestRecord],
    *,
    window: tuple[float, float] | None = None,
    segments: Sequence[tuple[float, float]] | None = None,
    gpus: int | None = None,
    slo: SLO | None = None,
    model_id: str = "",
    endpoint_type: str = "openai",
    num_prompts: int | None = None,
    request_rate: float | None = None,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    max_concurrent_requests: int | None = None,
    server_view: Mapping[str, Any] | None = None,
    extras: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Summarize the measured (non-warm-up) records of ONE (target, point, repeat). Its time is
    `window` (first send to last response) or, when the point ran in `segments` (the turns of an
    A/B schedule), their summed length."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    cancelled = [r for r in measured if r.error_kind == "cancelled"]
    failed = [r for r in measured if not r.ok and r.error_kind != "cancelled"]
    if window is None:
        window = (
            (min(r.start for r in measured), max(r.end for r in measured)) if measured else (0, 0)
        )
    busy = sum(e - s for s, e in segments) if segments else window[1] - window[0]
    duration = max(busy, 1e-9)
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    tpots = [t for t in (r.tpot for r in ok) if t is not None]
    itls = [g for r in ok for g in r.itls]
    e2els = [r.latency for r in ok if r.latency is not None]
    inter = [x for x in (interactivity_of(r) for r in ok) if x is not None]

    out: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": endpoint_type,
        "backend": endpoint_type,
        "label": None,
        "model_id": model_id,
        "tokenizer_id": model_id,
        "num_prompts": num_prompts if num_prompts is not None else len(measured),
        "request_rate": "inf" if request_rate is None or math.isinf(request_rate) else request_rate,
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        "duration": duration,
        "completed": len(ok),
        "failed": len(failed),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "request_goodput": None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "latencies": e2els,
        "queue_times": vllm_compat.queue_times(
            measured, window[0], request_rate, max_concurrency is not None
        ),
    }
    timeline = _timeline(ok, window[0])
    out["max_output_tokens_per_s"] = max(timeline) if timeline else 0.0
    out["max_concurrent_requests"] = vllm_compat.max_concurrent_requests(ok)
    out["rtfx"] = 0.0  # vLLM's value for a text (non-audio) run
    for name, values in zip(_METRICS, (ttfts, tpots, itls, e2els), strict=True):
        st = _stats(values)
        out[f"mean_{name}_ms"] = None if st["mean"] is None else st["mean"] * 1000
        out[f"median_{name}_ms"] = None if st["median"] is None else st["median"] * 1000
        out[f"std_{name}_ms"] = None if st["std"] is None else st["std"] * 1000
        for p in PERCENTILES:
            v = st[f"p{p}"]
            out[f"p{p}_{name}_ms"] = None if v is None else v * 1000
    sv = dict(server_view or {})
    out.update(sv.pop("vllm_spec_decode", None) or {})  # vLLM writes them only when drafting

    errors: dict[str, int] = {}
    for r in failed:
        errors[r.error_kind or "unknown"] = errors.get(r.error_kind or "unknown", 0) + 1
    ist = _stats(inter)
    kim: dict[str, Any] = {
        "interactivity_tok_s_per_user": {
            "p10_slow_tail": percentile(inter, 10),
            "p50": ist["median"],
            "p90_fast_tail": percentile(inter, 90),
            "mean": ist["mean"],
            "definition": "per request 1/TPOT; p10 = slow-tail boundary (= 1000/p90 TPOT ms)",
        },
        "gpus": gpus,
        "max_in_flight": max_concurrent_requests,  # instantaneous peak (vLLM's is per second)
        "output_throughput_per_gpu": total_out / duration / gpus if gpus else None,
        "errors_by_kind": errors,
        "cancelled": len(cancelled),
        "window_s": list(window),
        "segments_s": [list(seg) for seg in segments or [window]],
        "output_tokens_per_s_timeline": timeline,
        "server_view": sv or None,
    }
    if slo is not None:
        good = sum(1 for r in ok if slo.request_ok(request_values(r)))
        out["request_goodput"] = good / duration
        stats = slo_stats(
            ok,
            slo,
            run_level={
                "output_throughput": out["output_throughput"],
                "throughput_per_gpu": kim["output_throughput_per_gpu"],
                "request_throughput": out["request_throughput"],
            },
        )
        results = slo.evaluate(stats)
        kim["slo"] = {
            "text": slo.text,
            "met": all(x.met for x in results) and bool(ok),
            "good_requests": good,
            "terms": [
                {"term": x.term.text, "key": x.term.key, "observed": x.observed, "met": x.met}
                for x in results
            ],
        }
    if extras:
        kim.update(extras)
    out["kimictl"] = kim
    return out


def slo_stats(
    ok: Sequence[RequestRecord], slo: SLO, *, run_level: Mapping[str, float | None]
) -> dict[str, float | None]:
    """The stat keys an SLO asks for (`ttft_p99` in ms, `interactivity_p10` in tokens/s, ...)."""
    per: dict[str, list[float]] = {m: [] for m in ("ttft", "tpot", "itl", "e2el", "interactivity")}
    for r in ok:
        for k, v in request_values(r).items():
            if k != "itl" and v is not None:
                per[k].append(v)
        per["itl"].extend(g * 1000 for g in r.itls)
    stats: dict[str, float | None] = dict(run_level)
    for t in slo.terms:
        if t.stat is None:
            continue
        vals = per[t.metric]
        if t.stat == "mean":
            stats[t.key] = statistics.fmean(vals) if vals else None
        else:
            pct = t.percentile
            stats[t.key] = percentile(vals, pct) if pct is not None else None
    return stats


def summarize_run(
    result: RecordList,
    *,
    targets: Mapping[str, Any],
    points: Mapping[str, Any],
    gpus: Mapping[str, int | None],
    slo: SLO | None = None,
    endpoint_type: str = "openai",
    num_prompts: int | None = None,
    workload: Mapping[str, Any] | None = None,
    traces: TraceStore | None = None,
) -> list[dict[str, Any]]:
    """One summary per (target, point, repeat) that has records, in run order.

    `targets` maps name -> object with .url/.model; `points` maps label -> LoadPoint. With
    `traces`, the server's view takes exact per-request figures from traced requests.
    """
    groups: dict[tuple[str, str, int], list[RequestRecord]] = {}
    for r in result:
        if not r.warmup:
            groups.setdefault((r.target, r.point, r.repeat), []).append(r)
    out = []
    for key, recs in groups.items():
        name, label, rep = key
        t = targets[name]
        p = points[label]
        server = _server_view(result, key, t, traces)
        health = client_health(recs, result.client, window=result.windows.get(key))
        out.append(
            summarize(
                recs,
                window=result.windows.get(key),
                segments=result.segments.get(key),
                gpus=gpus.get(name),
                slo=slo,
                model_id=getattr(t, "model", "") or "",
                endpoint_type=endpoint_type,
                num_prompts=num_prompts,
                request_rate=p.rate,
                burstiness=p.burstiness,
                max_concurrency=p.concurrency,
                max_concurrent_requests=result.max_concurrent.get(key),
                server_view=server,
                extras={
                    "target": name,
                    "url": getattr(t, "url", None),
                    "point": label,
                    "repeat": rep,
                    "workload": dict(workload or {}),
                    "stop_reason": result.stop_reason,
                    **health,
                },
            )
        )
    return out


def _server_view(
    result: RecordList, key: tuple[str, str, int], target: Any, traces: TraceStore | None
) -> dict[str, Any] | None:
    pair = result.metrics.get(key)
    if pair is None:
        return None
    from kimictl.runtime.observe.otlp import apply_traces
    from kimictl.runtime.observe.window import compute_window

    old, new = pair
    stats = compute_window(old, new)
    if traces is not None:
        url = getattr(target, "url", "")
        traced = apply_traces(stats, traces, url=url, name=key[0], window_s=stats.window_s)
        stats = traced if traced is not None else stats
    view = stats.to_json()
    view["vllm_spec_decode"] = vllm_compat.spec_decode_fields(old, new)
    return view
