"""`kimictl bench --paired`: replay a trace to two targets, paired, and print one verdict."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kimictl.core.errors import CheckFailed, InputError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from kimictl.runtime.load.paired import PairedOutcome
    from kimictl.runtime.load.records import LoadTarget
    from kimictl.runtime.serving.runs import Target
    from kimictl.runtime.verdict.paired import AaCalibration, Verdict

__all__ = ["judge_paired_cli", "load_targets", "paired_command", "run_paired_cli"]


def load_targets(targets: Sequence[Target], model: str | None, key: str | None) -> list[LoadTarget]:
    """The resolved targets as the replay sends to them (model: --model, the run's, or asked)."""
    from kimictl.runtime.load.records import LoadTarget

    return [LoadTarget(t.name, t.url, model or t.model or "", key) for t in targets]


def paired_command(options: dict[str, Any], targets: Callable[[], list[LoadTarget]]) -> None:
    """`bench --paired` (a replay to two targets, resolved by `targets`) or `bench --paired
    --judge REPORT` (a saved replay judged again), from bench's options by name."""
    o = options
    if o["judge"] is not None:
        judge_paired_cli(
            report=o["judge"],
            alone=o["paired"] and not o["target"] and o["trace"] is None,
            floor=o["floor"],
            aa_report=o["aa_report"],
            json_out=o["json_out"],
            output=o["output"],
        )
        return
    run_paired_cli(
        targets=targets(),
        trace=o["trace"],
        traces_port=o["traces_port"],
        speed=o["replay_speed"],
        limit=o["num_prompts"],
        timeout=o["timeout"],
        chat=o["endpoint"].value == "chat",
        floor=o["floor"],
        aa=o["aa"],
        aa_report=o["aa_report"],
        max_lag_ms=o["max_lag_ms"],
        seed=o["seed"],
        loop=o["loop"],
        json_out=o["json_out"],
        output=o["output"],
        csv_out=o["csv_out"],
        plot=o["plot"],
    )


def _aa_calibration(
    paths: Sequence[Path],
) -> tuple[AaCalibration, tuple[tuple[float, float], ...]]:
    """The A/A calibration of several A/A passes' JSON reports (`bench --paired --aa -o`), and
    when each pass ran (nan where a report does not say)."""
    from kimictl.core.outputs import read_json_input
    from kimictl.runtime.load.paired import report_ran
    from kimictl.runtime.verdict.paired import MIN_AA_PASSES, aa_calibration

    def parse(doc: Any) -> tuple[float, float, tuple[float, float]]:
        verdict = doc["verdict"]
        if not verdict["aa"]:
            raise ValueError("not an A/A run")
        return float(verdict["raw_log"]), float(verdict["boot_var"]), report_ran(doc)

    if len(paths) < MIN_AA_PASSES:
        raise InputError(
            f"--aa-report: {len(paths)} A/A report(s); a calibration needs {MIN_AA_PASSES} or "
            "more passes (`bench --paired --aa -o aaN.json`, each given with --aa-report)."
        )
    what = "the JSON report of `kimictl bench --paired --aa`"
    passes = [read_json_input(p, what, parse) for p in paths]
    try:
        calibration = aa_calibration([m for m, _, _ in passes], [v for _, v, _ in passes])
    except ValueError as error:
        raise InputError(f"--aa-report: {error}.") from None
    return calibration, tuple(t for _, _, t in passes)


def run_paired_cli(
    *,
    targets: list[LoadTarget],
    trace: Path | None,
    traces_port: int | None,
    speed: float,
    limit: int | None,
    timeout: float,
    chat: bool,
    floor: float,
    aa: bool,
    aa_report: list[Path] | None,
    max_lag_ms: float,
    seed: int,
    loop: str,
    json_out: bool,
    output: Path | None,
    csv_out: Path | None,
    plot: Path | None,
) -> None:
    """Check the inputs, run the replay, write the report files, print the verdict."""
    from dataclasses import replace

    from kimictl.core.loops import run, stop_on_signals
    from kimictl.core.outputs import check_new_file
    from kimictl.deployment.traces import DEFAULT_TRACES_PORT
    from kimictl.runtime.load.bench import resolve_models
    from kimictl.runtime.load.mooncake import scan_trace
    from kimictl.runtime.load.paired import PairedConfig, run_paired

    if trace is None:
        raise InputError("--paired replays a trace: give --trace FILE.jsonl.")
    if len(targets) != 2:
        raise InputError(f"--paired needs two targets (A and B); got {len(targets)}.")
    if not 0 <= floor < 1:
        raise InputError(f"--floor {floor:g} must be a fraction in [0, 1), e.g. 0.05 for 5%.")
    if not 0 < max_lag_ms < math.inf:
        raise InputError(f"--max-lag-ms {max_lag_ms:g} must be a number of ms > 0.")
    for flag, path, suffix in (("--output", output, ".json"), ("--csv", csv_out, ".csv"),
                               ("--plot", plot, ".png")):  # fmt: skip
        if path is not None:
            check_new_file(path, flag=flag, suffix=suffix)
    calibration, aa_times = _aa_calibration(aa_report) if aa_report else (None, ())
    scan = scan_trace(trace)  # a bad trace is refused before any server is asked anything
    cfg = PairedConfig(
        trace=trace,
        targets=(targets[0], targets[1]),
        traces_port=traces_port or DEFAULT_TRACES_PORT,
        speed=speed,
        limit=limit,
        timeout=timeout,
        chat=chat,
        floor=floor,
        aa=aa,
        calibration=calibration,
        aa_times=aa_times,
        max_lag_ms=max_lag_ms,
        seed=seed,
    )

    async def main() -> PairedOutcome:
        stop = stop_on_signals()
        resolved = await resolve_models(cfg.targets)
        paired = replace(cfg, targets=(resolved[0], resolved[1]))
        return await run_paired(paired, stop=stop, scan=scan)

    outcome = run(main(), loop)
    _write(outcome, json_out, output, csv_out, plot)
    if not json_out:
        _render(outcome)
    if outcome.stop_reason == "interrupted":
        raise typer.Exit(130)
    if outcome.verdict is None:
        raise CheckFailed(f"no verdict: {outcome.withheld}")


def judge_paired_cli(
    *,
    report: Path,
    alone: bool,
    floor: float,
    aa_report: list[Path] | None,
    json_out: bool,
    output: Path | None,
) -> None:
    """`bench --paired --judge REPORT`: a saved replay judged again from its per-row figures,
    with --floor and --aa-report (A/A passes made before and after it); nothing is sent."""
    import orjson

    from kimictl.commands._output import err_console
    from kimictl.core.outputs import check_new_file, read_json_input, save_or_keep
    from kimictl.runtime.load.paired import judge_again

    if not alone:  # `alone`: given with --paired, and without targets or a trace to send
        raise InputError(
            "--judge REPORT judges a saved `bench --paired` report again: give it with --paired "
            "and no --target or --trace."
        )
    if not 0 <= floor < 1:
        raise InputError(f"--floor {floor:g} must be a fraction in [0, 1), e.g. 0.05 for 5%.")
    if output is not None:
        check_new_file(output, flag="--output", suffix=".json")
    calibration, aa_times = _aa_calibration(aa_report) if aa_report else (None, ())
    doc = read_json_input(report, "the JSON report of `kimictl bench --paired`", lambda d: d)
    try:
        verdict, judged = judge_again(doc, floor=floor, calibration=calibration, aa_times=aa_times)
    except ValueError as error:
        raise InputError(f"--judge {report}: {error}.") from None
    data = orjson.dumps(judged, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    if json_out:
        typer.echo(data.decode())
    else:
        from kimictl.commands._output import console

        arms = judged["arms"]
        console.print(
            f"judged again, nothing sent: {report} ({judged['rows']} rows, A={arms['A']}, "
            f"B={arms['B']})",
            highlight=False,
            markup=False,
        )
        _render_verdict(verdict, judged["calibration_notes"])
    if output is not None:
        written = save_or_keep(output, data + b"\n", flag="--output")
        err_console.print(f"wrote {written}", highlight=False, markup=False)


def _write(
    outcome: PairedOutcome,
    json_out: bool,
    output: Path | None,
    csv_out: Path | None,
    plot: Path | None,
) -> None:
    import orjson

    from kimictl.commands._output import err_console
    from kimictl.core.errors import WriteFailed
    from kimictl.core.outputs import save_or_keep
    from kimictl.runtime.load.paired import write_ratio_plot, write_rows_csv

    data = orjson.dumps(outcome.to_json(), option=orjson.OPT_INDENT_2)
    if json_out:
        typer.echo(data.decode())
    lost: list[WriteFailed] = []  # each kept in the state folder; the others still written
    for path, write in (
        (output, lambda p: save_or_keep(p, data + b"\n", flag="--output")),
        (csv_out, lambda p: write_rows_csv(outcome, p)),
        (plot, lambda p: write_ratio_plot(outcome, p)),
    ):
        if path is not None:
            try:
                err_console.print(f"wrote {write(path)}", highlight=False, markup=False)
            except WriteFailed as error:
                lost.append(error)
    if lost:
        raise lost[0]


def _render(outcome: PairedOutcome) -> None:
    from rich.table import Table

    from kimictl.commands._output import console

    a, b = outcome.arms
    doc = outcome.to_json()
    table = Table(title=f"paired replay: {len(outcome.rows)} rows, A={a}, B={b}")
    table.add_column("figure")
    for arm in (a, b):
        table.add_column(arm, justify="right")
    keys = ["span_interactivity_p10", "span_interactivity_p50", "span_ttft_p50_ms",
            "client_ttft_p50_ms", "span_tpot_p50_ms", "client_tpot_p50_ms",
            "span_queue_p50_ms"]  # fmt: skip
    for key in keys:
        cells = [doc["per_arm"][arm].get(key) for arm in (a, b)]
        table.add_row(key, *("-" if c is None else f"{c:.2f}" for c in cells))
    console.print(table)
    f = outcome.fidelity
    j = outcome.joins
    if f["late_p50_ms"] is not None:
        console.print(
            f"schedule: late p50 {f['late_p50_ms']:.1f} ms, p99 {f['late_p99_ms']:.1f} ms "
            f"(limit {f['limit_p99_ms']:g}); spans joined {a} {j[f'{a}_joined']}/{j['rows']}, "
            f"{b} {j[f'{b}_joined']}/{j['rows']}"
        )
    for note in outcome.notes:
        console.print(f"[yellow]note[/]: {note}")
    if outcome.verdict is not None:
        _render_verdict(outcome.verdict, outcome.calibration_notes)


def _render_verdict(v: Verdict, calibration_notes: Sequence[str]) -> None:
    from kimictl.commands._output import console

    for note in calibration_notes:
        console.print(f"[yellow]note[/]: {note}")
    for name, e in v.figures.items():
        console.print(f"  {name} B/A {e.ratio:.3f} [{e.lo:.3f}, {e.hi:.3f}]")
    style = {"B better": "green", "B worse": "red"}.get(v.decision, "bold")
    console.print(f"[{style}]{v.sentence()}[/]")
    if v.aa and v.decision in ("B better", "B worse"):
        console.print("[yellow]A/A: this decision is a false alarm (the arms are identical).[/]")
