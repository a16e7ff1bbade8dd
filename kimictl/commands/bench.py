"""`kimictl bench`: load-test endpoints; throughput, latency, interactivity, goodput, A/B."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kimictl.core.apikeys import read_api_key
from kimictl.core.errors import EndpointError, InputError

if TYPE_CHECKING:
    from kimictl.runtime.load.bench import BenchOutcome
    from kimictl.runtime.load.loadgen import LoadPoint, LoadTarget

app = typer.Typer(add_completion=False)

WORKLOADS = ("random", "agentic", "replay", "prompts")


def _numbers(text: str, what: str, kind: type) -> list[Any]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = kind(part)
        except ValueError:
            raise InputError(
                f"{what} {text!r}: {part!r} is not a {'whole ' if kind is int else ''}number; "
                f"give a comma-separated list, e.g. {what} 1,2,4,8"
            ) from None
        if value <= 0:
            raise InputError(f"{what} {text!r}: {part!r} must be > 0")
        out.append(value)
    if not out:
        raise InputError(f"{what} {text!r} is empty; give e.g. {what} 1,2,4")
    return out


def _targets(
    texts: list[str], ab: bool, model: str | None, gpus: int | None, key: str | None
) -> list[LoadTarget]:
    from kimictl.runtime.load.loadgen import LoadTarget
    from kimictl.runtime.serving.runs import ab_targets, resolve_target

    if ab:
        if texts:
            raise InputError("--ab and --target exclude each other; give one of them")
        resolved = list(
            ab_targets(
                ("tuned", "stock"),
                missing="--ab: no live A/B pair was launched by kimictl",
                hint="start one with `kimictl serve --ab`, or pass --target a=URL --target b=URL",
            )
        )
    elif texts:
        resolved = [resolve_target(t) for t in texts]
    else:
        raise InputError(
            "no target: pass --target [NAME=]URL (twice for an A/B) or --ab",
            hint="e.g. kimictl bench --target http://127.0.0.1:8000",
        )
    names = [t.name for t in resolved]
    for n in names:
        if names.count(n) > 1:
            raise InputError(f"two targets are named {n!r}; name them apart, e.g. --target a=URL")
    return [
        LoadTarget(
            name=t.name,
            url=t.url,
            model=model or t.model or "",
            api_key=key,
            gpus=gpus if gpus is not None else t.gpus,
        )
        for t in resolved
    ]


def _workload(
    name: str,
    input_len: str,
    output_len: str,
    prefix_len: int,
    agentic_config: str,
    trace: Path | None,
    prompts: Path | None,
    replay_speed: float,
) -> Any:
    from kimictl.runtime.load import workloads as w

    out_dist = w.parse_length(output_len, what="--output-len")
    if name == "random":
        if prefix_len < 0:
            raise InputError(f"--prefix-len {prefix_len} must be >= 0")
        return w.RandomWorkload(w.parse_length(input_len, what="--input-len"), out_dist, prefix_len)
    if name == "agentic":
        return w.AgenticWorkload(w.load_agentic_config(agentic_config))
    if name == "replay":
        if trace is None:
            raise InputError("--workload replay needs --trace FILE.jsonl")
        return w.ReplayWorkload.from_file(trace, speed=replay_speed)
    if name == "prompts":
        if prompts is None:
            raise InputError("--workload prompts needs --prompts FILE (JSON or JSONL)")
        return w.PromptsWorkload.from_file(prompts, output_len=out_dist)
    raise InputError(f"--workload {name!r} is not one of: {', '.join(WORKLOADS)}")


def _points(
    concurrency: str | None, rate: str | None, burstiness: float, arrivals: str, replay: bool
) -> list[LoadPoint]:
    from kimictl.runtime.load.loadgen import LoadPoint

    if arrivals not in ("poisson", "constant"):
        raise InputError(f"--arrivals {arrivals!r} is not one of: poisson, constant")
    if burstiness <= 0:
        raise InputError(f"--burstiness {burstiness} must be > 0 (1 = Poisson)")
    conc = _numbers(concurrency, "--concurrency", int) if concurrency else None
    if replay:
        if rate:
            raise InputError(
                "--workload replay runs on the trace's clock; drop --rate (use --replay-speed)"
            )
        return [LoadPoint(concurrency=conc[0] if conc else None, rate=float("inf"))]
    if rate:
        if conc and len(conc) > 1:
            raise InputError(
                "with --rate, --concurrency is one cap on requests in flight, not a list"
            )
        cap = conc[0] if conc else None
        return [
            LoadPoint(concurrency=cap, rate=r, burstiness=burstiness, arrivals=arrivals)
            for r in _numbers(rate, "--rate", float)
        ]
    return [LoadPoint(concurrency=c) for c in (conc or [1])]


@app.command()
def bench(
    stray: Annotated[list[str] | None, typer.Argument(hidden=True)] = None,
    target: Annotated[
        list[str] | None,
        typer.Option("--target", "-t", help="[NAME=]URL or run id; repeat for A/B (first = A)."),
    ] = None,
    ab: Annotated[
        bool, typer.Option("--ab", help="Bench the latest `serve --ab` pair (tuned vs stock).")
    ] = False,
    model: Annotated[
        str | None, typer.Option(help="Model name (default: the server's first).")
    ] = None,
    workload: Annotated[str, typer.Option(help="random | agentic | replay | prompts.")] = "random",
    input_len: Annotated[
        str, typer.Option(help="random: N, A:B (uniform) or lognormal:MEDIAN:SIGMA tokens.")
    ] = "256",
    output_len: Annotated[
        str, typer.Option(help="Output tokens, same syntax as --input-len.")
    ] = "128",
    prefix_len: Annotated[
        int, typer.Option(help="random: shared prefix tokens for every request.")
    ] = 0,
    agentic_config: Annotated[
        str, typer.Option(help="agentic: preset (agentx, small) or a TOML file of overrides.")
    ] = "agentx",
    trace: Annotated[Path | None, typer.Option(help="replay: JSONL trace file.")] = None,
    replay_speed: Annotated[
        float, typer.Option(help="replay: time compression (2 = twice as fast).")
    ] = 1.0,
    prompts: Annotated[
        Path | None, typer.Option(help="prompts: JSON/JSONL file of prompts.")
    ] = None,
    endpoint: Annotated[str, typer.Option(help="completions | chat.")] = "completions",
    concurrency: Annotated[
        str | None,
        typer.Option(
            help="Closed loop: requests (sessions) in flight; a list sweeps, e.g. 1,2,4,8."
        ),
    ] = None,
    rate: Annotated[
        str | None, typer.Option(help="Open loop: arrivals per second; a list sweeps.")
    ] = None,
    burstiness: Annotated[
        float, typer.Option(help="Open loop: gamma shape; 1 = Poisson, <1 burstier.")
    ] = 1.0,
    arrivals: Annotated[str, typer.Option(help="Open loop: poisson | constant.")] = "poisson",
    num_prompts: Annotated[
        int | None, typer.Option(help="Measured requests per point (default 50).")
    ] = None,
    duration: Annotated[
        float | None, typer.Option(help="Seconds per point (stops issuing after).")
    ] = None,
    warmup: Annotated[
        int | None,
        typer.Option(
            help="Warm-up requests per target, not counted (default: two waves per side in an "
            "A/B, none for one target)."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed: same seed, same requests.")] = 0,
    repeat: Annotated[
        int, typer.Option(help="Repeat every point N times (A/B CI over repeats).")
    ] = 1,
    timeout: Annotated[float, typer.Option(help="Per-request timeout in seconds.")] = 300.0,
    ignore_eos: Annotated[
        bool, typer.Option("--ignore-eos/--stop-at-eos", help="Generate exactly the output length.")
    ] = True,
    gpus: Annotated[
        int | None, typer.Option(help="GPUs per target for tokens/s/GPU (tp*pp*dp).")
    ] = None,
    slo: Annotated[
        str | None,
        typer.Option(help='Goodput SLO, e.g. "interactivity_p10>=100,ttft_p99<=2000ms".'),
    ] = None,
    no_metrics: Annotated[
        bool, typer.Option("--no-metrics", help="Do not scrape /metrics.")
    ] = False,
    traces_port: Annotated[
        int | None,
        typer.Option(
            help="Receive the targets' trace spans on 127.0.0.1:PORT for exact server-side "
            "percentiles (servers sending there: [metrics] traces); default: histograms only."
        ),
    ] = None,
    schedule: Annotated[
        str,
        typer.Option(
            help="A/B: abba (turns of about one wave each, A B B A A B B A ...), turns (each "
            "point whole, in turn) or interleave (all targets at once)."
        ),
    ] = "abba",
    interleave: Annotated[
        bool, typer.Option("--interleave", help="A/B: the same as --schedule interleave.")
    ] = False,
    api_key_file: Annotated[
        Path | None, typer.Option(help="File holding the API key (default: env VLLM_API_KEY).")
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the report JSON on stdout (nothing else there).")
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="FILE", help="Write the report JSON to FILE."),
    ] = None,
    csv_out: Annotated[
        Path | None, typer.Option("--csv", help="Write one row per request.")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="Write PNG plots into DIR.")] = None,
    save_result: Annotated[
        Path | None,
        typer.Option(
            "--save-result",
            metavar="FILE",
            help="One target, one point: write FILE as `vllm bench serve --save-result` does "
            "(flat JSON; its readers load it unchanged). An existing FILE is refused.",
        ),
    ] = None,
) -> None:
    """Send a workload to one or more endpoints and report throughput, latency and interactivity.

    Two targets make an A/B: the same requests go to both in turn; ratios A/B with 95% CIs.
    """
    from kimictl.runtime.load.bench import BenchConfig
    from kimictl.runtime.load.slo import parse_slo

    if stray:
        if len(stray) == 1 and (stray[0] == "-" or stray[0].endswith(".json")):
            raise InputError(
                f"--json takes no value ('{stray[0]}'): it prints the report JSON on stdout; "
                "to write it to a file use --output FILE (-o FILE)."
            )
        raise InputError(
            f"unexpected argument(s) {' '.join(stray)}: bench takes options only "
            "(targets are --target URL)."
        )
    if endpoint not in ("completions", "chat"):
        raise InputError(f"--endpoint {endpoint!r} is not one of: completions, chat")
    for flag, value in (("--num-prompts", num_prompts), ("--repeat", repeat), ("--gpus", gpus)):
        if value is not None and value < 1:
            raise InputError(f"{flag} {value} must be >= 1")
    if warmup is not None and warmup < 0:
        raise InputError(f"--warmup {warmup} must be >= 0")
    if traces_port is not None and not 0 < traces_port < 65536:
        raise InputError(f"--traces-port {traces_port} is not a TCP port; allowed: 1-65535.")
    if duration is not None and duration <= 0:
        raise InputError(f"--duration {duration} must be > 0 seconds")
    if timeout <= 0:
        raise InputError(f"--timeout {timeout} must be > 0 seconds")
    design = _schedule(schedule, interleave)
    if workload not in WORKLOADS:
        raise InputError(f"--workload {workload!r} is not one of: {', '.join(WORKLOADS)}")
    if num_prompts is None and duration is None:
        num_prompts = 50
    wl = _workload(
        workload, input_len, output_len, prefix_len, agentic_config, trace, prompts, replay_speed
    )
    points = _points(concurrency, rate, burstiness, arrivals, workload == "replay")
    slo_obj = parse_slo(slo) if slo else None
    targets = _targets(list(target or []), ab, model, gpus, read_api_key(api_key_file))
    if warmup is None:
        from kimictl.runtime.load.loadgen import default_warmup

        warmup = default_warmup(len(targets), points)
    if save_result is not None:
        _check_save_result(save_result, len(targets), len(points), repeat)
    cfg = BenchConfig(
        targets=tuple(targets),
        workload=wl,
        points=tuple(points),
        num_prompts=num_prompts,
        duration=duration,
        warmup=warmup,
        seed=seed,
        repeat=repeat,
        timeout=timeout,
        chat=endpoint == "chat",
        ignore_eos=ignore_eos,
        scrape_metrics=not no_metrics,
        traces_port=traces_port,
        schedule=design,
        slo=slo_obj,
    )
    outcome = _run(cfg, quiet=json_out)
    _write(outcome, json_out, output, csv_out, plot)
    if save_result is not None and outcome.summaries:
        from kimictl.commands._output import err_console
        from kimictl.runtime.load.vllm_compat import save_result as write_vllm_result

        err_console.print(f"wrote {write_vllm_result(outcome.summaries[0], save_result)}")
    if not json_out:
        from kimictl.commands._render import render_bench

        render_bench(outcome)
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
            hint="each request's error is in the report (--json, -o FILE); see `kimictl logs`",
        )


def _schedule(schedule: str, interleave: bool) -> str:
    from kimictl.runtime.load.records import SCHEDULES

    if schedule not in SCHEDULES:
        raise InputError(f"--schedule {schedule!r} is not one of: {', '.join(SCHEDULES)}")
    if interleave and schedule not in ("abba", "interleave"):
        raise InputError(f"--interleave and --schedule {schedule} ask for two schedules: give one")
    return "interleave" if interleave else schedule


def _check_save_result(path: Path, targets: int, points: int, repeat: int) -> None:
    """Before the run: a vLLM result file holds one (target, point, repeat)."""
    if targets != 1 or points != 1 or repeat != 1:
        raise InputError(
            f"--save-result writes one vLLM result (one target, one point, --repeat 1); this run "
            f"has {targets} target(s), {points} point(s), repeat {repeat}: use --output FILE "
            "for sweeps."
        )
    if path.exists():
        raise InputError(f"--save-result {path}: the file exists; choose a new name.")
    if not path.parent.is_dir():
        raise InputError(f"--save-result {path}: folder {path.parent} does not exist.")


def _run(cfg: Any, *, quiet: bool) -> BenchOutcome:
    import asyncio
    import signal

    from kimictl.commands._render import bench_progress
    from kimictl.runtime.load.bench import resolve_models, run_bench

    progress, on_point, on_record = bench_progress(cfg.num_prompts, cfg.repeat, quiet=quiet)

    async def main() -> BenchOutcome:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, stop.set)
            loop.add_signal_handler(signal.SIGTERM, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
        targets = await resolve_models(cfg.targets)
        from dataclasses import replace

        with progress:
            return await run_bench(
                replace(cfg, targets=tuple(targets)),
                stop=stop,
                on_record=on_record,
                on_point=on_point,
            )

    return asyncio.run(main())


def _write(
    outcome: BenchOutcome,
    json_out: bool,
    output: Path | None,
    csv_out: Path | None,
    plot: Path | None,
) -> None:
    import orjson

    from kimictl.commands._output import err_console
    from kimictl.core.outputs import atomic_write
    from kimictl.runtime.load.exports import write_csv, write_plots

    if json_out or output:
        data = orjson.dumps(
            outcome.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
        )
        if output:
            written = atomic_write(output, data + b"\n")
            err_console.print(f"wrote {written}")
        if json_out:
            import sys

            sys.stdout.write(data.decode() + "\n")
    if csv_out:
        err_console.print(f"wrote {write_csv(outcome.records, csv_out)}")
    if plot:
        for p in write_plots(outcome.summaries, outcome.records, plot, ab=outcome.ab):
            err_console.print(f"wrote {p}")
