"""`kimictl ps`, `kimictl stop`, `kimictl logs`: the servers kimictl launched."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kimictl.commands._options import JsonOpt

if TYPE_CHECKING:
    from kimictl.runtime.serving.launcher import Probed

ps_app = typer.Typer(add_completion=False)
stop_app = typer.Typer(add_completion=False)
logs_app = typer.Typer(add_completion=False)

_STATE_STYLE = {
    "starting": "yellow",
    "ready": "green",
    "stopping": "yellow",
    "stopped": "dim",
    "failed": "bold red",
    "died": "bold red",
    "unhealthy": "bold red",
}


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


@ps_app.command(
    help="List servers kimictl launched (live ones; --all adds stopped, failed and died). "
    "Each is probed, not taken from its record: a run with any process of its deployment gone "
    "is died, a ready one whose /health does not answer 200 is unhealthy. Exit 0."
)
def ps(
    all_runs: Annotated[bool, typer.Option("--all", "-a", help="Include finished runs.")] = False,
    json_out: JsonOpt = False,
) -> None:
    from kimictl.commands._output import console, emit_json
    from kimictl.runtime.serving import launcher, runs

    # a died deployment's leftovers are ended first, so the count shown is what is really left
    found = [runs.end_dead(r) for r in runs.list_runs(include_finished=all_runs)]
    probed = [launcher.probe(r) for r in found]
    if json_out:
        emit_json(
            [
                {
                    **p.record.to_json(),
                    "state": p.state,
                    "alive": p.alive,
                    "health": p.health,
                    "peer_lost": p.peer_lost,
                }
                for p in probed
            ]
        )
        return
    if not probed:
        console.print("no servers" + ("" if all_runs else " running (`kimictl ps --all` for past)"))
        return
    _print_table(probed)
    for p in probed:
        _print_notes(p, all_runs=all_runs)


def _print_table(probed: list[Probed]) -> None:
    from rich.table import Table

    from kimictl.commands._output import console

    table = Table(box=None, pad_edge=False)
    # the ID (what logs/stop take) and the state never shrink, at any width or piped
    table.add_column("ID", no_wrap=True, min_width=max(len(p.record.id) for p in probed))
    for column in ("STATE", "HEALTH"):
        table.add_column(column, no_wrap=True, min_width=len(column) + 2)
    # on a terminal the URL and the model fold onto more lines; piped, nothing wraps: a line per
    # run that a script (or a person copying a URL) can take whole
    piped = not console.is_terminal
    for column in ("URL", "MODEL", "ROLE", "AGE"):
        table.add_column(column, overflow="fold", no_wrap=piped)
    now = time.time()
    for p in probed:
        r = p.record
        table.add_row(
            r.id,
            f"[{_STATE_STYLE.get(p.state, '')}]{p.state}[/]",
            "-" if p.health is None else str(p.health),
            r.url or "-",
            r.model,
            r.role or "-",
            _age(now - r.started_at),
        )
    if piped:  # rich caps a print at the console's width (80 when piped): widen it for this one
        before, console.width = console.width, _natural_width(table)
        console.print(table)
        console.width = before
    else:
        console.print(table)


def _print_notes(p: Probed, *, all_runs: bool) -> None:
    """The lines under the table that say what a run's state means and what to run."""
    from kimictl.commands._output import console

    r = p.record
    if r.reason:
        console.print(f"[dim]{r.id}: {r.reason}[/]", highlight=False)
    if "ray" in r.extra:
        console.print(
            f"[dim]{r.id}: on the Ray cluster at {r.extra['ray']['address']} (`kimictl stop` "
            "ends this deployment, not the cluster)[/]",
            highlight=False,
        )
    if p.state == "died" and not all_runs:
        console.print(
            f"[bold red]{r.id}: died; `kimictl logs {r.id}` shows why, `kimictl stop {r.id}` "
            "acknowledges it (then only `ps --all` lists it)[/]",
            highlight=False,
        )
    if p.peer_lost:
        console.print(
            f"[bold red]{r.id}: {p.peer_lost}; `kimictl stop {r.id}` ends it[/]",
            highlight=False,
        )
    elif p.state == "unhealthy":
        said = "no answer" if p.health is None else f"{p.health}"
        console.print(
            f"[bold red]{r.id}: /health {said}: the engine may have died; "
            f"`kimictl logs {r.id}` shows why, `kimictl stop {r.id}` ends it[/]",
            highlight=False,
        )


def _natural_width(table: Any) -> int:
    from rich.measure import Measurement

    from kimictl.commands._output import console

    unbounded = console.options.update_width(10_000)
    return max(console.width, Measurement.get(console, unbounded, table).maximum)


@stop_app.command(
    help="Stop servers kimictl launched: SIGTERM to the whole process group, SIGKILL after "
    "--grace seconds. Exit 0 stopped, 2 unknown id."
)
def stop(
    run_ids: Annotated[
        list[str] | None, typer.Argument(help="Run id(s) from `kimictl ps`.")
    ] = None,
    all_runs: Annotated[bool, typer.Option("--all", help="Stop every live run.")] = False,
    grace: Annotated[
        float, typer.Option(help="Seconds between SIGTERM and SIGKILL (>= 0).")
    ] = 20.0,
    json_out: JsonOpt = False,
) -> None:
    from kimictl.commands._output import console, emit_json
    from kimictl.core.errors import InputError
    from kimictl.runtime.serving import launcher, runs

    if not grace >= 0:  # also NaN
        raise InputError(f"--grace {grace:g} must be 0 or more seconds (SIGTERM to SIGKILL).")
    if run_ids and all_runs:
        raise InputError("give run ids or --all, not both.")
    if not run_ids and not all_runs:
        raise InputError("name the run(s) to stop (see `kimictl ps`), or pass --all.")
    if all_runs:
        targets = runs.list_runs()  # live ones: starting, ready, stopping, or processes left
    else:
        targets = [runs.get_run(run_id) for run_id in run_ids or []]
    stopped = launcher.stop_records(targets, grace=grace)
    if json_out:
        emit_json([r.to_json() for r in stopped])
        return
    if not stopped:
        console.print("nothing to stop")
    for r in stopped:
        console.print(f"stopped {r.id} ({r.url}); state {r.state.value}", highlight=False)


@logs_app.command(help="Show a launched server's log (the last --tail lines; -f follows it).")
def logs(
    run_id: Annotated[str, typer.Argument(help="Run id from `kimictl ps`.")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines.")
    ] = False,
    tail: Annotated[int, typer.Option(help="Lines to show first (0 = all).")] = 100,
) -> None:
    import sys

    from kimictl.core.errors import InputError
    from kimictl.runtime.serving import launcher, runs
    from kimictl.runtime.serving.startup import log_tail

    record = runs.get_run(run_id)
    try:
        handle = open(record.log_path, "rb")  # kept open while following
    except OSError as error:
        raise InputError(f"log of run {record.id} is gone: {record.log_path}.") from error
    with handle:
        if tail > 0:
            lines = log_tail(record.log_path, tail)
            sys.stdout.write("".join(line + "\n" for line in lines))
            handle.seek(0, 2)
        else:
            sys.stdout.write(handle.read().decode(errors="replace"))
        sys.stdout.flush()
        if not follow:
            return
        with launcher.stop_signals() as stop_flag:
            while not stop_flag():
                chunk = handle.read()
                if chunk:
                    sys.stdout.write(chunk.decode(errors="replace"))
                    sys.stdout.flush()
                    continue
                if not runs.is_alive(record):
                    break  # the server is gone: nothing more will be written
                time.sleep(0.3)
