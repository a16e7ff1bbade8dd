"""The figures a monitor screen shows, in order: label, WindowStats key, format. No Textual here,
so the headless `kimictl monitor --once` table imports it cheaply."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kimictl.runtime.observe.resolution import describe

__all__ = [
    "ROWS",
    "SOURCE_LABEL",
    "Row",
    "fmt",
    "fmt_cell",
    "fmt_ratio",
    "source_cell",
    "traces_line",
    "judge_lines",
]


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    key: str
    fmt: str  # format spec for the value
    scale: float = 1.0


ROWS: tuple[Row, ...] = (
    Row("output tokens/s", "tokens_per_s", ".1f"),
    Row("requests/s", "request_rate", ".2f"),
    Row("interactivity p10 (slow tail)", "interactivity_p10", ".1f"),
    Row("interactivity p50", "interactivity_p50", ".1f"),
    Row("interactivity p90 (fast tail)", "interactivity_p90", ".1f"),
    Row("TPOT p90 ms", "tpot_p90_ms", ".1f"),
    Row("TTFT p50 ms", "ttft_p50_ms", ".0f"),
    Row("TTFT p90 ms", "ttft_p90_ms", ".0f"),
    Row("TTFT p99 ms", "ttft_p99_ms", ".0f"),
    Row("ITL p50 ms", "itl_p50_ms", ".1f"),
    Row("ITL p90 ms", "itl_p90_ms", ".1f"),
    Row("running", "running", ".0f"),
    Row("waiting", "waiting", ".0f"),
    Row("KV cache %", "kv_cache_usage", ".1f", 100.0),
    Row("preemptions (window)", "preemptions", ".0f"),
    Row("spec acceptance length", "spec_acceptance_length", ".2f"),
    Row("spec acceptance %", "spec_acceptance_rate", ".1f", 100.0),
)


def fmt(row: Row, value: float | None) -> str:
    if value is None:
        return "-"
    return format(value * row.scale, row.fmt)


def fmt_cell(row: Row, value: float | None, unresolved: Mapping[str, Any]) -> str:
    """The value, or the bound the buckets allow ('< 10.0', '> 100.0', '40.0-100.0')."""
    entry = unresolved.get(row.key)
    return describe(entry, row.fmt, row.scale) if entry is not None else fmt(row, value)


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


SOURCE_LABEL = "per-request source (n)"


def source_cell(sources: Mapping[str, str] | None, counts: Mapping[str, int] | None) -> str:
    """Where the interactivity/TTFT figures come from and how many requests are behind them:
    'traces (42)' (exact, observe.otlp) or 'histograms (40)' (bucket interpolation)."""
    for key in ("interactivity_p10", "ttft_p50_ms"):
        source = (sources or {}).get(key)
        if source:
            return f"{source} ({(counts or {}).get(key, 0)})"
    return "-"


def traces_line(status: Mapping[str, Any] | None) -> str | None:
    """One line on the trace receiver: where it listens and what it took, or why it does not."""
    if status is None:
        return None
    if not status.get("listening"):
        return f"traces: not received ({status.get('reason') or 'off'}); figures from histograms"
    servers = ", ".join(status.get("servers") or ()) or "none yet"
    rejected = f", {status['rejected']} bodies refused" if status.get("rejected") else ""
    refused = status.get("spans_refused") or {}
    if refused:  # spans with a figure out of range (or past the store's cap), by figure
        by = ", ".join(f"{figure} {n}" for figure, n in sorted(refused.items()))
        rejected += f", {sum(refused.values())} spans refused ({by})"
    return f"traces: {status['url']} · {status['spans']} spans from {servers}{rejected}"


def judge_lines(doc: Mapping[str, Any] | None) -> list[str]:
    """The live judge (monitor --canary/--shadow): one line per arm, then its state line."""
    if doc is None:
        return []
    from kimictl.runtime.observe.judge import state_line

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = []
    for name, arm in doc["arms"].items():
        share = "" if arm["share"] is None else f"share {arm['share']:.0%}  "
        inter = "/".join(num(arm[f"interactivity_{p}"], ".1f") for p in ("p10", "p50", "p90"))
        lines.append(
            f"{name:<6} {share}n {arm['n']}  interactivity p10/p50/p90 {inter} tok/s/user  "
            f"TTFT p90 {num(arm['ttft_p90_ms'], '.0f')} ms"
        )
    lines.append(state_line(dict(doc)))
    return lines
