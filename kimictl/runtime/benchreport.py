"""Bench summaries, A/B comparison, CSV and plots from loadgen's per-request records.

Definitions (as `vllm bench serve`, see shared notes "Metric conventions"):
- TTFT: first chunk - send. E2EL (latency): last chunk - send.
- TPOT per request: (latency - TTFT) / (output_tokens - 1), requests with >= 2 output tokens.
- ITL: every gap between two chunks of a request, pooled over requests (a chunk may carry several
  tokens with speculative decoding, so ITL != TPOT).
- Interactivity (tokens/s/user) per request = 1 / TPOT. Its p10 is the SLOW tail (the users an SLO
  protects; equals 1000 / p90 TPOT ms up to interpolation), p90 the optimistic tail.
- Throughputs divide by the measured window: first send to last response of the point.
- Tokens/s per GPU divides output throughput by the GPU count (tp x pp x dp; DCP adds none).
- Percentiles interpolate linearly between order statistics (numpy's default).

`summarize()` returns one dict with every key `vllm bench serve --save-result` writes (without
`--save-detailed`; same names, units and meaning) plus kimictl's extras under the key `kimictl`.
"""

from __future__ import annotations

import asyncio
import csv
import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from kimictl.runtime.clientlag import client_health
from kimictl.runtime.loadgen import (
    LoadPoint,
    LoadTarget,
    RecordList,
    RequestRecord,
    fetch_text,
    run_load,
)
from kimictl.runtime.slo import SLO
from kimictl.runtime.workloads import Workload

__all__ = [
    "AB_METRICS",
    "BenchConfig",
    "BenchOutcome",
    "HEADLINE",
    "PERCENTILES",
    "compare",
    "percentile",
    "resolve_models",
    "run_bench",
    "slo_stats",
    "summarize",
    "summarize_run",
    "write_csv",
    "write_plots",
]

PERCENTILES = (90, 99)  # p{P}_..._ms keys written besides mean/median/std
_METRICS = ("ttft", "tpot", "itl", "e2el")


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear interpolation between order statistics (numpy.percentile's default)."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


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


def _interactivity(r: RequestRecord) -> float | None:
    tpot = r.tpot
    return 1.0 / tpot if tpot else None


def _request_values(r: RequestRecord) -> dict[str, float | None]:
    """Per-request values in SLO units (ms, tokens/s)."""
    itls = r.itls
    tpot = r.tpot
    return {
        "ttft": None if r.ttft is None else r.ttft * 1000,
        "tpot": None if tpot is None else tpot * 1000,
        "itl": statistics.fmean(itls) * 1000 if itls else None,
        "e2el": None if r.latency is None else r.latency * 1000,
        "interactivity": _interactivity(r),
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
    """Summarize the measured (non-warm-up) records of ONE (target, point, repeat)."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    cancelled = [r for r in measured if r.error_kind == "cancelled"]
    failed = [r for r in measured if not r.ok and r.error_kind != "cancelled"]
    if window is None:
        window = (
            (min(r.start for r in measured), max(r.end for r in measured)) if measured else (0, 0)
        )
    duration = max(window[1] - window[0], 1e-9)
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    tpots = [t for t in (r.tpot for r in ok) if t is not None]
    itls = [g for r in ok for g in r.itls]
    e2els = [r.latency for r in ok if r.latency is not None]
    inter = [x for x in (_interactivity(r) for r in ok) if x is not None]

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
    }
    timeline = _timeline(ok, window[0])
    out["max_output_tokens_per_s"] = max(timeline) if timeline else 0.0
    out["max_concurrent_requests"] = max_concurrent_requests
    for name, values in zip(_METRICS, (ttfts, tpots, itls, e2els), strict=True):
        st = _stats(values)
        out[f"mean_{name}_ms"] = None if st["mean"] is None else st["mean"] * 1000
        out[f"median_{name}_ms"] = None if st["median"] is None else st["median"] * 1000
        out[f"std_{name}_ms"] = None if st["std"] is None else st["std"] * 1000
        for p in PERCENTILES:
            v = st[f"p{p}"]
            out[f"p{p}_{name}_ms"] = None if v is None else v * 1000
    sv = dict(server_view or {})
    out["spec_decode_acceptance_rate"] = sv.get("spec_acceptance_rate")
    out["spec_decode_acceptance_length"] = sv.get("spec_acceptance_length")

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
        "output_throughput_per_gpu": total_out / duration / gpus if gpus else None,
        "errors_by_kind": errors,
        "cancelled": len(cancelled),
        "window_s": list(window),
        "output_tokens_per_s_timeline": timeline,
        "server_view": sv or None,
    }
    if slo is not None:
        good = sum(1 for r in ok if slo.request_ok(_request_values(r)))
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
        for k, v in _request_values(r).items():
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
) -> list[dict[str, Any]]:
    """One summary per (target, point, repeat) that has records, in run order.

    `targets` maps name -> object with .url/.model; `points` maps label -> LoadPoint.
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
        server = _server_view(result, key, getattr(t, "model", None))
        health = client_health(recs, result.client_lag, window=result.windows.get(key))
        out.append(
            summarize(
                recs,
                window=result.windows.get(key),
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
    result: RecordList, key: tuple[str, str, int], model: str | None
) -> dict[str, Any] | None:
    pair = result.metrics.get(key)
    if pair is None:
        return None
    from kimictl.runtime import metrics

    (before, m0), (after, m1) = pair
    try:
        old = metrics.snapshot_from_text(before, monotonic=m0)
        new = metrics.snapshot_from_text(after, monotonic=m1)
    except Exception:  # a server whose /metrics is not Prometheus text: no server view
        return None
    return metrics.compute_window(old, new).to_json()


# ---------------------------------------------------------------------------------------------
# A/B


# (label, how to read it from a summary, higher is better, per-request extractor for the bootstrap)
def _inter_list(rs: Sequence[RequestRecord]) -> list[float]:
    return [x for x in (_interactivity(r) for r in rs) if x is not None]


def _ms_list(attr: str) -> Any:
    def get(rs: Sequence[RequestRecord]) -> list[float]:
        if attr == "tpot":
            return [t * 1000 for t in (r.tpot for r in rs) if t is not None]
        return [getattr(r, attr) * 1000 for r in rs if getattr(r, attr) is not None]

    return get


def _k(key: str) -> Any:
    return lambda s: s.get(key)


def _ki(key: str) -> Any:
    return lambda s: s["kimictl"]["interactivity_tok_s_per_user"].get(key)


AB_METRICS: tuple[tuple[str, Any, bool, Any, Any], ...] = (
    # label, summary getter, higher is better, per-request list, statistic on that list
    ("output tokens/s", _k("output_throughput"), True, None, None),
    ("output tokens/s/GPU", lambda s: s["kimictl"]["output_throughput_per_gpu"], True, None, None),
    ("requests/s", _k("request_throughput"), True, None, None),
    ("interactivity p10 (slow tail) tok/s/user", _ki("p10_slow_tail"), True, _inter_list, 10),
    ("interactivity p50 tok/s/user", _ki("p50"), True, _inter_list, 50),
    ("interactivity p90 (fast tail) tok/s/user", _ki("p90_fast_tail"), True, _inter_list, 90),
    ("TTFT mean ms", _k("mean_ttft_ms"), False, _ms_list("ttft"), "mean"),
    ("TTFT p99 ms", _k("p99_ttft_ms"), False, _ms_list("ttft"), 99),
    ("TPOT mean ms", _k("mean_tpot_ms"), False, _ms_list("tpot"), "mean"),
    ("TPOT median ms", _k("median_tpot_ms"), False, _ms_list("tpot"), 50),
    ("TPOT p90 ms", _k("p90_tpot_ms"), False, _ms_list("tpot"), 90),
    ("ITL mean ms", _k("mean_itl_ms"), False, None, None),
    ("E2E latency mean ms", _k("mean_e2el_ms"), False, _ms_list("latency"), "mean"),
    ("E2E latency p90 ms", _k("p90_e2el_ms"), False, _ms_list("latency"), 90),
    ("spec acceptance length", _k("spec_decode_acceptance_length"), True, None, None),
)
HEADLINE = "interactivity p50 tok/s/user"


def _stat(values: Sequence[float], how: Any) -> float | None:
    if not values:
        return None
    if how == "mean":
        return statistics.fmean(values)
    return percentile(values, float(how))


def _bootstrap_ratio(
    a: Sequence[float], b: Sequence[float], how: Any, *, rounds: int, rng: random.Random
) -> tuple[float, float] | None:
    if len(a) < 2 or len(b) < 2:
        return None
    rounds = min(rounds, max(100, 400_000 // (len(a) + len(b))))  # bound the cost on big runs
    ratios = []
    na, nb = len(a), len(b)
    for _ in range(rounds):
        sa = _stat([a[rng.randrange(na)] for _ in range(na)], how)
        sb = _stat([b[rng.randrange(nb)] for _ in range(nb)], how)
        if sa is not None and sb:
            ratios.append(sa / sb)
    if len(ratios) < rounds // 2:
        return None
    lo, hi = percentile(ratios, 2.5), percentile(ratios, 97.5)
    assert lo is not None and hi is not None
    return lo, hi


def _mean_of(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.fmean(xs) if xs else None


def compare(
    summaries: Sequence[Mapping[str, Any]],
    records: Sequence[RequestRecord],
    *,
    a: str,
    b: str,
    rounds: int = 400,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """A/B table per point: value of A and B (mean over repeats), ratio A/B and a 95% bootstrap CI.

    The CI resamples requests (per-request metrics, repeats pooled) or repeats (run-level metrics,
    needs --repeat >= 2). `better` says which side wins where the CI excludes 1; the row named
    HEADLINE carries the point's verdict ("faster", "slower", "no significant difference").
    """
    rng = random.Random(seed)
    points: list[str] = []
    for s in summaries:
        p = s["kimictl"]["point"]
        if p not in points:
            points.append(p)
    rows = []
    for point in points:
        sa = [
            s for s in summaries if s["kimictl"]["point"] == point and s["kimictl"]["target"] == a
        ]
        sb = [
            s for s in summaries if s["kimictl"]["point"] == point and s["kimictl"]["target"] == b
        ]
        if not sa or not sb:
            continue
        ra = [r for r in records if r.point == point and r.target == a and r.ok and not r.warmup]
        rb = [r for r in records if r.point == point and r.target == b and r.ok and not r.warmup]
        for label, getter, higher, per_req, how in AB_METRICS:
            va_list = [getter(s) for s in sa]
            vb_list = [getter(s) for s in sb]
            va, vb = _mean_of(va_list), _mean_of(vb_list)
            if va is None and vb is None:
                continue
            ratio = va / vb if va is not None and vb else None
            ci = None
            if per_req is not None:
                ci = _bootstrap_ratio(per_req(ra), per_req(rb), how, rounds=rounds, rng=rng)
            elif len(sa) >= 2 and len(sb) >= 2:
                xa = [v for v in va_list if v is not None]
                xb = [v for v in vb_list if v is not None]
                ci = _bootstrap_ratio(xa, xb, "mean", rounds=rounds, rng=rng)
            better = None
            if ci is not None:
                if ci[0] > 1:
                    better = a if higher else b
                elif ci[1] < 1:
                    better = b if higher else a
            row: dict[str, Any] = {
                "point": point,
                "metric": label,
                "higher_is_better": higher,
                a: va,
                b: vb,
                "ratio": ratio,
                "ci95": list(ci) if ci else None,
                "better": better,
            }
            if label == HEADLINE:
                row["verdict"] = (
                    "no significant difference"
                    if better is None
                    else ("faster" if better == a else "slower")
                )
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# files

CSV_FIELDS = (
    "target",
    "point",
    "repeat",
    "index",
    "warmup",
    "session",
    "turn",
    "input_len",
    "prompt_tokens",
    "output_len",
    "output_tokens",
    "start_s",
    "ttft_ms",
    "tpot_ms",
    "e2el_ms",
    "chunks",
    "mean_itl_ms",
    "interactivity_tok_s",
    "status",
    "ok",
    "error_kind",
    "error",
)


def write_csv(records: Iterable[RequestRecord], path: str | Path) -> Path:
    """One row per request (warm-up included, flagged); written atomically."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    with tmp.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_FIELDS)
        for r in records:
            v = _request_values(r)
            w.writerow(
                [
                    r.target,
                    r.point,
                    r.repeat,
                    r.index,
                    int(r.warmup),
                    r.session,
                    r.turn,
                    r.input_len,
                    "" if r.prompt_tokens is None else r.prompt_tokens,
                    r.output_len,
                    r.output_tokens,
                    f"{r.start:.6f}",
                    _fmt(v["ttft"]),
                    _fmt(v["tpot"]),
                    _fmt(v["e2el"]),
                    len(r.chunk_times),
                    _fmt(v["itl"]),
                    _fmt(v["interactivity"]),
                    r.status,
                    int(r.ok),
                    r.error_kind or "",
                    (r.error or "").replace("\n", " ")[:300],
                ]
            )
    tmp.replace(p)
    return p


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"


def write_plots(
    summaries: Sequence[Mapping[str, Any]], records: Sequence[RequestRecord], directory: str | Path
) -> list[Path]:
    """PNG plots: Pareto of output tokens/s/GPU vs interactivity p50 over the sweep, CDFs of TTFT
    and TPOT, and output tokens/s over time. Needs matplotlib (the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        from kimictl.runtime.errors import Unsupported

        raise Unsupported(
            "--plot needs matplotlib, which is not installed", hint="pip install matplotlib"
        ) from exc
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    written = []
    targets: list[str] = []
    for s in summaries:
        if s["kimictl"]["target"] not in targets:
            targets.append(s["kimictl"]["target"])

    fig, ax = plt.subplots(figsize=(7, 5))
    for t in targets:
        pts = []
        for s in summaries:
            k = s["kimictl"]
            if k["target"] != t:
                continue
            x = k["interactivity_tok_s_per_user"]["p50"]
            y = k["output_throughput_per_gpu"] or s["output_throughput"]
            if x is not None:
                pts.append((x, y, k["point"]))
        pts.sort()
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=t)
            for x, y, lab in pts:
                ax.annotate(lab, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    per_gpu = any(s["kimictl"]["output_throughput_per_gpu"] for s in summaries)
    ax.set_xlabel("interactivity p50 (output tokens/s/user, per request 1/TPOT)")
    ax.set_ylabel("output tokens/s per GPU" if per_gpu else "output tokens/s (GPU count unknown)")
    ax.set_title("Throughput vs interactivity over the sweep")
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, d / "pareto.png"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for t in targets:
        ok = [r for r in records if r.target == t and r.ok and not r.warmup]
        for ax, vals, name in (
            (axes[0], sorted(r.ttft * 1000 for r in ok if r.ttft is not None), "TTFT ms"),
            (axes[1], sorted(x * 1000 for x in (r.tpot for r in ok) if x is not None), "TPOT ms"),
        ):
            if vals:
                ax.plot(vals, [(i + 1) / len(vals) for i in range(len(vals))], label=t)
            ax.set_xlabel(name)
            ax.set_ylabel("fraction of requests")
            ax.grid(alpha=0.3)
    axes[0].set_title("TTFT CDF")
    axes[1].set_title("TPOT CDF")
    axes[0].legend()
    written.append(_save(fig, d / "latency_cdf.png"))

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for s in summaries:
        k = s["kimictl"]
        tl = k["output_tokens_per_s_timeline"]
        if tl:
            x0 = k["window_s"][0]
            ax.plot(
                [x0 + i for i in range(len(tl))],
                tl,
                label=f"{k['target']} {k['point']} #{k['repeat']}",
            )
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("output tokens/s (1 s buckets)")
    ax.set_title("Throughput over time")
    ax.grid(alpha=0.3)
    if len(summaries) <= 12:
        ax.legend(fontsize=7)
    written.append(_save(fig, d / "throughput_time.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# The whole bench: what `kimictl bench` calls


@dataclass(frozen=True)
class BenchConfig:
    targets: tuple[LoadTarget, ...]
    workload: Workload
    points: tuple[LoadPoint, ...]
    num_prompts: int | None = None
    duration: float | None = None
    warmup: int = 0
    seed: int = 0
    repeat: int = 1
    timeout: float = 300.0
    chat: bool = False
    ignore_eos: bool = True
    scrape_metrics: bool = True
    interleave: bool = False
    slo: SLO | None = None


@dataclass
class BenchOutcome:
    records: RecordList
    summaries: list[dict[str, Any]]
    ab: list[dict[str, Any]] | None
    stop_reason: str | None

    def to_json(self) -> dict[str, Any]:
        """The `--json` document: `runs` holds one vllm-bench-compatible dict per (target, point,
        repeat); `ab` the A/B rows (first target / second target) or null."""
        return {
            "kimictl_bench": 1,
            "stop_reason": self.stop_reason,
            "warnings": self.warnings,
            "runs": self.summaries,
            "ab": self.ab,
        }

    @property
    def warnings(self) -> list[str]:
        """Each distinct warning of the runs (the client starved of CPU, ...), first seen first."""
        found = (s["kimictl"].get("client_warning") for s in self.summaries)
        return list(dict.fromkeys(w for w in found if w))


async def resolve_models(
    targets: Sequence[LoadTarget], *, timeout: float = 10.0
) -> list[LoadTarget]:
    """Fill in each target's model from its /v1/models (first id) where none was given."""
    from kimictl.runtime.errors import EndpointError

    out = []
    for t in targets:
        if t.model:
            out.append(t)
            continue
        try:
            text = await fetch_text(t.url, "/v1/models", api_key=t.api_key, timeout=timeout)
            models = [m["id"] for m in orjson.loads(text).get("data", [])]
        except (OSError, TimeoutError, orjson.JSONDecodeError, KeyError, AttributeError) as exc:
            raise EndpointError(
                f"cannot read the model list of {t.name} at {t.url}/v1/models: {exc}",
                hint="check the server is up (`kimictl ps`), or pass --model",
            ) from exc
        if not models:
            raise EndpointError(f"{t.name} at {t.url} serves no model", hint="pass --model")
        out.append(replace(t, model=models[0]))
    return out


async def run_bench(
    cfg: BenchConfig,
    *,
    stop: asyncio.Event | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    on_point: Callable[[LoadTarget, LoadPoint, int], None] | None = None,
) -> BenchOutcome:
    """Run the load, summarize every (target, point, repeat), compare the first two targets."""
    records = await run_load(
        cfg.targets,
        cfg.workload,
        points=cfg.points,
        num_prompts=cfg.num_prompts,
        duration=cfg.duration,
        warmup=cfg.warmup,
        seed=cfg.seed,
        repeat=cfg.repeat,
        timeout=cfg.timeout,
        chat=cfg.chat,
        ignore_eos=cfg.ignore_eos,
        scrape_metrics=cfg.scrape_metrics,
        interleave=cfg.interleave,
        stop=stop,
        on_record=on_record,
        on_point=on_point,
    )
    summaries = summarize_run(
        records,
        targets={t.name: t for t in cfg.targets},
        points={p.label: p for p in cfg.points},
        gpus={t.name: t.gpus for t in cfg.targets},
        slo=cfg.slo,
        endpoint_type="openai-chat" if cfg.chat else "openai",
        num_prompts=cfg.num_prompts,
        workload=cfg.workload.describe(),
    )
    ab = None
    if len(cfg.targets) >= 2:
        ab = compare(
            summaries, records, a=cfg.targets[0].name, b=cfg.targets[1].name, seed=cfg.seed
        )
    return BenchOutcome(records, summaries, ab, records.stop_reason)
