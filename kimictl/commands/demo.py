"""`kimictl demo`: the main job on the embedded default, start to finish with no GPU."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from kimictl.runtime.demo.run import DemoPlan, DemoResult

app = typer.Typer(add_completion=False)


def _step_printer(quiet: bool):  # type: ignore[no-untyped-def]
    from kimictl.commands._output import err_console

    def on_step(text: str) -> None:
        if not quiet:
            err_console.print(f"[bold cyan]==>[/] {text}", highlight=False)

    return on_step


def _bench_ui(quiet: bool):  # type: ignore[no-untyped-def]
    from kimictl.commands._render import bench_progress

    def make(num_prompts: int) -> tuple[Any, Any, Any]:
        return bench_progress(num_prompts, 1, quiet=quiet)

    return make


def _print_intro(plan: DemoPlan) -> None:
    from kimictl.commands._output import console
    from kimictl.commands._render import print_gate, print_notes, print_plan

    print_notes(plan.prepared)
    for note in plan.notes:
        console.print(f"[cyan]note:[/] {note}")
    print_gate(plan.prepared)
    from kimictl.runtime.demo.run import DEMO_PROFILE
    from kimictl.runtime.serving.estimate import demo_estimate

    said = demo_estimate(len(plan.candidates), DEMO_PROFILE).line("the whole demo")
    console.print(said, highlight=False, markup=False, soft_wrap=True)
    console.print(f"search space ({len(plan.candidates)} configurations, served one at a time):")
    for cand, p in plan.candidates:
        print_plan(p, with_env=False)
        console.print(f"  why: {cand.why}", highlight=False, soft_wrap=True)


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _print_candidates(result: DemoResult) -> None:
    from rich.table import Table

    from kimictl.commands._output import console
    from kimictl.runtime.demo.tune import DEFAULTS

    choice = result.choice
    table = Table(
        title="measured tune (agentic small, same seed; interactivity = tok/s/user = 1/TPOT)",
        title_justify="left",
    )
    table.add_column("configuration", no_wrap=True)
    cols = ("p10", "p50", "TTFT mean ms", "output tok/s", "defaults p10 beside")
    for col in (*cols, "p10 ratio 95% CI", "SLO met"):
        table.add_column(col, justify="right")
    for m in result.measured:
        mark = " [bold green]<- chosen[/]" if choice and m.name == choice.chosen else ""
        if m.error is not None:
            table.add_row(m.name + mark, "-", "-", "-", "-", "-", "-", f"[red]{m.error}[/]")
            continue
        met = choice.met.get(m.name) if choice else None
        ci = m.p10_ratio_ci
        table.add_row(
            m.name + mark + (" [yellow](unreliable)[/]" if m.suspect else ""),
            _f(m.interactivity_p10),
            _f(m.interactivity_p50),
            _f(m.ttft_mean_ms, 0),
            _f(m.output_throughput),
            _f(m.baseline_p10),
            "-" if ci is None else f"{ci[0]:.2f}-{ci[1]:.2f}",
            "baseline"
            if m.name == DEFAULTS
            else ("-" if met is None else ("yes" if met else "no")),
        )
    console.print(table)
    for m in result.measured:
        if m.suspect:
            console.print(f"[yellow]{m.name}:[/] {m.suspect}", highlight=False)
    if choice is not None:
        console.print(f"rule: {choice.rule}", highlight=False)
        console.print(f"[bold]choice:[/] {choice.chosen}: {choice.reason}", highlight=False)


def _print_result(result: DemoResult) -> None:
    from kimictl.commands._output import console
    from kimictl.commands._render import render_ab

    if result.measured:
        _print_candidates(result)
    if result.outcome is not None and result.outcome.ab:
        render_ab(result.outcome, show_verdict=False)  # ours names the SLO's metric
    sentence = result.verdict()
    if sentence:
        console.print(f"[bold]verdict:[/] {sentence}", highlight=False)
    if result.json_path is not None:
        console.print(f"report: {result.json_path}", highlight=False, soft_wrap=True)
    for path in result.plots:
        console.print(f"plot:   {path}", highlight=False, soft_wrap=True)
    if result.plots_error:
        console.print(f"[yellow]no plots:[/] {result.plots_error}")
    kept = [r for r in result.records if result.kept and r.role in ("tuned", "stock")]
    if kept:
        from kimictl.commands._output import print_command

        ids = [r.id for r in kept]
        console.print(f"kept running (--keep): {' '.join(ids)}", highlight=False)
        # the pair keeps exporting its spans to the demo's receiver port: the monitor listens there
        traces = [f"--traces-port={result.plan.traces_port}"] if result.plan.traces_port else []
        print_command("  monitor: ", ["kimictl", "monitor", *ids, *traces])
        print_command("  stop:    ", ["kimictl", "stop", *ids])
    others = [r for r in result.records if r not in kept]
    if others:
        console.print(
            "stopped: " + ", ".join(f"{r.id} ({r.state.value})" for r in others),
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"demo wall time {result.wall_s:.0f} s", highlight=False)
    _print_decision(result)
    _print_paired(result)


def _print_paired(result: DemoResult) -> None:
    """The last screen: the paired verdict on the replay of phase 2's own traffic."""
    from kimictl.commands._output import console

    paired = result.paired
    if paired is None:
        return
    a, b = paired.arms
    j = paired.joins
    console.rule("[bold]paired replay of phase 2's traffic[/]")
    console.print(
        f"{j['rows']} captured requests sent to {a} (A) and {b} (B) at once; spans joined "
        f"{j[f'{a}_joined']}/{j['rows']} and {j[f'{b}_joined']}/{j['rows']}",
        highlight=False,
    )
    for note in [*paired.notes, *paired.calibration_notes]:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    v = paired.verdict
    text = f"no verdict: {paired.withheld}" if v is None else v.sentence()
    console.print(f"[bold]paired verdict:[/] {text}", highlight=False)


def _print_decision(result: DemoResult) -> None:
    from kimictl.commands._output import console

    d = result.decision()
    if d is None:
        return
    console.rule("[bold]decision[/]")
    console.print(
        f"[bold]deploy:[/] {d['deploy']} (profile {d['profile']}: {d['config']})", highlight=False
    )
    console.print(f"[bold]why:[/] {d['why']}", highlight=False)
    if d["ab"]:
        console.print(f"[bold]A/B:[/] {d['ab']}", highlight=False)
    console.print(f"[bold]confidence:[/] {d['confidence']}", highlight=False)
    for line in d["suspect"]:
        console.print(f"[bold yellow]unreliable:[/] {line}", highlight=False)
    for line in d["next"]:
        console.print(f"[bold]next:[/] {line}", highlight=False)


@app.command(
    help="Run the main job on the embedded CPU default: the gate, a measured tune over a small "
    "search space (vLLM's defaults, max_num_seqs, max_num_batched_tokens, ngram speculation) "
    "against an interactivity SLO, an A/B of kimictl's choice vs vLLM's defaults with 95% CIs, "
    "the verdict, demo.json and PNG plots in a new folder; every server is stopped. No GPU "
    "needed. Exit 0 ok, 1 a server failed, 2 bad input, 130 interrupted."
)
def demo(
    sessions: Annotated[
        int, typer.Option(help="Agentic sessions in flight on each server (closed loop).")
    ] = 4,
    num_prompts: Annotated[
        int, typer.Option(help="Measured requests per server in the A/B (may overshoot).")
    ] = 32,
    tune_prompts: Annotated[
        int, typer.Option(help="Measured requests per candidate in the tune.")
    ] = 32,
    warmup: Annotated[int, typer.Option(help="Warm-up requests per bench, not counted.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed: same seed, same requests.")] = 0,
    candidates: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated candidates to measure (vLLM's defaults always are); default "
            "all: vllm-defaults,max-num-seqs-2,batched-tokens-128,ngram-spec-3."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="New folder for demo.json and plots/ (default ./kimictl-demo-<time>)."),
    ] = None,
    keep: Annotated[
        bool,
        typer.Option("--keep", help="Leave the A/B pair running afterwards (kimictl ps)."),
    ] = False,
    port: Annotated[
        int | None,
        typer.Option(help="First port; candidate N gets PORT+N-1 (default: 8100 or next free)."),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each server.")] = 900.0,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the demo report as one JSON document.")
    ] = False,
) -> None:
    from kimictl.commands._output import emit_json, err_console
    from kimictl.commands._render import phase_printer
    from kimictl.core.errors import EndpointError
    from kimictl.runtime.demo import run as rt

    names = None
    if candidates is not None:
        names = tuple(n.strip() for n in candidates.split(",") if n.strip())
    request = rt.DemoRequest(
        out=out,
        sessions=sessions,
        num_prompts=num_prompts,
        tune_prompts=tune_prompts,
        warmup=warmup,
        keep=keep,
        seed=seed,
        port=port,
        timeout=timeout,
        candidates=names,
    )
    plan = rt.prepare_demo(request)
    if not json_out:
        _print_intro(plan)
    result = rt.run_demo(
        plan,
        on_step=_step_printer(json_out),
        on_phase=phase_printer(json_out),
        bench_ui=_bench_ui(json_out),
    )
    if json_out:
        emit_json(result.to_json())
    else:
        _print_result(result)
    if result.interrupted:
        err_console.print("interrupted: every server stopped; finished requests are in the report")
        raise typer.Exit(130)
    if result.write_error is not None:
        raise result.write_error
    reason = result.outcome.stop_reason if result.outcome is not None else None
    if reason:
        raise EndpointError(
            f"the demo's A/B bench stopped early: {reason}",
            hint="finished requests are in the report; the servers' logs are named above",
        )
