"""`kimictl tune`: pick TP / DCP / draft tokens / max-num-seqs from the model or from measurements.

kimictl tune --system gb300 --gpus 16 --context 8k --output-len 1k --concurrency 1 [--slo ...]
kimictl tune predict --system gb300 --gpus 8 --tp 8 --batch 64 [--draft-tokens 7] --json
kimictl tune --measure URL|RUN_ID --slo ... [--write PROFILE]
kimictl tune --check BENCH.json PROFILE
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kimictl.commands._options import JsonOpt
from kimictl.commands._output import console, emit_json
from kimictl.core.errors import CheckFailed, InputError

if TYPE_CHECKING:
    from kimictl.runtime.tuning.measure import MeasureResult
    from kimictl.runtime.tuning.search import SearchResult
    from kimictl.runtime.tuning.service import SearchOutcome

app = typer.Typer(
    add_completion=False,
    help="Pick TP/DCP/draft/batch profiles from a model of the K3 decode step or measurements.",
)

SystemOpt = Annotated[
    str | None, typer.Option("--system", help="gb300, b300, b200 or h200.", show_default=False)
]
GpusOpt = Annotated[int | None, typer.Option("--gpus", min=1, help="GPUs in the deployment.")]
SnapshotOpt = Annotated[
    list[Path] | None,
    typer.Option("--from-snapshot", help="Hardware snapshot JSON(s) instead of --system/--gpus."),
]
ContextOpt = Annotated[str, typer.Option("--context", help="Prompt tokens per request (8k, 8192).")]
OutputOpt = Annotated[str, typer.Option("--output-len", help="Output tokens per request.")]
AcceptOpt = Annotated[
    str | None,
    typer.Option(
        "--draft-acceptance",
        help="Measured acceptance length AL (at 7 draft tokens) or AL@D. Default: AL 6 assumed.",
    ),
]
CommOpt = Annotated[
    Path | None,
    typer.Option(
        "--comm-curve",
        help="All-reduce curve JSON from lab/bench/allreduce.py: the model's communication term "
        "comes from it (other TPs extrapolated) instead of the spec-sheet constants.",
        metavar="FILE",
    ),
]


ConcurrencyOpt = Annotated[
    int, typer.Option("--concurrency", min=1, help="Requests in flight across all replicas.")
]
SloOpt = Annotated[
    str | None, typer.Option("--slo", help='e.g. "interactivity_p10>=150,ttft_p99<=2s".')
]
WriteOpt = Annotated[
    Path | None, typer.Option("--write", help="Write the chosen profile TOML here.")
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite the --write and --plot files.")]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Also save the Pareto plot as a PNG.")]
MeasureOpt = Annotated[
    str | None,
    typer.Option("--measure", help="Sweep concurrency against a live server (URL or run id)."),
]
ProfileOpt = Annotated[
    str | None,
    typer.Option("--profile", help="With --measure URL --write: the profile the server runs."),
]
MaxConcurrencyOpt = Annotated[
    int, typer.Option("--max-concurrency", help="With --measure: the sweep's highest load.")
]
NumPromptsOpt = Annotated[
    int | None,
    typer.Option("--num-prompts", help="With --measure: requests per point (2 x load, >= 4)."),
]
CheckOpt = Annotated[
    tuple[Path, str] | None,
    typer.Option(
        "--check",
        help="BENCH.json PROFILE: the model's error on a measured bench result.",
        metavar="BENCH.json PROFILE",
    ),
]


@app.callback(invoke_without_command=True)
def tune(
    ctx: typer.Context,
    system: SystemOpt = None,
    gpus: GpusOpt = None,
    from_snapshot: SnapshotOpt = None,
    context: ContextOpt = "8k",
    output_len: OutputOpt = "1k",
    concurrency: ConcurrencyOpt = 1,
    slo: SloOpt = None,
    draft_acceptance: AcceptOpt = None,
    json_out: JsonOpt = False,
    write: WriteOpt = None,
    force: ForceOpt = False,
    plot: PlotOpt = None,
    measure: MeasureOpt = None,
    base_profile: ProfileOpt = None,
    max_concurrency: MaxConcurrencyOpt = 64,
    num_prompts: NumPromptsOpt = None,
    check: CheckOpt = None,
    comm_curve: CommOpt = None,
) -> None:
    """Search TP8/TP16 x DCP x draft x max-num-seqs; print the Pareto frontier and a choice."""
    if ctx.invoked_subcommand is not None:
        return
    if check is not None and check[0] is not None:
        _check(check[0], check[1], json_out, system)
        return
    if measure is not None:
        _measure(
            measure,
            slo,
            context,
            output_len,
            write,
            force,
            json_out,
            base_profile,
            max_concurrency,
            num_prompts,
        )
        return
    from kimictl.runtime.tuning.service import SearchRequest

    outcome = SearchRequest(
        system=system,
        gpus=gpus,
        snapshots=tuple(from_snapshot or ()),
        context=context,
        output_len=output_len,
        concurrency=concurrency,
        slo=slo,
        draft_acceptance=draft_acceptance,
        comm_curve=comm_curve,
        write=write,
        plot=plot,
        force=force,
    ).run()
    if json_out:
        emit_json(outcome.to_json())
    else:
        _render_search(outcome)
    _fail_if_nothing_fits(outcome.result)


def _fail_if_nothing_fits(result: SearchResult) -> None:
    if result.choice is None:
        inp = result.inputs
        raise CheckFailed(
            f"no configuration fits {inp.gpus} x {inp.system.name} at context {inp.context}: the "
            f"weights plus one request's KV cache exceed GPU memory at every TP; nothing written.",
            hint="use more GPUs per replica (TP16) or a system with more memory per GPU",
        )


def _render_search(outcome: SearchOutcome) -> None:
    from kimictl.runtime.tuning.layer_overhead import overheads_report

    _render_frontier(outcome.result, outcome.source)
    console.print(f"[dim]all-reduce term: {outcome.system.communication()}[/dim]", soft_wrap=True)
    note = overheads_report(outcome.system)["source"]
    console.print(f"[dim]per-kernel overheads: {note}[/dim]", soft_wrap=True)
    if outcome.png is not None:
        console.print(f"plot written: {outcome.png}")
    if outcome.written is not None:
        console.print(f"profile written: {outcome.written}")


def _render_frontier(result: SearchResult, source: str) -> None:
    from rich.table import Table

    from kimictl.runtime.tuning.model import MODEL_VERSION
    from kimictl.runtime.tuning.plot import terminal_plot
    from kimictl.runtime.tuning.published import published_checks
    from kimictl.runtime.tuning.systems import SYSTEMS

    inp = result.inputs
    console.print(
        f"[bold]kimictl tune[/bold] {inp.system.name} x {inp.gpus} GPUs ({source}), context "
        f"{inp.context}, output {inp.output_len}, concurrency {inp.concurrency}"
        + (f", SLO '{inp.slo}'" if inp.slo else "")
    )
    for note in result.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    table = Table(title="Pareto frontier (model; each row one replica at max-num-seqs)")
    for column in ("path", "TP", "DCP", "draft", "seqs", "tok/s/user", "tok/s/GPU", "step ms",
                   "fallback"):  # fmt: skip
        table.add_column(column, justify="right" if column != "path" else "left", no_wrap=True)
    for pred in result.pareto:
        cfg = pred.config
        table.add_row(
            cfg.path,
            str(cfg.tp),
            str(cfg.dcp),
            str(cfg.draft_tokens),
            str(cfg.batch),
            f"{pred.tokens_per_s_per_user:.0f}",
            f"{pred.tokens_per_s_per_gpu:.0f}",
            f"{pred.step_us / 1000:.2f}",
            f"{pred.fallback_share:.0%}",
        )
    console.print(table)
    console.print(terminal_plot(result, width=min(console.width, 90)), markup=False)
    choice = result.choice
    if choice is None:
        console.print("[bold red]no configuration fits this system[/bold red]")
        return
    cfg = choice.config
    pred = choice.prediction
    console.print(
        f"[bold green]choice:[/bold green] {cfg.path} TP{cfg.tp} DCP{cfg.dcp} "
        f"draft {cfg.draft_tokens}, max-num-seqs {choice.max_num_seqs}, {choice.replicas} "
        f"replica(s)"
    )
    console.print(
        f"  predicted at concurrency {inp.concurrency}: {pred.tokens_per_s_per_user:.0f} "
        f"tokens/s/user, {pred.tokens_per_s_per_gpu:.1f} tokens/s/GPU, step "
        f"{pred.step_us / 1000:.2f} ms, TTFT {pred.ttft_ms:.0f} ms; stock "
        f"{choice.stock.tokens_per_s_per_user:.0f} tokens/s/user "
        f"({pred.tokens_per_s_per_user / choice.stock.tokens_per_s_per_user:.2f}x)"
    )
    console.print(
        f"  steps falling back to stock at this load: {pred.fallback_share:.1%}; every step "
        f"falls back beyond {choice.fast_path_limit} requests per replica"
    )
    console.print("[bold]why:[/bold]")
    for line in choice.why:
        console.print(f"  - {line}")
    errors = ", ".join(
        f"{c.name} {c.error:+.1%}{' (fitted)' if c.in_sample else ''}"
        for c in published_checks(SYSTEMS["gb300"])
    )
    console.print(f"[dim]model {MODEL_VERSION}; error on the published figures: {errors}[/dim]")


@app.command("predict")
def predict_cmd(
    system: SystemOpt = None,
    gpus: GpusOpt = None,
    from_snapshot: SnapshotOpt = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size: 8 or 16.")] = 8,
    dcp: Annotated[int, typer.Option("--dcp", help="Decode context parallel: 1 or TP.")] = 1,
    batch: Annotated[int, typer.Option("--batch", help="Requests in the decode step.")] = 1,
    draft_tokens: Annotated[
        int, typer.Option("--draft-tokens", help="DSpark draft tokens (0-7).")
    ] = 0,
    draft_acceptance: AcceptOpt = None,
    context: ContextOpt = "8k",
    output_len: OutputOpt = "1k",
    json_out: JsonOpt = False,
    comm_curve: CommOpt = None,
) -> None:
    """The model's prediction for one configuration, specialized path and stock."""
    from kimictl.runtime.tuning import service

    hw, count, _ = service.resolve_system(system, gpus, from_snapshot)
    hw = service.with_comm_curve(hw, comm_curve)
    result = service.predict_pair(
        system=hw,
        gpus=count,
        tp=tp,
        dcp=dcp,
        batch=batch,
        draft_tokens=draft_tokens,
        acceptance=service.parse_acceptance(
            draft_acceptance, default_draft_tokens=draft_tokens or None
        ),
        context=service.parse_tokens(context, flag="--context"),
        output_len=service.parse_tokens(output_len, flag="--output-len"),
    )
    if json_out:
        emit_json(result)
        return
    _render_predict(result)


def _render_predict(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"{result['system']} x {result['gpus']}: one configuration (model)")
    for column in ("", "specialized", "stock"):
        table.add_column(column, justify="right")
    for key, label in (
        ("tokens_per_s", "tokens/s (replica)"),
        ("tokens_per_s_per_user", "tokens/s/user"),
        ("tokens_per_s_per_gpu", "tokens/s/GPU"),
        ("step_us", "step us"),
    ):
        table.add_row(label, f"{result['specialized'][key]:,.1f}", f"{result['stock'][key]:,.1f}")
    spec, stock = result["specialized"]["detail"], result["stock"]["detail"]
    table.add_row("TTFT ms", f"{spec['ttft_ms']:.0f}", f"{stock['ttft_ms']:.0f}")
    table.add_row("fallback share", f"{spec['fallback_share']:.1%}", "-")
    console.print(table)
    assumed = " (assumed)" if result["acceptance_assumed"] else ""
    console.print(
        f"speedup {result['speedup']:.2f}x; tokens per step {result['acceptance_length']}{assumed}"
    )
    if result["specialized_unavailable"]:
        console.print(f"[yellow]note:[/yellow] {result['specialized_unavailable']}")
    console.print(f"all-reduce term: {result['communication']}", soft_wrap=True)
    plain = result["spec_sheet_communication"]
    if plain is not None:
        parts = []
        for path in ("specialized", "stock"):
            now, then = result[path], plain[path]
            comm_now = now["detail"]["breakdown_us"].get("comm", 0.0)
            parts.append(
                f"{path} {then['tokens_per_s_per_user']:,.1f} tokens/s/user "
                f"(comm {then['comm_us']:.1f} us/step; measured: {comm_now:.1f})"
            )
        console.print("with the spec-sheet constants instead: " + "; ".join(parts), soft_wrap=True)


def _check(bench: Path, profile: str, json_out: bool, system: str | None) -> None:
    from kimictl.runtime.tuning.reconcile import check_bench

    report = check_bench(bench, profile, system=system)
    if json_out:
        emit_json(report)
        return
    from rich.table import Table

    table = Table(title=f"model vs measured: {bench} on profile {report['profile']}")
    for column in ("figure", "measured", "predicted", "error"):
        table.add_column(column, justify="right" if column != "figure" else "left")
    for row in report["figures"]:
        table.add_row(
            row["figure"],
            f"{row['measured']:.2f}",
            f"{row['predicted']:.2f}",
            f"{row['error']:+.1%}",
        )
    console.print(table)
    if report["max_abs_error"] is not None:
        console.print(
            f"model {report['model_version']} on {report['system']}: largest error "
            f"{report['max_abs_error']:.1%} ({report['config']['path']} TP{report['config']['tp']} "
            f"DCP{report['config']['dcp']} draft {report['config']['draft_tokens']})"
        )
    for note in report["notes"]:
        console.print(f"[yellow]note:[/yellow] {note}")


def _measure(
    target: str,
    slo: str | None,
    context: str,
    output_len: str,
    write: Path | None,
    force: bool,
    json_out: bool,
    base_profile: str | None,
    max_concurrency: int,
    num_prompts: int | None,
) -> None:
    if slo is None:
        raise InputError("--measure needs --slo, e.g. --slo 'interactivity_p10>=20'.")
    from kimictl.runtime.tuning.choice_profile import check_write_target
    from kimictl.runtime.tuning.measure import measure, write_measured
    from kimictl.runtime.tuning.service import parse_tokens

    if write is not None:  # refuse a bad --write before the sweep, not after it
        check_write_target(write, overwrite=force)
        if base_profile is not None:
            from kimictl.deployment.profiles import load_profile

            load_profile(base_profile)
    result = measure(
        target,
        slo_text=slo,
        context=parse_tokens(context, flag="--context"),
        output_len=parse_tokens(output_len, flag="--output-len"),
        max_concurrency=max_concurrency,
        prompts_per_point=num_prompts,
        progress=None if json_out else console.print,
    )
    written = None
    if write is not None and result.best > 0:  # nothing met the SLO: CheckFailed below
        written = write_measured(result, write, base_profile=base_profile, overwrite=force)
    if json_out:
        doc = result.to_json()
        if written is not None:
            doc["written"] = str(written)
        emit_json(doc)
    else:
        _render_measured(result, written)
    if result.best == 0:
        raise CheckFailed(
            f"no concurrency met the SLO '{result.slo}' on {result.url}: {result.limit_reason}.",
            hint="relax the SLO, or shorten --context/--output-len to match your workload",
        )


def _render_measured(result: MeasureResult, written: Path | None) -> None:
    from rich.table import Table

    table = Table(title=f"measured: {result.url} ({result.model}), SLO '{result.slo}'")
    for column in (
        "concurrency",
        "SLO",
        "p10 tok/s/user",
        "p50 tok/s/user",
        "tok/s",
        "p99 TTFT ms",
    ):
        table.add_column(column, justify="right")
    for point in result.points:
        table.add_row(
            str(point.concurrency),
            "[green]met[/green]" if point.met else "[red]broken[/red]",
            _num(point.interactivity_p10),
            _num(point.interactivity_p50),
            _num(point.output_throughput),
            _num(point.ttft_p99_ms),
        )
    console.print(table)
    console.print(
        f"[bold]largest concurrency meeting the SLO: {result.best}[/bold] ({result.limit_reason})"
    )
    if written is not None:
        console.print(f"profile written: {written} (max-num-seqs {result.best})")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


@app.command("model")
def model_cmd(
    calibrate: Annotated[
        bool, typer.Option("--calibrate", help="Refit the fitted parameters and compare.")
    ] = False,
    kernel_bench: Annotated[
        Path | None,
        typer.Option(
            "--kernel-bench", help="Fit HBM efficiency from `kimictl kernels bench` JSON."
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """The model's parameters (with sources) and its error on each published figure."""
    from kimictl.runtime.tuning.service import model_card

    card = model_card(calibrate=calibrate, kernel_bench=kernel_bench)
    if json_out:
        emit_json(card)
        return
    from rich.table import Table

    params = Table(title=f"model {card['model_version']}: parameters")
    for column in ("name", "value", "unit", "source"):
        params.add_column(column, overflow="fold")
    for name, param in card["parameters"].items():
        params.add_row(name, f"{param['value']:g}", param["unit"], param["source"])
    console.print(params)
    figures = Table(title="published figures (GB300, k3-vllm-facts.md) vs the model")
    for column in ("figure", "published", "model", "error", "kind"):
        figures.add_column(column, justify="left" if column in ("figure", "kind") else "right")
    for row in card["published_figures"]:
        figures.add_row(
            row["figure"],
            "-".join(f"{v:g}" for v in row["published_range"] or [row["published"]]),
            f"{row['predicted']:.3f}",
            f"{row['error']:+.1%}",
            "fitted to it" if row["in_sample"] else "prediction",
        )
    console.print(figures)
    if kernel_bench is not None:
        for kind, fit in card["kernel_bench"]["fits"].items():
            stored = card["kernel_bench"]["compare"][f"hbm_efficiency_{kind}"]["stored"]
            console.print(
                f"kernel bench ({kind}, {fit['shapes']} shapes at M=1): t = "
                f"{fit['intercept_us']:.2f} us + bytes / {fit['tb_s']:.2f} TB/s -> HBM efficiency "
                f"{fit['efficiency']:.3f} (model uses {stored:g})"
            )
    if calibrate:
        for name, row in card["calibration"].items():
            console.print(
                f"calibrate: {name} stored {row['stored']:g}, refit {row['refit']:.4g} "
                f"({row['drift']:+.2%})"
            )
