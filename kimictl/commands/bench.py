"""`kimictl bench`: load-test endpoints; throughput, latency, interactivity, goodput, A/B.

The options are defined once below; `runtime.load.request.BenchRequest` checks them together and
builds the run, so the command reads argv, resolves the targets and renders.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kimictl.commands._options import ApiKeyFileOpt, JsonOpt, OutputOpt
from kimictl.core.errors import EndpointError, InputError, WriteFailed
from kimictl.core.loops import EventLoop
from kimictl.runtime.load.records import Schedule
from kimictl.runtime.load.request import Arrivals, Endpoint, WorkloadKind

if TYPE_CHECKING:
    from kimictl.runtime.load.bench import BenchConfig, BenchOutcome
    from kimictl.runtime.load.request import BenchRequest
    from kimictl.runtime.serving.runs import Target

app = typer.Typer(add_completion=False)

# Words after `bench`: it takes options only; caught to say what was meant (--json FILE).
StrayArgs = Annotated[list[str] | None, typer.Argument(hidden=True)]
TargetOpt = Annotated[
    list[str] | None,
    typer.Option("--target", "-t", help="[NAME=]URL or run id; repeat for A/B (first = A)."),
]
AbOpt = Annotated[
    bool, typer.Option("--ab", help="Bench the latest `serve --ab` pair (tuned vs stock).")
]
ModelOpt = Annotated[str | None, typer.Option(help="Model name (default: the server's first).")]
WorkloadOpt = Annotated[WorkloadKind, typer.Option(help="The requests to send.")]
InputLenOpt = Annotated[
    str, typer.Option(help="random: N, A:B (uniform) or lognormal:MEDIAN:SIGMA tokens.")
]
OutputLenOpt = Annotated[str, typer.Option(help="Output tokens, same syntax as --input-len.")]
PrefixLenOpt = Annotated[
    int, typer.Option(min=0, help="random: shared prefix tokens for every request.")
]
AgenticOpt = Annotated[
    str, typer.Option(help="agentic: preset (agentx, small) or a TOML file of overrides.")
]
TraceOpt = Annotated[Path | None, typer.Option(help="replay: JSONL trace file.")]
ReplaySpeedOpt = Annotated[
    float, typer.Option(help="replay: time compression (2 = twice as fast).")
]
PromptsOpt = Annotated[Path | None, typer.Option(help="prompts: JSON/JSONL file of prompts.")]
EndpointOpt = Annotated[Endpoint, typer.Option(help="The OpenAI API to call.")]
ConcurrencyOpt = Annotated[
    str | None,
    typer.Option(help="Closed loop: requests (sessions) in flight; a list sweeps, e.g. 1,2,4,8."),
]
RateOpt = Annotated[str | None, typer.Option(help="Open loop: arrivals per second; a list sweeps.")]
BurstinessOpt = Annotated[
    float, typer.Option(help="Open loop: gamma shape; 1 = Poisson, <1 burstier.")
]
ArrivalsOpt = Annotated[Arrivals, typer.Option(help="Open loop: the arrival process.")]
NumPromptsOpt = Annotated[
    int | None, typer.Option(min=1, help="Measured requests per point (default 50).")
]
DurationOpt = Annotated[float | None, typer.Option(help="Seconds per point (stops issuing after).")]
WarmupOpt = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="Warm-up requests per target, not counted (default: two waves per side in an A/B, "
        "none for one target).",
    ),
]
SeedOpt = Annotated[int, typer.Option(help="Seed: same seed, same requests.")]
RepeatOpt = Annotated[
    int, typer.Option(min=1, help="Repeat every point N times (A/B CI over repeats).")
]
TimeoutOpt = Annotated[float, typer.Option(help="Per-request timeout in seconds.")]
IgnoreEosOpt = Annotated[
    bool, typer.Option("--ignore-eos/--stop-at-eos", help="Generate exactly the output length.")
]
GpusOpt = Annotated[
    int | None, typer.Option(min=1, help="GPUs per target for tokens/s/GPU (tp*pp*dp).")
]
SloOpt = Annotated[
    str | None,
    typer.Option(help='Goodput SLO, e.g. "interactivity_p10>=100,ttft_p99<=2000ms".'),
]
NoMetricsOpt = Annotated[bool, typer.Option("--no-metrics", help="Do not scrape /metrics.")]
TracesPortOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=65535,
        help="Receive the targets' trace spans on 127.0.0.1:PORT for exact server-side "
        "percentiles (servers sending there: \\[metrics] traces); default: histograms only.",
    ),
]
ScheduleOpt = Annotated[
    Schedule,
    typer.Option(
        help="A/B: abba (turns of about one wave each, A B B A A B B A ...), turns (each point "
        "whole, in turn) or interleave (all targets at once)."
    ),
]
InterleaveOpt = Annotated[
    bool, typer.Option("--interleave", help="A/B: the same as --schedule interleave.")
]
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Client worker processes, one event loop each (default: one per 32 streams, up to "
        "half the idle cores).",
    ),
]
LoopOpt = Annotated[
    EventLoop,
    typer.Option(help="The client's event loop: auto (uvloop when installed), uvloop or asyncio."),
]
CsvOpt = Annotated[Path | None, typer.Option("--csv", help="Write one row per request.")]
PlotOpt = Annotated[
    Path | None, typer.Option(help="Write PNG plots into DIR (--paired: one PNG file).")
]
PairedOpt = Annotated[
    bool,
    typer.Option(
        "--paired",
        help="Replay --trace to both targets, row by row on its clock; one paired verdict from "
        "the servers' spans (--traces-port).",
    ),
]
AaOpt = Annotated[
    bool, typer.Option("--aa", help="--paired: an A/A pass (identical arms), for --aa-report.")
]
AaReportOpt = Annotated[
    list[Path] | None,
    typer.Option(
        help="--paired: the JSON of an A/A pass (`--aa -o`), 3 or more times: the verdict is "
        "judged net of their offset, their spread between passes added to its interval."
    ),
]
JudgeOpt = Annotated[
    Path | None,
    typer.Option(
        "--judge",
        metavar="REPORT",
        help="--paired: judge a saved replay (its -o JSON) again, nothing sent: with --aa-report "
        "passes made before and after it, or another --floor.",
    ),
]
FloorOpt = Annotated[
    float,
    typer.Option(
        min=0, max=0.99, help="--paired: smaller differences are no practical difference."
    ),
]
MaxLagOpt = Annotated[
    float,
    typer.Option(min=0.001, help="--paired: p99 send lateness (ms) above which no figures."),
]
SaveResultOpt = Annotated[
    Path | None,
    typer.Option(
        "--save-result",
        metavar="FILE",
        help="One target, one point: write FILE as `vllm bench serve --save-result` does (flat "
        "JSON; its readers load it unchanged). An existing FILE is refused.",
    ),
]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Replace existing -o/--csv/--save-result/plot files.")
]


@app.command(
    help="Send a workload to one or more endpoints and report throughput, latency and "
    "interactivity.\n\nTwo targets make an A/B: the same requests go to both in turn; ratios A/B "
    "with 95% CIs."
)
def bench(
    stray: StrayArgs = None,
    target: TargetOpt = None,
    ab: AbOpt = False,
    model: ModelOpt = None,
    workload: WorkloadOpt = WorkloadKind.random,
    input_len: InputLenOpt = "256",
    output_len: OutputLenOpt = "128",
    prefix_len: PrefixLenOpt = 0,
    agentic_config: AgenticOpt = "agentx",
    trace: TraceOpt = None,
    replay_speed: ReplaySpeedOpt = 1.0,
    prompts: PromptsOpt = None,
    endpoint: EndpointOpt = Endpoint.completions,
    concurrency: ConcurrencyOpt = None,
    rate: RateOpt = None,
    burstiness: BurstinessOpt = 1.0,
    arrivals: ArrivalsOpt = Arrivals.poisson,
    num_prompts: NumPromptsOpt = None,
    duration: DurationOpt = None,
    warmup: WarmupOpt = None,
    seed: SeedOpt = 0,
    repeat: RepeatOpt = 1,
    timeout: TimeoutOpt = 300.0,
    ignore_eos: IgnoreEosOpt = True,
    gpus: GpusOpt = None,
    slo: SloOpt = None,
    no_metrics: NoMetricsOpt = False,
    traces_port: TracesPortOpt = None,
    schedule: ScheduleOpt = Schedule.abba,
    interleave: InterleaveOpt = False,
    workers: WorkersOpt = None,
    loop: LoopOpt = EventLoop.auto,
    api_key_file: ApiKeyFileOpt = None,
    json_out: JsonOpt = False,
    output: OutputOpt = None,
    csv_out: CsvOpt = None,
    plot: PlotOpt = None,
    save_result: SaveResultOpt = None,
    paired: PairedOpt = False,
    aa: AaOpt = False,
    aa_report: AaReportOpt = None,
    judge: JudgeOpt = None,
    floor: FloorOpt = 0.05,
    max_lag_ms: MaxLagOpt = 100.0,
    force: ForceOpt = False,
) -> None:
    options = dict(locals())  # the options, by name: BenchRequest's fields
    from kimictl.core.apikeys import read_api_key
    from kimictl.runtime.load.request import BenchRequest

    _reject_stray(stray)
    if paired or judge is not None:
        from kimictl.commands._paired import load_targets, paired_command

        key = read_api_key(api_key_file)
        paired_command(options, lambda: load_targets(_targets(target or [], ab=ab), model, key))
        return
    request = BenchRequest.from_options(
        options, scrape_metrics=not no_metrics, api_key=read_api_key(api_key_file)
    )
    cfg = request.config(_targets(target or [], ab=ab))
    _report(_run(cfg, quiet=json_out), request, json_out)


def _report(outcome: BenchOutcome, request: BenchRequest, json_out: bool) -> None:
    """Save, print, then exit as the run went: the table is printed even when a save failed."""
    lost = _write(outcome, json_out, request)
    if not json_out:
        from kimictl.commands._render import render_bench

        render_bench(outcome)
    if lost:
        from kimictl.commands._output import err_console

        for other in lost[1:]:
            err_console.print(f"error: {other.message}", highlight=False, markup=False)
        raise lost[0]
    _exit_on_failure(outcome, key_sent=request.api_key is not None)


def _reject_stray(stray: list[str] | None) -> None:
    if not stray:
        return
    if len(stray) == 1 and (stray[0] == "-" or stray[0].endswith(".json")):
        raise InputError(
            f"--json takes no value ('{stray[0]}'): it prints the report JSON on stdout; "
            "to write it to a file use --output FILE (-o FILE)."
        )
    raise InputError(
        f"unexpected argument(s) {' '.join(stray)}: bench takes options only "
        "(targets are --target URL)."
    )


def _targets(texts: list[str], *, ab: bool) -> list[Target]:
    from kimictl.runtime.serving.runs import resolve_targets

    if ab and texts:
        raise InputError("--ab and --target exclude each other; give one of them")
    if not ab and not texts:
        raise InputError(
            "no target: pass --target [NAME=]URL (twice for an A/B) or --ab",
            hint="e.g. kimictl bench --target http://127.0.0.1:8000",
        )
    return resolve_targets(
        texts,
        missing="--ab: no live A/B pair was launched by kimictl",
        hint="start one with `kimictl serve --ab`, or pass --target a=URL --target b=URL",
        apart="--target a=URL",
    )


def _exit_on_failure(outcome: BenchOutcome, *, key_sent: bool) -> None:
    """Ctrl-C: exit 130 keeping the report; a run stopped early or a point with no finished
    request: an EndpointError naming it."""
    reason = outcome.stop_reason
    if reason == "interrupted":
        from kimictl.commands._output import err_console

        done = sum(1 for r in outcome.records if r.error_kind != "cancelled")
        err_console.print(f"interrupted: {done} finished requests kept in the report")
        raise typer.Exit(130)
    if reason:
        raise EndpointError(
            f"the run stopped early: {reason}",
            hint="finished requests are in the report; see `kimictl ps` and `kimictl logs`",
        )
    empty = [s for s in outcome.summaries if not s["completed"] and s["failed"]]
    if empty:
        k = empty[0]["kimictl"]
        raise EndpointError(
            f"no request finished at {k['target']} {k['point']}: {empty[0]['failed']} failed "
            f"({', '.join(f'{n} {kind}' for kind, n in k['errors_by_kind'].items())})",
            hint=_failed_hint(outcome, k["target"], key_sent=key_sent),
        )


def _failed_hint(outcome: BenchOutcome, target: str, *, key_sent: bool) -> str:
    from kimictl.core.apikeys import auth_hint

    mine = [r for r in outcome.records if r.target == target]
    refused = next((r.status for r in mine if r.status in (401, 403)), 0)
    return auth_hint(refused, key_sent=key_sent) or (
        "each request's error is in the report (--json, -o FILE); see `kimictl logs`"
    )


def _run(cfg: BenchConfig, *, quiet: bool) -> BenchOutcome:
    from kimictl.commands._render import bench_progress
    from kimictl.core.loops import run, stop_on_signals
    from kimictl.runtime.load.bench import resolve_models, run_bench

    progress, on_point, on_record = bench_progress(cfg.num_prompts, cfg.repeat, quiet=quiet)

    async def main() -> BenchOutcome:
        stop = stop_on_signals()
        targets = await resolve_models(cfg.targets)
        from dataclasses import replace

        with progress:
            return await run_bench(
                replace(cfg, targets=tuple(targets)),
                stop=stop,
                on_record=on_record,
                on_point=on_point,
            )

    return run(main(), cfg.loop)


def _write(outcome: BenchOutcome, json_out: bool, request: BenchRequest) -> list[WriteFailed]:
    """--json on stdout; -o, --csv, --plot, --save-result through the one writer (a failed one
    kept in the state folder and returned)."""
    from kimictl.commands._output import err_console
    from kimictl.core.jsondoc import dumps
    from kimictl.runtime.load.exports import write_bench_outputs

    data = dumps(outcome.to_json())
    if json_out:
        import sys

        sys.stdout.write(data.decode())
    return write_bench_outputs(
        outcome,
        data,
        output=request.output,
        csv_out=request.csv_out,
        plot=request.plot,
        save_result=request.save_result,
        overwrite=request.force,
        wrote=lambda path: err_console.print(f"wrote {path}", highlight=False, markup=False),
    )
