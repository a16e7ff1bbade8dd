"""`kimictl doctor`: is this cluster, and this deployment, ready for the K3 fast path?"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kimictl.commands._options import JsonOpt
from kimictl.core.errors import CheckFailed, InputError
from kimictl.core.jsondoc import dumps

if TYPE_CHECKING:
    from kimictl.deployment.spec import DeploymentSpec
    from kimictl.runtime.checks.rules import Diagnosis

app = typer.Typer(add_completion=False)


def _spec_from(
    profile: str | None, vllm_args: str | None
) -> tuple[DeploymentSpec | None, list[str]]:
    if profile and vllm_args:
        raise InputError("--profile and --vllm-args both given; pass one of them.")
    if profile:
        try:
            from kimictl.deployment.profiles import load_profile
        except ImportError:
            raise InputError(
                f"--profile {profile}: profiles are not available in this kimictl build.",
                hint='pass the launch command instead: --vllm-args "vllm serve ..."',
            ) from None
        return load_profile(profile).spec, []
    if vllm_args is not None:
        if not vllm_args.strip():
            raise InputError(
                '--vllm-args is empty; pass a command such as "vllm serve MODEL -tp 8".'
            )
        from kimictl.deployment.vllm_args import parse_vllm_command

        parsed = parse_vllm_command(vllm_args)
        return parsed.spec, list(parsed.unrecognised)
    return None, []


def _inventory(diagnosis: Diagnosis) -> list[str]:
    from kimictl.runtime.checks.hardware import Unavailable

    lines = []
    hw = diagnosis.hardware
    if hw.source != "live":
        lines.append(f"[dim]source: {hw.source} snapshot ({len(hw.nodes)} node(s))[/dim]")
    for node in hw.nodes:
        if node.no_driver_reason is not None:
            lines.append(f"{node.hostname}: {node.no_driver_reason}")
            continue
        models: dict[str, int] = {}
        for gpu in node.gpus:
            if gpu.lost is not None:
                key = "lost GPU"
            else:
                cc = gpu.compute_capability
                arch = f"SM{cc[0]}{cc[1]}" if not isinstance(cc, Unavailable) else "SM?"
                mem = gpu.memory_total_mib
                gib = f", {mem / 1024:.0f} GiB" if isinstance(mem, int) else ""
                key = f"{gpu.name} ({arch}{gib})"
            models[key] = models.get(key, 0) + 1
        gpus = ", ".join(f"{n} x {k}" for k, n in models.items()) or "no GPU"
        lines.append(
            f"{node.hostname}: driver {node.driver_version}, "
            f"CUDA {node.cuda_driver_version}, {gpus}"
        )
    return lines


def _render(diagnosis: Diagnosis) -> None:
    from kimictl.commands._checks import print_check
    from kimictl.commands._output import console
    from kimictl.runtime.checks.rules import Section

    for section in Section:
        console.print(f"\n[bold]{section.value}[/bold]")
        if section is Section.HARDWARE:
            for line in _inventory(diagnosis):
                console.print(f"  {line}", highlight=False, soft_wrap=True)
        checks = [c for c in diagnosis.checks if c.section is section]
        if not checks:
            console.print("  [dim]not checked: no usable GPU[/dim]")
        for check in checks:
            print_check(check)
    if diagnosis.saved_to is not None:
        console.print(f"\nSnapshot saved to {diagnosis.saved_to}", highlight=False, soft_wrap=True)
    console.print()
    if diagnosis.verdict == "ready":
        console.print("Fast path: [bold green]READY[/]")
    else:
        console.print(f"Fast path: [bold red]NOT READY[/] ({diagnosis.blocking} blocking)")


@app.command(
    help="Check GPUs, NVLink fabric, multicast, the software stack and a deployment's flags "
    "against the K3 latency-specialized decode path. Exit 0 ready, 1 not ready, 2 bad input."
)
def doctor(
    profile: Annotated[
        str | None, typer.Option("--profile", metavar="FILE|NAME", help="Profile to check.")
    ] = None,
    vllm_args: Annotated[
        str | None,
        typer.Option(
            "--vllm-args",
            metavar="CMD",
            help='An existing launch line: "VAR=1 vllm serve MODEL ...".',
        ),
    ] = None,
    from_snapshot: Annotated[
        list[Path] | None,
        typer.Option(
            "--from-snapshot",
            metavar="FILE",
            help="Check recorded snapshot(s) instead of this machine; repeat once per node.",
        ),
    ] = None,
    save_snapshot: Annotated[
        Path | None,
        typer.Option("--save-snapshot", metavar="FILE", help="Write the hardware report as JSON."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing --save-snapshot file.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    from kimictl.runtime.checks.rules import diagnose

    spec, unrecognised = _spec_from(profile, vllm_args)
    diagnosis = diagnose(
        spec,
        snapshots=from_snapshot or [],
        save_snapshot=save_snapshot,
        overwrite_snapshot=force,
        unrecognised=unrecognised,
    )
    if spec is not None:
        from kimictl.runtime.tuning.bucket_check import histogram_bucket_check

        diagnosis.checks.append(histogram_bucket_check(spec))
    if json_out:
        # Same document emit_json writes, without importing rich (its import is ~15% of the
        # command's start-up; --json is what scripts and the startup benchmark call).
        payload: dict[str, Any] = diagnosis.to_json()
        sys.stdout.write(dumps(payload).decode())
    else:
        _render(diagnosis)
    if diagnosis.verdict != "ready":
        # CheckFailed is exit 1; cli.py prints its one line on stderr (stdout stays the report).
        raise CheckFailed(f"the K3 fast path is not ready: {diagnosis.blocking} blocking check(s)")
