"""Bench exports: the per-request CSV and the plots."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kimictl.core.outputs import atomic_write
from kimictl.runtime.load.records import RequestRecord
from kimictl.runtime.load.summary import request_values

__all__ = [
    "CSV_FIELDS",
    "write_csv",
    "write_plots",
]


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
    fh = io.StringIO(newline="")
    w = csv.writer(fh)
    w.writerow(CSV_FIELDS)
    for r in records:
        v = request_values(r)
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
    return atomic_write(path, fh.getvalue())


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"


def write_plots(
    summaries: Sequence[Mapping[str, Any]],
    records: Sequence[RequestRecord],
    directory: str | Path,
    *,
    ab: Sequence[Mapping[str, Any]] | None = None,
) -> list[Path]:
    """PNG plots: Pareto of output tokens/s/GPU vs interactivity p50 over the sweep (p10-p90 as
    bars), CDFs of TTFT and TPOT, output tokens/s over time and, given A/B rows, `ab.png` (each
    ratio with its 95% interval). Every axis of a magnitude starts at zero, so a small difference
    looks small. Needs matplotlib (the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        from kimictl.core.errors import Unsupported

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
            inter = k["interactivity_tok_s_per_user"]
            x = inter["p50"]
            y = k["output_throughput_per_gpu"] or s["output_throughput"]
            if x is not None:
                lo, hi = inter.get("p10_slow_tail") or x, inter.get("p90_fast_tail") or x
                pts.append((x, y, k["point"], x - lo, hi - x))
        pts.sort()
        if pts:
            ax.errorbar(
                [p[0] for p in pts],
                [p[1] for p in pts],
                xerr=[[p[3] for p in pts], [p[4] for p in pts]],
                marker="o",
                capsize=3,
                label=f"{t} (bars: p10-p90 of requests)",
            )
            for x, y, lab, _, _ in pts:
                ax.annotate(lab, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    per_gpu = any(s["kimictl"]["output_throughput_per_gpu"] for s in summaries)
    ax.set_xlabel("interactivity p50 (output tokens/s/user, per request 1/TPOT)")
    ax.set_ylabel("output tokens/s per GPU" if per_gpu else "output tokens/s (GPU count unknown)")
    ax.set_title("Throughput vs interactivity over the sweep")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
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
            ax.set_xlim(left=0)
            ax.set_ylim(0, 1)
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
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if len(summaries) <= 12:
        ax.legend(fontsize=7)
    written.append(_save(fig, d / "throughput_time.png"))
    if ab:
        written.append(_ab_plot(plt, ab, d / "ab.png"))
    return written


def _ab_plot(plt: Any, rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Each A/B ratio (first point) with its 95% interval; x from 0, a line at 1 (no change)."""
    point = rows[0]["point"]
    shown = [r for r in rows if r["point"] == point and r.get("ratio") is not None]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(shown) + 1.5))
    for i, r in enumerate(reversed(shown)):
        ci = r.get("ci95")
        color = "tab:green" if r.get("better") else "tab:gray"
        err = None if not ci else [[r["ratio"] - ci[0]], [ci[1] - r["ratio"]]]
        ax.errorbar([r["ratio"]], [i], xerr=err, fmt="o", color=color, capsize=3)
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels(
        [
            f"{r['metric']}{' (primary)' if r.get('role') == 'primary' else ''}"
            for r in reversed(shown)
        ],
        fontsize=7,
    )
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlim(left=0)
    ax.set_xlabel("ratio A/B with 95% interval (green: one side better by the corrected test)")
    ax.set_title(f"A/B at {point}")
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
