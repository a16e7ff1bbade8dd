"""`kimictl monitor`: live throughput and interactivity of vLLM endpoints, tuned against stock."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kimictl.deployment.traces import DEFAULT_TRACES_PORT

if TYPE_CHECKING:
    from kimictl.runtime.observe.session import MonitorSession
    from kimictl.runtime.serving.runs import Target

app = typer.Typer(add_completion=False)

TargetsArg = Annotated[
    list[str] | None, typer.Argument(help="URL, NAME=URL or run id (repeatable).")
]
IntervalOpt = Annotated[
    float, typer.Option(min=0.05, max=60, help="Seconds between scrapes of /metrics.")
]
WindowOpt = Annotated[str, typer.Option(help="Window of the figures: 10s, 1m, 5m or seconds.")]
OnceOpt = Annotated[
    bool, typer.Option("--once", help="Print one snapshot after one window and exit.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON (with --once or --no-tui).")]
RecordOpt = Annotated[
    Path | None, typer.Option(help="Append one JSON line per scrape round to FILE.")
]
NoTuiOpt = Annotated[
    bool, typer.Option("--no-tui", help="Headless: one line per round (JSONL with --json).")
]
DurationOpt = Annotated[float | None, typer.Option(help="Stop after this many seconds (headless).")]
SloOpt = Annotated[
    float | None, typer.Option(help="SLO line on the interactivity chart (tokens/s/user, p10).")
]
TracesPortOpt = Annotated[
    int,
    typer.Option(
        min=0,
        max=65535,
        help="Receive vLLM's per-request trace spans (OTLP/HTTP) on 127.0.0.1:PORT; "
        'servers send them with a profile\'s \\[metrics] traces = "kimictl".',
    ),
]
CaptureOpt = Annotated[
    Path | None,
    typer.Option(
        help="Write what the traced servers served as a Mooncake JSONL trace (new files only, "
        "rolling: FILE, FILE.001.jsonl, ...; no text; kimictl's own requests left out)."
    ),
]
TracesOpt = Annotated[
    bool,
    typer.Option(
        "--traces/--no-traces", help="Exact figures from traced requests (histograms else)."
    ),
]
CanaryOpt = Annotated[
    float | None,
    typer.Option(
        help="Judge a live canary: PCT% of requests go to tuned, the rest to stock "
        "(sample-ratio check, length strata, a sequential interval).",
    ),
]
ShadowOpt = Annotated[
    float | None,
    typer.Option(
        help="Judge a live shadow: PCT% of stock's requests are copied to tuned "
        "(paired by X-Request-Id).",
    ),
]


def _targets(texts: list[str]) -> list[Target]:
    from kimictl.runtime.serving.runs import resolve_targets

    return resolve_targets(
        texts,
        missing="no endpoint given and no live A/B pair was launched by kimictl.",
        hint="pass URLs (kimictl monitor http://127.0.0.1:8000 or tuned=URL stock=URL), "
        "a run id from `kimictl ps`, or start a pair with `kimictl serve --ab`.",
        apart="a=URL b=URL",
    )


def _edge_of_latest_pair() -> tuple[float | None, float | None]:
    """(canary, shadow) of the edge `serve --ab --canary/--shadow` runs for the latest pair."""
    from kimictl.runtime.serving.runs import latest_ab_pair

    pair = latest_ab_pair()
    edge = pair[0].extra.get("edge") if pair else None
    if not edge:
        return None, None
    pct = float(edge["pct"])
    return (pct, None) if edge["mode"] == "canary" else (None, pct)


def _render_table(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from kimictl.commands._output import console
    from kimictl.runtime.observe.window import HIGHER_IS_BETTER, format_window
    from kimictl.tui.rows import (
        ROWS,
        SOURCE_LABEL,
        fmt_cell,
        fmt_ratio,
        judge_lines,
        source_cell,
        traces_line,
    )

    endpoints = doc["endpoints"]
    ab = doc.get("ab")
    table = Table(title=f"window {format_window(doc['window_s'])}", title_justify="left")
    table.add_column("figure")
    for name, ep in endpoints.items():
        status = ep["status"] + (" (stale)" if ep["stale"] else "")
        table.add_column(f"{name}\n{status}", justify="right")
    if ab:
        table.add_column(f"{ab['tuned']}/{ab['stock']}", justify="right")
    for row in ROWS:
        cells = [
            fmt_cell(row, ep.get(row.key), ep.get("unresolved") or {}) for ep in endpoints.values()
        ]
        if ab:
            ratio = ab["ratio"].get(row.key)
            cell = fmt_ratio(ratio)
            if ratio is not None and row.key in HIGHER_IS_BETTER and abs(ratio - 1) > 0.02:
                better = (ratio > 1) == HIGHER_IS_BETTER[row.key]
                cell = f"[{'green' if better else 'red'}]{cell}[/]"
            cells.append(cell)
        table.add_row(row.label, *cells)
    sources = [source_cell(ep.get("sources"), ep.get("counts")) for ep in endpoints.values()]
    table.add_row(SOURCE_LABEL, *sources, *([""] if ab else []))
    console.print(table)
    for text in judge_lines(doc.get("judge")):
        console.print(text, highlight=False)
    line = traces_line(doc.get("traces"))
    if line:
        console.print(f"[dim]{line}[/dim]")
    for name, ep in endpoints.items():
        if ep["reason"]:
            console.print(f"[red]{name}[/]: {ep['reason']}")
        if ep.get("resets"):
            console.print(f"[yellow]{name}[/]: server restarted in the window (counted from 0)")
        if ep.get("missing"):
            console.print(f"[yellow]{name}[/]: missing metric families: {', '.join(ep['missing'])}")
        if ep.get("unresolved"):
            console.print(
                f"[yellow]{name}[/]: the server's histogram buckets cannot resolve "
                f"{', '.join(ep['unresolved'])}: shown as bounds; start vLLM with "
                "--custom-histogram-buckets (a profile's \\[metrics] interactivity_range)"
            )
    console.print(
        "[dim]interactivity = tokens/s/user = 1/TPOT per request; p10 = 1000/TPOT p90 ms.[/dim]"
    )


def _line(doc: dict[str, Any]) -> str:
    parts = []
    for name, ep in doc["endpoints"].items():
        if ep["status"] != "UP":
            parts.append(f"{name} {ep['status']} ({ep['reason'] or 'no data yet'})")
            continue
        tps = ep.get("tokens_per_s")
        if tps is None:
            parts.append(f"{name} UP (first scrape; figures from the next one)")
            continue
        p10 = ep.get("interactivity_p10")
        parts.append(
            f"{name} {tps:.1f} tok/s, interactivity p10 "
            + ("-" if p10 is None else f"{p10:.1f}")
            + " tok/s/user"
            + (
                f" (traces, {ep['counts'].get('interactivity_p10', 0)} requests)"
                if (ep.get("sources") or {}).get("interactivity_p10") == "traces"
                else ""
            )
            + f", running {ep.get('running') or 0:.0f}"
            + f", waiting {ep.get('waiting') or 0:.0f}"
            + (f" (slow scrapes: every {ep['paced_s']:.0f} s)" if ep.get("paced_s") else "")
        )
    if doc.get("judge"):
        from kimictl.runtime.observe.judge import state_line

        parts.append(state_line(doc["judge"]))
    gpus = doc.get("gpus")
    if gpus and gpus.get("gpus"):  # the GPU strip of the TUI, one cell per GPU
        from kimictl.runtime.observe.gpu_telemetry import GpuSample

        parts.extend(GpuSample(**g).summary() for g in gpus["gpus"])
    return " | ".join(parts)


@app.command(
    help="Live TUI of vLLM endpoints: windowed tokens/s, interactivity percentiles, TTFT/ITL, "
    "queue, KV cache, spec acceptance; tuned vs stock. TARGETS: URL, NAME=URL or a run id "
    "(default: the latest A/B pair from `kimictl serve --ab`)."
)
def monitor(
    targets: TargetsArg = None,
    interval: IntervalOpt = 1.0,
    window: WindowOpt = "10s",
    once: OnceOpt = False,
    json_out: JsonOpt = False,
    record: RecordOpt = None,
    no_tui: NoTuiOpt = False,
    duration: DurationOpt = None,
    slo_interactivity: SloOpt = None,
    traces_port: TracesPortOpt = DEFAULT_TRACES_PORT,
    traces: TracesOpt = True,
    capture: CaptureOpt = None,
    canary: CanaryOpt = None,
    shadow: ShadowOpt = None,
) -> None:
    from kimictl.runtime.observe.session import MonitorRequest

    if not targets and canary is None and shadow is None:  # the pair's own edge, if it has one
        canary, shadow = _edge_of_latest_pair()
    request = MonitorRequest(
        window=window,
        interval=interval,
        once=once,
        json=json_out,
        no_tui=no_tui,
        duration=duration,
        slo_interactivity=slo_interactivity,
        record=record,
        traces=traces,
        traces_port=traces_port,
        capture=capture,
        canary=canary,
        shadow=shadow,
    )
    with request.open(_targets(targets or [])) as session:
        session.on_close = _capture_said
        if request.headless:
            _headless(session)
            return
        from kimictl.tui.app import MonitorApp

        MonitorApp(
            session.pollers,
            interval=interval,
            window_s=request.window_s,
            slo_interactivity=slo_interactivity,
            record=record,
            traces_status=session.traces_status,
            judge=session.judge_look,
        ).run()


def _capture_said(text: str) -> None:
    from kimictl.commands._output import err_console

    err_console.print(text)


@contextlib.contextmanager
def _sigterm_ends_like_ctrl_c() -> Iterator[None]:
    """SIGTERM (kill, systemd, a supervisor; and how a background job is stopped, since it
    ignores SIGINT) ends the headless monitor as Ctrl-C does: rounds and capture files closed."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _headless(session: MonitorSession) -> None:
    """--once: one snapshot after one window (a table, or --json); --no-tui: a line (or a JSON
    line) per round until --duration or Ctrl-C. Each round goes to --record too."""
    import asyncio

    from kimictl.runtime.observe.gpu_telemetry import sample_gpus
    from kimictl.runtime.observe.poller import append_jsonl, none_answered, watch

    request = session.request

    def on_tick(doc: dict[str, Any]) -> None:
        if request.record is not None:
            append_jsonl(request.record, doc)
        if request.no_tui and not request.once:
            if request.json:
                from kimictl.core.jsondoc import dumps

                typer.echo(dumps(doc, indent=False).decode(), nl=False)
            else:
                typer.echo(_line(doc))

    try:
        with _sigterm_ends_like_ctrl_c():
            doc = asyncio.run(
                watch(
                    session.pollers,
                    interval=request.interval,
                    window_s=request.window_s,
                    duration_s=session.run_for,
                    on_tick=on_tick,
                    gpu_sampler=sample_gpus,
                    full_window=request.once,
                    traces_status=session.traces_status,
                    judge=session.judge_look,
                )
            )
    except KeyboardInterrupt:
        return
    if request.once:
        silent = none_answered(session.pollers)
        if request.json:
            from kimictl.commands._output import emit_json

            emit_json(doc)
        elif silent is None:  # a table of dashes says nothing the error does not
            _render_table(doc)
        if silent is not None:
            raise silent
