"""Bench exports: the report JSON, the per-request CSV, the plots and vLLM's result file; each
target checked before the run (`check_bench_outputs`) and written at its end through the one
no-overwrite writer, a failed write kept in the state folder (`write_bench_outputs`)."""

from __future__ import annotations

import contextlib
import csv
import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kimictl.core.errors import InputError, Unsupported, WriteFailed
from kimictl.core.outputs import check_new_file, check_new_folder, save_or_keep
from kimictl.runtime.load.records import RequestRecord
from kimictl.runtime.load.summary import request_values

__all__ = [
    "CSV_FIELDS",
    "PLOT_NAMES",
    "check_bench_outputs",
    "write_bench_outputs",
    "write_csv",
    "write_plots",
]

PLOT_NAMES = ("pareto.png", "latency_cdf.png", "throughput_time.png", "ab.png")


def check_bench_outputs(
    *,
    output: Path | None,
    csv_out: Path | None,
    plot: Path | None,
    save_result: Path | None,
    overwrite: bool = False,
) -> None:
    """Before the run: every file bench will write can be written (writable folder, no existing
    file unless `overwrite`), no two flags name one file, and --plot has matplotlib."""
    files = [("--output", output), ("--csv", csv_out), ("--save-result", save_result)]
    seen: dict[Path, str] = {}
    for flag, path in files:
        if path is None:
            continue
        target = check_new_file(path, flag=flag, overwrite=overwrite).resolve()
        if target in seen:
            raise InputError(f"{seen[target]} and {flag} both name {str(path)!r}; give two files.")
        seen[target] = flag
    if plot is not None:
        check_new_folder(plot, flag="--plot", names=PLOT_NAMES, overwrite=overwrite)
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise Unsupported(
                "--plot needs matplotlib, which is not installed", hint="pip install matplotlib"
            )


def write_bench_outputs(
    outcome: Any,
    report: bytes,
    *,
    output: Path | None,
    csv_out: Path | None,
    plot: Path | None,
    save_result: Path | None = None,
    overwrite: bool = False,
    wrote: Callable[[Path], None] = lambda _: None,
) -> list[WriteFailed]:
    """Write the report JSON (-o), the CSV, the plots and vLLM's result file of a finished run;
    each one that cannot be written is kept in the state folder and returned (the caller exits
    1), the others still get written."""
    lost: list[WriteFailed] = []
    jobs: list[Callable[[], list[Path]]] = []
    if output is not None:
        jobs.append(lambda: [save_or_keep(output, report, flag="--output", overwrite=overwrite)])
    if csv_out is not None:
        jobs.append(lambda: [write_csv(outcome.records, csv_out, overwrite=overwrite)])
    if plot is not None:
        summaries, records, ab = outcome.summaries, outcome.records, outcome.ab
        jobs.append(lambda: write_plots(summaries, records, plot, ab=ab, overwrite=overwrite))
    if save_result is not None and outcome.summaries:
        from kimictl.runtime.load.vllm_compat import save_result as vllm_result

        first = outcome.summaries[0]
        jobs.append(lambda: [vllm_result(first, save_result, force=overwrite)])
    for job in jobs:
        try:
            for path in job():
                wrote(path)
        except WriteFailed as error:
            lost.append(error)
    return lost


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


def write_csv(
    records: Iterable[RequestRecord], path: str | Path, *, overwrite: bool = False
) -> Path:
    """One row per request (warm-up included, flagged); written whole, never over an existing
    file unless `overwrite` (WriteFailed, the rows kept in the state folder)."""
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
    return save_or_keep(path, fh.getvalue(), flag="--csv", overwrite=overwrite)


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"


def write_plots(
    summaries: Sequence[Mapping[str, Any]],
    records: Sequence[RequestRecord],
    directory: str | Path,
    *,
    ab: Sequence[Mapping[str, Any]] | None = None,
    overwrite: bool = False,
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
    with contextlib.suppress(OSError):  # a folder that refuses: each plot is kept (WriteFailed)
        d.mkdir(parents=True, exist_ok=True)
    figures: list[tuple[Any, Path]] = []
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
    figures.append((fig, d / "pareto.png"))

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
    figures.append((fig, d / "latency_cdf.png"))

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
    figures.append((fig, d / "throughput_time.png"))
    if ab:
        figures.append((_ab_plot(plt, ab), d / "ab.png"))
    return _save_all(figures, overwrite=overwrite)


def _ab_plot(plt: Any, rows: Sequence[Mapping[str, Any]]) -> Any:
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
    return fig


def _save_all(figures: list[tuple[Any, Path]], *, overwrite: bool) -> list[Path]:
    """Each figure as a PNG through the one writer; those that cannot be written are kept in
    the state folder and named in one WriteFailed after the others are written."""
    import matplotlib.pyplot as plt

    written: list[Path] = []
    lost: list[WriteFailed] = []
    for fig, path in figures:
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
        plt.close(fig)
        try:
            png = buffer.getvalue()
            written.append(save_or_keep(path, png, flag="--plot", overwrite=overwrite))
        except WriteFailed as error:
            lost.append(error)
    if lost:
        more = f" ({len(lost) - 1} more plot(s) kept beside it)" if len(lost) > 1 else ""
        raise WriteFailed(lost[0].message + more, hint=lost[0].hint)
    return written
