"""`kimictl monitor`: live throughput and interactivity of vLLM endpoints, tuned against stock."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kimictl.core.errors import InputError
from kimictl.deployment.traces import DEFAULT_TRACES_PORT

if TYPE_CHECKING:
    from kimictl.runtime.serving.runs import Target

app = typer.Typer(add_completion=False)


def _targets(texts: list[str]) -> list[Target]:
    from kimictl.runtime.serving.runs import ab_targets, resolve_target

    if not texts:
        return list(
            ab_targets(
                ("tuned", "stock"),
                missing="no endpoint given and no live A/B pair was launched by kimictl.",
                hint="pass URLs (kimictl monitor http://127.0.0.1:8000 or tuned=URL stock=URL), "
                "a run id from `kimictl ps`, or start a pair with `kimictl serve --ab`.",
            )
        )
    targets = [resolve_target(t) for t in texts]
    seen: set[str] = set()
    for t in targets:
        if t.name in seen:
            raise InputError(
                f"two endpoints are named '{t.name}'; name them apart, e.g. a={t.url} b=URL."
            )
        seen.add(t.name)
    return targets


def _render_table(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from kimictl.commands._output import console
    from kimictl.runtime.observe.window import HIGHER_IS_BETTER, format_window
    from kimictl.tui.rows import ROWS, SOURCE_LABEL, fmt_cell, fmt_ratio, source_cell, traces_line

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
                "--custom-histogram-buckets (a profile's [metrics] interactivity_range)"
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
    targets: Annotated[
        list[str] | None, typer.Argument(help="URL, NAME=URL or run id (repeatable).")
    ] = None,
    interval: Annotated[float, typer.Option(help="Seconds between scrapes of /metrics.")] = 1.0,
    window: Annotated[
        str, typer.Option(help="Window of the figures: 10s, 1m, 5m or seconds.")
    ] = "10s",
    once: Annotated[
        bool, typer.Option("--once", help="Print one snapshot after one window and exit.")
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="JSON (with --once or --no-tui).")
    ] = False,
    record: Annotated[
        Path | None, typer.Option(help="Append one JSON line per scrape round to FILE.")
    ] = None,
    no_tui: Annotated[
        bool, typer.Option("--no-tui", help="Headless: one line per round (JSONL with --json).")
    ] = False,
    duration: Annotated[
        float | None, typer.Option(help="Stop after this many seconds (headless).")
    ] = None,
    slo_interactivity: Annotated[
        float | None,
        typer.Option(help="SLO line on the interactivity chart (tokens/s/user, p10)."),
    ] = None,
    traces_port: Annotated[
        int,
        typer.Option(
            help="Receive vLLM's per-request trace spans (OTLP/HTTP) on 127.0.0.1:PORT; "
            'servers send them with a profile\'s [metrics] traces = "kimictl".'
        ),
    ] = DEFAULT_TRACES_PORT,
    traces: Annotated[
        bool,
        typer.Option(
            "--traces/--no-traces", help="Exact figures from traced requests (histograms else)."
        ),
    ] = True,
) -> None:
    import asyncio

    from kimictl.runtime.observe.poller import (
        EndpointPoller,
        append_jsonl,
        check_record_target,
        none_answered,
        watch,
    )
    from kimictl.runtime.observe.window import MetricsSeries, parse_window

    window_s = parse_window(window)
    if not 0.05 <= interval <= 60:
        raise InputError(f"--interval {interval:g} is out of range: use 0.05 to 60 seconds.")
    # `not 0 < x < inf` also refuses nan, which compares false with everything
    if slo_interactivity is not None and not 0 < slo_interactivity < math.inf:
        raise InputError(f"--slo-interactivity {slo_interactivity:g} must be > 0 tokens/s/user.")
    if duration is not None and not 0 < duration < math.inf:
        raise InputError(f"--duration {duration:g} must be a finite number of seconds > 0.")
    if json_out and not (once or no_tui):
        raise InputError("--json needs --once or --no-tui (the TUI is a screen, not JSON).")
    if not 0 <= traces_port < 65536:
        raise InputError(f"--traces-port {traces_port} is not a TCP port; allowed: 0-65535.")
    if record is not None:
        check_record_target(record)
    resolved = _targets(targets or [])
    keep_s = max(330.0, window_s * 1.1 + 2 * interval)  # history long enough for the window
    receiver = None
    if traces:
        from kimictl.runtime.observe.otlp import OtlpReceiver, TraceStore

        receiver = OtlpReceiver(port=traces_port, store=TraceStore(keep_s=keep_s))
        receiver.try_start()
    pollers = [
        EndpointPoller(
            t.name,
            t.url,
            t.model,
            series=MetricsSeries(keep_s=keep_s),
            traces=receiver.store if receiver is not None else None,
        )
        for t in resolved
    ]
    traces_status = receiver.status if receiver is not None else None
    try:
        if once or no_tui:
            from kimictl.runtime.observe.gpu_telemetry import sample_gpus

            def on_tick(doc: dict[str, Any]) -> None:
                if record is not None:
                    append_jsonl(record, doc)
                if no_tui and not once:
                    if json_out:
                        import orjson

                        typer.echo(orjson.dumps(doc).decode())
                    else:
                        typer.echo(_line(doc))

            # --once: until the scrapes span one window (give up a little after it)
            run_for = window_s + max(5.0, 3 * interval) if once else duration
            try:
                doc = asyncio.run(
                    watch(
                        pollers,
                        interval=interval,
                        window_s=window_s,
                        duration_s=run_for,
                        on_tick=on_tick,
                        gpu_sampler=sample_gpus,
                        full_window=once,
                        traces_status=traces_status,
                    )
                )
            except KeyboardInterrupt:
                return
            if once:
                silent = none_answered(pollers)
                if json_out:
                    from kimictl.commands._output import emit_json

                    emit_json(doc)
                elif silent is None:  # a table of dashes says nothing the error does not
                    _render_table(doc)
                if silent is not None:
                    raise silent
            return

        from kimictl.tui.app import MonitorApp

        MonitorApp(
            pollers,
            interval=interval,
            window_s=window_s,
            slo_interactivity=slo_interactivity,
            record=record,
            traces_status=traces_status,
        ).run()
    finally:
        if receiver is not None:
            receiver.close()
