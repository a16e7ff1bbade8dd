"""`kimictl validate`: may the candidate deployment take traffic? Five checks vs a reference."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kimictl.commands._options import ApiKeyFileOpt, JsonOpt
from kimictl.commands._output import console, emit_json, err_console
from kimictl.core.apikeys import read_api_key
from kimictl.core.errors import CheckFailed, InputError, WriteFailed
from kimictl.runtime.evals.plan import CHECKS, parse_checks

if TYPE_CHECKING:
    from kimictl.runtime.evals.report import CheckResult, ValidationReport
    from kimictl.runtime.serving.runs import Target

app = typer.Typer(add_completion=False)


def _targets(candidate: str | None, reference: str | None) -> tuple[Target, Target]:
    from kimictl.runtime.serving.runs import ab_targets, resolve_target

    if candidate is None and reference is None:
        return ab_targets(
            ("candidate", "reference"),
            missing="no --candidate/--reference given and no live A/B pair launched by kimictl",
            hint="start one with `kimictl serve --ab`, or pass --candidate URL --reference URL",
        )
    if candidate is None or reference is None:
        missing = "--candidate" if candidate is None else "--reference"
        raise InputError(
            f"{missing} is missing: give both --candidate and --reference (URL or run id), "
            "or neither to use the latest `kimictl serve --ab` pair"
        )
    return resolve_target(candidate), resolve_target(reference)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _style(check: CheckResult) -> str:
    return "green" if check.passed else "yellow" if check.status.value == "skip" else "red"


def _render_check(check: CheckResult) -> None:
    from rich.table import Table

    style = _style(check)
    console.print(
        f"\n[bold]{check.name}[/] [{style}]{check.status.value.upper()}[/]  {check.summary}"
    )
    for failure in check.failures:
        console.print(f"  [red]x[/] {failure}")
    if check.thresholds:
        console.print(
            "  thresholds: " + ", ".join(f"{k} {_fmt(v)}" for k, v in check.thresholds.items()),
            highlight=False,
        )
    bands = check.metrics.get("bands")
    if bands:
        table = Table(box=None, padding=(0, 2), show_edge=False)
        for col in ("band (positions)", "tokens", "mean |dlogprob|", "max |dlogprob|"):
            table.add_column(col, justify="right")
        for row in bands:
            table.add_row(
                row["band"],
                str(row["positions"]),
                f"{row['mean_abs_dlogprob']:.4g}",
                f"{row['max_abs_dlogprob']:.4g}",
            )
        console.print(table)
    for line in check.evidence:
        console.print(f"  - {line}", highlight=False)


def _render(report: ValidationReport) -> None:
    from rich.table import Table

    for role, info in (("candidate", report.candidate), ("reference", report.reference)):
        console.print(
            f"{role}  {info.name}  {info.url}  model {info.model} "
            f"(max context {info.max_model_len})",
            highlight=False,
        )
    table = Table(title=f"kimictl validate ({report.mode})", show_lines=False)
    table.add_column("check")
    table.add_column("result")
    table.add_column("numbers")
    table.add_column("s", justify="right")
    for check in report.checks:
        style = _style(check)
        table.add_row(
            check.name,
            f"[{style}]{check.status.value.upper()}[/]",
            check.summary,
            f"{check.seconds:.0f}",
        )
    console.print(table)
    for check in report.checks:
        _render_check(check)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    verdict = (
        "[green]PASS[/]: the candidate may take traffic"
        if report.passed
        else ("[red]FAIL[/]: the candidate must not take traffic")
    )
    if report.passed and report.skipped:
        skipped = ", ".join(c.name for c in report.skipped)
        verdict += f" [yellow](not checked at this context: {skipped})[/]"
    console.print(f"\nverdict: {verdict} ({report.seconds:.0f} s)")


CandidateOpt = Annotated[
    str | None, typer.Option("--candidate", help="Candidate endpoint: URL, NAME=URL or run id.")
]
ReferenceOpt = Annotated[
    str | None,
    typer.Option("--reference", help="Reference (stock) endpoint: URL, NAME=URL or run id."),
]
ChecksOpt = Annotated[
    str | None,
    typer.Option("--checks", help=f"Comma-separated subset of: {', '.join(CHECKS)}."),
]
QuickOpt = Annotated[
    bool, typer.Option("--quick", help="Fewer prompts and samples (about 2x faster).")
]
GateOpt = Annotated[
    str | None,
    typer.Option(
        "--gate", help="Write verdict, date and evidence into this profile's \\[provenance]."
    ),
]
ThresholdOpt = Annotated[
    list[str] | None,
    typer.Option("--threshold", help="Override a threshold: NAME=VALUE (repeatable)."),
]
SaveResponsesOpt = Annotated[
    Path | None,
    typer.Option("--save-responses", help="Also write every raw response to this JSON file."),
]


@app.command()
def validate(
    candidate: CandidateOpt = None,
    reference: ReferenceOpt = None,
    checks: ChecksOpt = None,
    quick: QuickOpt = False,
    json_out: JsonOpt = False,
    gate: GateOpt = None,
    threshold: ThresholdOpt = None,
    save_responses: SaveResponsesOpt = None,
    api_key_file: ApiKeyFileOpt = None,
) -> None:
    """Compare a candidate deployment with a reference serving the same model: greedy agreement,
    long-context numerics and retrieval, temperature sampling, structured output, full context.
    Exit 0 when every check passes, 1 when one fails, 2 on bad input."""
    from kimictl.runtime.evals.plan import Thresholds
    from kimictl.runtime.evals.report import provenance_updates

    chosen = parse_checks(checks)
    limits = Thresholds().with_overrides(threshold or [])
    profile_path = None
    if gate is not None:
        from kimictl.deployment.profiles import load_profile

        profile_path = load_profile(gate).path  # bad profile name: InputError before any request
    if save_responses is not None:
        from kimictl.core.outputs import check_new_file

        check_new_file(save_responses, flag="--save-responses", forceable=False)
    capture: dict[str, object] | None = {} if save_responses is not None else None
    report = _run(
        _targets(candidate, reference),
        read_api_key(api_key_file),
        quiet=json_out,
        checks=chosen,
        quick=quick,
        thresholds=limits,
        capture=capture,
    )
    lost = _save_responses(save_responses, report, capture)
    if profile_path is not None:
        from kimictl.deployment.profile_writer import update_provenance

        update_provenance(profile_path, provenance_updates(report))
    if json_out:
        emit_json(report.to_json())
    else:
        _render(report)
        if profile_path is not None:
            console.print(
                f"wrote validation = {report.verdict!r} into {profile_path} \\[provenance]",
                highlight=False,
            )
    if lost is not None:
        raise lost
    if not report.passed:
        failed = [c.name for c in report.checks if c.status.value in ("fail", "error")]
        if not failed:
            raise CheckFailed(
                "validation proved nothing: every check was skipped at this context",
                hint="the report above says what each check needs; serve a longer max_model_len",
            )
        raise CheckFailed(
            f"validation failed: {', '.join(failed)}",
            hint="the report above names each threshold and the evidence",
        )


def _run(
    targets: tuple[Target, Target], key: str | None, *, quiet: bool, **options: Any
) -> ValidationReport:
    """The checks against (candidate, reference), with a status line naming the running check
    unless `quiet` (--json)."""
    from kimictl.runtime.evals.client import Endpoint
    from kimictl.runtime.evals.runner import run_validation

    cand, ref = targets
    with (
        Endpoint(cand.url, name=cand.name, model=cand.model, api_key=key) as cand_ep,
        Endpoint(ref.url, name=ref.name, model=ref.model, api_key=key) as ref_ep,
    ):
        if quiet:
            return run_validation(cand_ep, ref_ep, **options)
        with err_console.status("validating") as status:
            return run_validation(
                cand_ep,
                ref_ep,
                progress=lambda name: status.update(f"validate: running {name}"),
                **options,
            )


def _save_responses(path: Path | None, report: Any, capture: object) -> WriteFailed | None:
    """Write --save-responses (never over a file); a failed write is kept and returned."""
    if path is None:
        return None
    import json

    from kimictl.core.outputs import save_or_keep

    data = json.dumps({"report": report.to_json(), "responses": capture})
    try:
        save_or_keep(path, data, flag="--save-responses")
    except WriteFailed as error:
        return error
    return None
