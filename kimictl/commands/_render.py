"""Rendering shared by several commands (serve, bench, demo): launch progress and plans, the
bench progress bars, the bench summary table and the A/B table. Rich only; no domain logic."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.progress import Progress

    from kimictl.runtime.load.bench import BenchOutcome
    from kimictl.runtime.load.records import LoadPoint, LoadTarget
    from kimictl.runtime.serving.launcher import Launch
    from kimictl.runtime.serving.plan import LaunchPlan
    from kimictl.runtime.serving.workflow import Prepared

__all__ = [
    "bench_progress",
    "phase_printer",
    "print_gate",
    "print_notes",
    "print_plan",
    "render_ab",
    "render_bench",
]

# ---------------------------------------------------------------- serve: gate, plans, start-up

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "unknown": "magenta"}


def print_notes(prepared: Prepared) -> None:
    from rich.markup import escape

    from kimictl.commands._output import console

    for note in prepared.notes:  # notes quote profile tables ("[serve]"): not markup
        console.print(f"[cyan]note:[/] {escape(note)}", highlight=False, soft_wrap=True)


def print_gate(prepared: Prepared) -> None:
    from rich.markup import escape

    from kimictl.commands._output import console

    shown = [c for c in prepared.checks if c.status.value != "pass"]
    passed = len(prepared.checks) - len(shown)
    console.print(f"gate: {passed} of {len(prepared.checks)} checks pass")
    for check in shown:
        style = _STYLE.get(check.status.value, "")
        line = f"  [{style}]{check.status.value:7}[/] {escape(check.message)}"
        if check.remedy:
            line += f" [dim]-> {escape(check.remedy)}[/]"
        console.print(line)
    if prepared.blocking and prepared.forced:
        console.print(
            f"[bold yellow]--force: launching despite {len(prepared.blocking)} failure(s)"
        )


def print_plan(plan: LaunchPlan, *, with_env: bool = True) -> None:
    from kimictl.commands._output import console, print_command

    role = f" ({plan.role})" if plan.role else ""
    console.print(f"[bold]{plan.name}{role}[/] -> {plan.url}  model {plan.model}", highlight=False)
    for key, value in plan.redacted_env().items() if with_env else ():
        console.print(f"  {key}={shlex.quote(value)}", highlight=False, soft_wrap=True)
    from kimictl.deployment.buckets import summarise_argv

    shown = summarise_argv(plan.redacted_argv())  # the exact argv: --dry-run --json
    console.print("  " + shlex.join(shown), highlight=False, markup=False, soft_wrap=True)
    if shown != plan.redacted_argv():
        console.print("  (bucket list summarised; `--dry-run --json` has the exact argv)")
    if plan.nice:
        note = f"  at nice {plan.nice}: clients on this machine keep their CPU"
        console.print(note, highlight=False)
    for argv in plan.other_node_commands:  # one shlex-quoted line each, never markup
        print_command(f"  on node rank {argv[argv.index('--node-rank') + 1]}: ", argv)


def phase_printer(quiet: bool):  # type: ignore[no-untyped-def]
    from kimictl.commands._output import err_console

    def on_phase(launch: Launch, phase: str, elapsed: float) -> None:
        if quiet:
            return
        role = f" ({launch.plan.role})" if launch.plan.role else ""
        err_console.print(
            f"  [dim]{elapsed:6.1f}s[/] {launch.plan.name}{role}: {phase}", highlight=False
        )

    return on_phase


# ---------------------------------------------------------------- bench: progress, tables


def bench_progress(
    num_prompts: int | None, repeat: int, *, quiet: bool
) -> tuple[Progress, Callable[[LoadTarget, LoadPoint, int], None], Callable[[Any], None]]:
    """A rich Progress on stderr with one bar per (target, point, repeat), and the `on_point` and
    `on_record` callbacks that `run_bench` drives it with."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kimictl.commands._output import err_console

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet,
        transient=False,
    )
    tasks: dict[tuple[str, str, int], Any] = {}

    def on_point(t: LoadTarget, p: LoadPoint, r: int) -> None:
        rep = f" repeat {r + 1}/{repeat}" if repeat > 1 else ""
        tasks[(t.name, p.label, r)] = progress.add_task(
            f"{t.name} {p.label}{rep}", total=num_prompts, failed=0
        )

    def on_record(rec: Any) -> None:
        task = tasks.get((rec.target, rec.point, rec.repeat))
        if rec.warmup or task is None:
            return
        progress.advance(task)
        if not rec.ok and rec.error_kind != "cancelled":
            progress.update(task, failed=progress.tasks[task].fields["failed"] + 1)

    return progress, on_point, on_record


def _f(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _k(key: str) -> Any:
    return lambda s: s[key]


def _i(key: str) -> Any:
    return lambda s: s["kimictl"]["interactivity_tok_s_per_user"][key]


def _sv(key: str) -> Any:
    return lambda s: (s["kimictl"]["server_view"] or {}).get(key)


def _errors(s: dict[str, Any]) -> str:
    kinds = dict(s["kimictl"]["errors_by_kind"])
    if s["kimictl"]["cancelled"]:
        kinds["cancelled"] = s["kimictl"]["cancelled"]
    return ", ".join(f"{k} {v}" for k, v in kinds.items()) or "-"


_ROWS: tuple[tuple[str, Any, int], ...] = (
    ("completed / failed", lambda s: f"{s['completed']} / {s['failed']}", 0),
    ("duration s", _k("duration"), 1),
    ("requests/s", _k("request_throughput"), 2),
    ("output tokens/s", _k("output_throughput"), 1),
    ("output tokens/s/GPU", lambda s: s["kimictl"]["output_throughput_per_gpu"], 1),
    ("tok/s/user p10 (slow tail)", _i("p10_slow_tail"), 1),
    ("tok/s/user p50", _i("p50"), 1),
    ("tok/s/user p90 (fast tail)", _i("p90_fast_tail"), 1),
    ("TTFT mean ms", _k("mean_ttft_ms"), 1),
    ("TTFT p99 ms", _k("p99_ttft_ms"), 1),
    ("TPOT mean ms", _k("mean_tpot_ms"), 2),
    ("TPOT median ms", _k("median_tpot_ms"), 2),
    ("TPOT p90 ms", _k("p90_tpot_ms"), 2),
    ("ITL mean ms", _k("mean_itl_ms"), 2),
    ("ITL p99 ms", _k("p99_itl_ms"), 2),
    ("E2E latency mean ms", _k("mean_e2el_ms"), 1),
    ("E2E latency p90 ms", _k("p90_e2el_ms"), 1),
    ("goodput requests/s (SLO)", _k("request_goodput"), 2),
    ("SLO met", lambda s: (s["kimictl"].get("slo") or {}).get("met"), 0),
    ("errors", _errors, 0),
    ("server: output tokens/s", _sv("tokens_per_s"), 1),
    ("server: TPOT p50 ms", _sv("tpot_p50_ms"), 2),
    ("server: TPOT p90 ms", _sv("tpot_p90_ms"), 2),
    ("server: TTFT p50 ms", _sv("ttft_p50_ms"), 1),
    ("server: TTFT p99 ms", _sv("ttft_p99_ms"), 1),
    # vLLM writes the spec_decode_* keys only when the server drafted
    ("spec acceptance length", lambda s: s.get("spec_decode_acceptance_length"), 2),
    ("spec acceptance %", lambda s: s.get("spec_decode_acceptance_rate"), 1),
    ("client: loop lag p50 ms", lambda s: s["kimictl"].get("client_lag_ms_p50"), 2),
    ("client: loop lag p99 ms", lambda s: s["kimictl"].get("client_lag_ms_p99"), 2),
    ("client: start lag p99 ms", lambda s: s["kimictl"].get("client_start_lag_ms_p99"), 2),
    ("client: CPU us/token", lambda s: s["kimictl"].get("client_cpu_us_per_token"), 1),
)
# Client-timed rows that a starved client makes up (clientlag.py): hidden when it warns.
_CLIENT_TIMED = ("tok/s/user", "TTFT", "TPOT", "ITL")


def render_bench(outcome: BenchOutcome) -> None:
    from rich.table import Table

    from kimictl.commands._output import console

    summaries = outcome.summaries
    if not summaries:
        console.print("no measured request finished")
        return
    table = Table(
        title="kimictl bench (client view; server view from /metrics deltas)", title_justify="left"
    )
    table.add_column("metric", no_wrap=True)
    for s in summaries:
        k = s["kimictl"]
        rep = f" #{k['repeat'] + 1}" if any(x["kimictl"]["repeat"] for x in summaries) else ""
        table.add_column(f"{k['target']}\n{k['point']}{rep}", justify="right")
    starved = [bool(s["kimictl"].get("client_warning")) for s in summaries]
    for label, get, digits in _ROWS:
        hide = label.startswith(_CLIENT_TIMED)
        cells = [
            "[yellow]unreliable[/]" if hide and bad else _f(get(s), digits)
            for s, bad in zip(summaries, starved, strict=True)
        ]
        table.add_row(label, *cells)
    console.print(table)
    for s in summaries:
        k = s["kimictl"]
        if k.get("client_warning"):
            console.print(
                f"[yellow]warning[/] {k['target']} {k['point']}: {k['client_warning']}",
                highlight=False,
            )
        if k.get("client_note"):
            console.print(f"note {k['target']} {k['point']}: {k['client_note']}", highlight=False)
    if outcome.ab:
        render_ab(outcome)
    console.print(
        "[dim]tok/s/user = interactivity = 1/TPOT per request; p10 is the slow tail "
        "(= 1000 / TPOT p90 ms), p90 the fast tail. server: = /metrics deltas over the point "
        "(histogram buckets, coarse); '-' = not reported (spec acceptance: no speculation).[/dim]"
    )


def render_ab(outcome: BenchOutcome, *, show_verdict: bool = True) -> None:
    from rich.table import Table

    from kimictl.commands._output import console
    from kimictl.runtime.load.ab import (
        ALPHA,
        NOT_DISTINGUISHABLE,
        NOT_MEASURED,
        single_run_caveat,
    )

    assert outcome.ab is not None
    a = outcome.summaries[0]["kimictl"]["target"]
    names = [s["kimictl"]["target"] for s in outcome.summaries]
    b = next((n for n in names if n != a), a)
    for point in dict.fromkeys(r["point"] for r in outcome.ab):
        rows = [r for r in outcome.ab if r["point"] == point]
        table = Table(
            title=f"A/B at {point}: {a} vs {b} (ratio {a}/{b}, 95% bootstrap CI; better: "
            f"p < {ALPHA}, secondary metrics Holm-adjusted)",
            title_justify="left",
        )
        for col in ("metric", a, b, "ratio", "95% CI", "p (Holm)", "better"):
            table.add_column(col, justify="left" if col == "metric" else "right")
        head = None
        for r in sorted(rows, key=lambda r: r.get("role") != "primary"):
            ci = r["ci95"]
            better = r["better"] or "-"
            color = "green" if r["better"] == a else ("red" if r["better"] == b else "")
            primary = r.get("role") == "primary"
            p_adj = r.get("p_adjusted")
            table.add_row(
                f"[bold]{r['metric']}[/] (primary)" if primary else r["metric"],
                _f(r[a], 2),
                _f(r[b], 2),
                "-" if r["ratio"] is None else f"{r['ratio']:.3f}",
                "-" if ci is None else f"{ci[0]:.3f}-{ci[1]:.3f}",
                "-" if p_adj is None else f"{p_adj:.3f}",
                f"[{color}]{better}[/]" if color else better,
                end_section=primary,
            )
            if primary:
                head = r
        console.print(table)
        if head is not None and show_verdict:
            verdict = head["verdict"]
            plain = verdict in (NOT_DISTINGUISHABLE, NOT_MEASURED)
            said = verdict if plain else f"{a} is {verdict}"
            console.print(
                f"verdict at {point} ({head['metric']}): [bold]{said}[/bold]", highlight=False
            )
            repeats = {s["kimictl"].get("repeat", 0) for s in outcome.summaries}
            caveat = single_run_caveat(verdict, len(repeats))
            if caveat:
                console.print(f"  note: {caveat}", highlight=False, markup=False)
