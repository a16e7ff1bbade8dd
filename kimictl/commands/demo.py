"""`kimictl demo`: the main job on the embedded default, start to finish with no GPU."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from kimictl.runtime.demo import DemoPlan, DemoResult

app = typer.Typer(add_completion=False)


def _step_printer(quiet: bool):  # type: ignore[no-untyped-def]
    from kimictl.commands._output import err_console

    def on_step(text: str) -> None:
        if not quiet:
            err_console.print(f"[bold cyan]==>[/] {text}", highlight=False)

    return on_step


def _print_intro(plan: DemoPlan) -> None:
    from kimictl.commands._output import console
    from kimictl.commands._render import print_gate, print_notes, print_plan

    print_notes(plan.prepared)
    for note in plan.notes:
        console.print(f"[cyan]note:[/] {note}")
    print_gate(plan.prepared)
    for p in plan.prepared.plans:
        print_plan(p, with_env=False)
        console.print(f"  log: {p.log_path}", highlight=False, soft_wrap=True)


def _print_result(result: DemoResult) -> None:
    from kimictl.commands._output import console
    from kimictl.commands._render import render_bench

    if result.outcome is not None:
        render_bench(result.outcome)
    a, b = result.plan.names
    diff = result.plan.difference
    console.print(
        f"[bold]what differs:[/] {diff['setting']} {diff[a]} ({a}) vs {diff[b]} ({b}); "
        "no specialized K3 path on CPU.",
        highlight=False,
    )
    for row in result.takeaway():
        if row["ratio"] is None:
            continue
        ci = row["ci95"]
        sure = (
            f"95% CI {ci[0]:.2f}-{ci[1]:.2f}, better: {row['better'] or 'not significant'}"
            if ci
            else "one run: no CI"
        )
        console.print(
            f"  {row['metric']}: {a} / {b} = {row['ratio']:.2f} ({sure})", highlight=False
        )
    if result.json_path is not None:
        console.print(f"report: {result.json_path}", highlight=False, soft_wrap=True)
    for path in result.plots:
        console.print(f"plot:   {path}", highlight=False, soft_wrap=True)
    if result.plots_error:
        console.print(f"[yellow]no plots:[/] {result.plots_error}")
    if result.kept:
        ids = " ".join(r.id for r in result.records)
        console.print(f"kept running (--keep): {ids}", highlight=False)
        console.print(f"  monitor: kimictl monitor {ids}", highlight=False)
        console.print(f"  stop:    kimictl stop {ids}", highlight=False)
    else:
        console.print(
            "stopped: " + ", ".join(f"{r.id} ({r.state.value})" for r in result.records),
            highlight=False,
        )
    console.print(f"demo wall time {result.wall_s:.0f} s", highlight=False)


@app.command(
    help="Run the main job on the embedded CPU default: start the cpu-demo deployment and a twin "
    "with one setting changed (max_num_seqs), A/B-bench them with the agentic workload, print the "
    "comparison, write demo.json and PNG plots into a new folder, and stop both servers. No GPU "
    "needed. Exit 0 ok, 1 a server failed, 2 bad input, 130 interrupted."
)
def demo(
    sessions: Annotated[
        int, typer.Option(help="Agentic sessions in flight on each server (closed loop).")
    ] = 4,
    num_prompts: Annotated[
        int, typer.Option(help="Measured requests per server (a session may overshoot it).")
    ] = 32,
    warmup: Annotated[int, typer.Option(help="Warm-up requests per server, not counted.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed: same seed, same requests.")] = 0,
    out: Annotated[
        Path | None,
        typer.Option(help="New folder for demo.json and plots/ (default ./kimictl-demo-<time>)."),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Leave both servers running afterwards (kimictl ps).")
    ] = False,
    port: Annotated[
        int | None,
        typer.Option(help="Port of cpu-demo; the twin gets PORT+1 (default: 8100 or next free)."),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for both servers.")] = 900.0,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the demo report as one JSON document.")
    ] = False,
) -> None:
    from kimictl.commands._output import emit_json, err_console
    from kimictl.commands._render import bench_progress, phase_printer
    from kimictl.runtime import demo as rt
    from kimictl.runtime.errors import EndpointError

    request = rt.DemoRequest(
        out=out,
        sessions=sessions,
        num_prompts=num_prompts,
        warmup=warmup,
        keep=keep,
        seed=seed,
        port=port,
        timeout=timeout,
    )
    plan = rt.prepare_demo(request)
    if not json_out:
        _print_intro(plan)
    progress, on_point, on_record = bench_progress(num_prompts, 1, quiet=json_out)
    result = rt.run_demo(
        plan,
        on_step=_step_printer(json_out),
        on_phase=phase_printer(json_out),
        on_point=on_point,
        on_record=on_record,
        live=progress,
    )
    if json_out:
        emit_json(result.to_json())
    else:
        _print_result(result)
    if result.interrupted:
        err_console.print("interrupted: both servers stopped; finished requests are in the report")
        raise typer.Exit(130)
    reason = result.outcome.stop_reason if result.outcome is not None else None
    if reason:
        raise EndpointError(
            f"the demo's bench stopped early: {reason}",
            hint="finished requests are in the report; the servers' logs are named above",
        )
