"""`kimictl profiles list | show NAME | validate FILE | diff A B`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kimictl.commands._options import JsonOpt

if TYPE_CHECKING:
    from kimictl.deployment.profiles import Profile
    from kimictl.runtime.checks.rules.base import Check

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="List, show, validate and diff deployment profiles (TOML).",
)


def _shape(profile: Profile) -> str:
    spec = profile.spec
    parts = [f"TP{spec.tensor_parallel_size}"]
    if spec.decode_context_parallel_size > 1:
        parts.append(f"DCP{spec.decode_context_parallel_size}")
    if spec.pipeline_parallel_size > 1:
        parts.append(f"PP{spec.pipeline_parallel_size}")
    if spec.data_parallel_size > 1:
        parts.append(f"DP{spec.data_parallel_size}")
    return " ".join(parts)


def _draft(profile: Profile) -> str:
    method = profile.spec.speculative_method
    return f"{method} x{profile.spec.num_speculative_tokens}" if method else "-"


@app.command("list", help="List the profiles kimictl finds (shipped and your own).")
def list_(json_out: JsonOpt = False) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from kimictl.commands._output import console, emit_json, fits
    from kimictl.deployment import k3
    from kimictl.deployment.profiles import profile_dirs, scan_profiles

    good, bad = scan_profiles()
    if json_out:
        emit_json(
            {
                "profiles": [
                    {
                        "name": p.name,
                        "path": str(p.path),
                        "runtime": p.runtime,
                        "description": p.description,
                        "stock_twin": p.stock_twin,
                        "decode_backend": p.spec.decode_backend,
                    }
                    for p in good
                ],
                "invalid": [
                    {"name": b.name, "path": str(b.path), "error": b.error.message} for b in bad
                ],
                "search_path": [str(d) for d in profile_dirs()],
            }
        )
        return
    rows = [
        (
            p.name,
            p.runtime,
            _shape(p),
            _draft(p),
            p.spec.decode_backend.replace(k3.DECODE_BACKEND_SPECIALIZED, "specialized"),
            p.stock_twin or "",
        )
        for p in good
    ]
    table = Table(title="Profiles", title_justify="left")
    for header in ("name", "runtime", "shape", "draft", "decode", "stock twin"):
        table.add_column(header, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    if not fits(table):  # e.g. 80 columns: no frame, and the twin on a line under the name
        table = Table(title="Profiles", title_justify="left", box=box.SIMPLE_HEAD)
        for header in ("name (stock twin)", "runtime", "shape", "draft", "decode"):
            table.add_column(header, overflow="fold")
        for name, *middle, twin in rows:
            table.add_row(name + (f"\n  [dim]{twin}[/dim]" if twin else ""), *middle)
    console.print(table)
    for b in bad:
        console.print(
            f"[red]invalid[/] {escape(b.name)}: {escape(b.error.message)}",
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        "[dim]search path: " + ", ".join(str(d) for d in profile_dirs()) + "[/dim]",
        highlight=False,
    )


@app.command(help="Show a profile: its launch command, environment, intent and provenance.")
def show(
    name: Annotated[str, typer.Argument(metavar="NAME|FILE", help="Profile name or .toml path.")],
    json_out: JsonOpt = False,
) -> None:
    from rich.markup import escape

    from kimictl.commands._output import console, emit_json
    from kimictl.deployment.profiles import load_profile
    from kimictl.runtime.checks.rules.deployment import fast_path_coverage

    profile = load_profile(name)
    coverage = fast_path_coverage(profile.spec)
    if json_out:
        payload = profile.to_json()
        payload["coverage"] = coverage.to_json()
        emit_json(payload)
        return
    console.print(
        f"[bold]{escape(profile.name)}[/bold]  [dim]{profile.path}[/dim]", highlight=False
    )
    if profile.description:
        console.print(escape(profile.description), highlight=False)
    console.print(f"runtime: {profile.runtime}   stock twin: {profile.stock_twin or '-'}")
    console.print(
        f"shape: {_shape(profile)}, draft: {_draft(profile)}, "
        f"decode_backend: {profile.spec.decode_backend}, "
        f"{len(coverage.fast_requests)} of {coverage.steps_checked} step sizes on the "
        f"prepared batches (q = {coverage.q})",
        highlight=False,
        soft_wrap=True,
    )
    console.print("\n[bold]Launch[/bold]")
    console.print(escape(profile.spec.to_command()), highlight=False, soft_wrap=True)
    if profile.provenance:
        console.print("\n[bold]Provenance[/bold]")
        for key, value in profile.provenance.items():
            console.print(f"  {escape(key)}: {escape(str(value))}", highlight=False, soft_wrap=True)


def _validate_checks(profile: Profile, snapshots: list[Path]) -> list[Check]:
    from kimictl.runtime.checks.rules.deployment import deployment_checks

    hw = None
    if snapshots:
        from kimictl.runtime.checks.hardware import load_snapshots

        hw = load_snapshots(snapshots)
    return deployment_checks(profile.spec, hw)


@app.command(
    help="Check a profile file: schema (exit 2 on a bad key or value), then the K3 fast-path "
    "deployment rules for GPU profiles (exit 1 when one fails)."
)
def validate(
    file: Annotated[str, typer.Argument(metavar="FILE|NAME", help="Profile .toml or name.")],
    from_snapshot: Annotated[
        list[Path] | None,
        typer.Option(
            "--from-snapshot",
            metavar="FILE",
            help="Check against recorded hardware snapshot(s), one per node.",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    from kimictl.commands._checks import print_check
    from kimictl.commands._output import console, emit_json
    from kimictl.deployment.profiles import load_profile
    from kimictl.runtime.checks.rules.base import verdict
    from kimictl.runtime.serving.render import render_checks

    profile = load_profile(file)
    cpu = profile.runtime == "cpu"
    checks = [] if cpu else _validate_checks(profile, from_snapshot or [])
    checks += render_checks(profile)  # the rules `serve --render` refuses by
    result = verdict(checks)
    if json_out:
        payload: dict[str, Any] = {
            "profile": profile.name,
            "path": str(profile.path),
            "schema": "ok",
            "runtime": profile.runtime,
            "verdict": result,
            "checks": [c.to_json() for c in checks],
        }
        if cpu:
            payload["note"] = "runtime cpu: there is no specialized decode path on CPU"
        emit_json(payload)
    else:
        console.print(f"{profile.path}: schema OK", highlight=False)
        if cpu:
            console.print(
                "runtime cpu: the K3 fast-path rules do not apply (no specialized decode on CPU)."
            )
        for check in checks:
            print_check(check)
        if not cpu:
            blocking = sum(1 for c in checks if c.blocking)
            console.print(
                "Deployment rules: [bold green]PASS[/]"
                if result == "ready"
                else f"Deployment rules: [bold red]FAIL[/] ({blocking} blocking)"
            )
    if result != "ready":
        from kimictl.core.errors import CheckFailed

        # exit 1 with one line on stderr, as doctor does (stdout stays the report)
        blocking = sum(1 for c in checks if c.blocking)
        raise CheckFailed(
            f"profile {profile.name} breaks the K3 fast-path rules: {blocking} blocking check(s)."
        )


@app.command(help="Show what differs between two profiles (field by field).")
def diff(
    a: Annotated[str, typer.Argument(metavar="A", help="Profile name or .toml path.")],
    b: Annotated[str, typer.Argument(metavar="B", help="Profile name or .toml path.")],
    json_out: JsonOpt = False,
) -> None:
    from rich.markup import escape
    from rich.table import Table

    from kimictl.commands._output import console, emit_json
    from kimictl.deployment.profiles import diff_profiles, load_profile

    left, right = load_profile(a), load_profile(b)
    rows = diff_profiles(left, right)
    if json_out:
        emit_json(
            {
                "a": left.name,
                "b": right.name,
                "differences": [{"field": f, "a": x, "b": y} for f, x, y in rows],
            }
        )
        return
    if not rows:
        console.print(f"{left.name} and {right.name} describe the same deployment.")
        return
    table = Table(title=f"{left.name} vs {right.name}", title_justify="left")
    table.add_column("field", overflow="fold")  # long dotted keys wrap, never cut
    table.add_column(left.name, overflow="fold")
    table.add_column(right.name, overflow="fold")
    for field_name, x, y in rows:
        table.add_row(field_name, escape(_cell(x)), escape(_cell(y)))
    console.print(table)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)
