"""`kimictl serve`: launch vLLM with a profile (one node, many, or a tuned/stock A/B pair)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from kimictl.runtime.serving.runs import RunRecord

app = typer.Typer(add_completion=False)


def _ready_printer(detach: bool, quiet: bool):  # type: ignore[no-untyped-def]
    from kimictl.commands._output import console

    def on_ready(records: list[RunRecord]) -> None:
        if quiet:
            return
        for record in records:
            took = (record.ready_at or time.time()) - record.started_at
            role = f" ({record.role})" if record.role else ""
            console.print(
                f"[bold green]ready[/] {record.id}{role}: {record.url}  model {record.model}  "
                f"({took:.1f} s)",
                highlight=False,
            )
        ids = " ".join(r.id for r in records)
        monitor = " ".join(r.id for r in records)
        console.print(f"monitor: kimictl monitor {monitor}", highlight=False)
        if len(records) == 2 and records[0].ab_group:
            console.print("bench:   kimictl bench --ab", highlight=False)
        if detach:
            console.print(f"stop:    kimictl stop {ids}   logs: kimictl logs {records[0].id}")
        else:
            console.print("Ctrl-C (or SIGTERM) stops the server(s).")

    return on_ready


@app.command(
    help="Launch vLLM with a profile. Runs the doctor gate first (refuses on any blocking check "
    "unless --force). With no GPU and no profile, serves the embedded CPU demo (cpu-demo). "
    "Exit 0 ok / stopped cleanly, 1 refused or died, 2 bad input."
)
def serve(
    profile: Annotated[
        str | None, typer.Argument(help="Profile name or .toml file (see `kimictl profiles list`).")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Override the profile's model (folder or hub id).")
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Bind address (default 127.0.0.1; others need a key).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port (A/B: the stock twin gets PORT+1).")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Print env and argv (key redacted) and exit (1 if the gate blocks)."
        ),
    ] = False,
    detach: Annotated[
        bool, typer.Option("--detach", help="Leave it running once ready; see `kimictl ps`.")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Launch despite failing checks.")] = False,
    nnodes: Annotated[int, typer.Option(help="Nodes of one deployment (vLLM mp backend).")] = 1,
    node_rank: Annotated[int, typer.Option(help="This node's rank (0 serves the API).")] = 0,
    master_addr: Annotated[
        str | None, typer.Option(help="Address of node rank 0 (with --nnodes > 1).")
    ] = None,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Serve through a running Ray cluster ($RAY_ADDRESS, else the one `ray start` "
            "started here); CPU runtime: after `kimictl setup cpu-runtime --ray`.",
        ),
    ] = False,
    render: Annotated[
        str | None, typer.Option(help="Write a cluster job instead: slurm | k8s.")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="--render: write to FILE (default stdout)."),
    ] = None,
    ab: Annotated[
        bool, typer.Option("--ab", help="Start the profile and its stock twin (A/B pair).")
    ] = False,
    api_key_file: Annotated[
        Path | None, typer.Option(help="File holding the API key (else $VLLM_API_KEY).")
    ] = None,
    api_key_secret: Annotated[
        str | None,
        typer.Option(help="--render k8s: read the key from this existing Secret (key 'key')."),
    ] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Allow a non-loopback bind without an API key.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for readiness (> 0).")] = 900.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    traces: Annotated[
        str | None,
        typer.Option(
            help="Send one trace span per finished request: kimictl (to `kimictl monitor` on "
            "this host), off, or an OTLP/HTTP URL; default: the profile's [metrics] traces."
        ),
    ] = None,
) -> None:
    from kimictl.commands._output import console, emit_json
    from kimictl.commands._render import phase_printer, print_gate, print_notes, print_plan
    from kimictl.core.errors import InputError
    from kimictl.runtime.serving import workflow

    if not timeout > 0:  # also NaN
        raise InputError(f"--timeout {timeout:g} must be more than 0 seconds (the readiness wait).")
    if render is not None and render not in ("slurm", "k8s"):
        raise InputError(f"--render {render!r} is not a format; allowed: slurm, k8s.")
    if render is not None and ab:
        raise InputError("--render writes one deployment; drop --ab (render each profile).")
    if output is not None and render is None:
        raise InputError("--output goes with --render; without it there is no file to write.")
    if api_key_secret is not None and render != "k8s":
        raise InputError("--api-key-secret names a Kubernetes Secret; it goes with --render k8s.")
    request = workflow.ServeRequest(
        profile=profile,
        model=model,
        host=host,
        port=port,
        force=force,
        ab=ab,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        ray=ray,
        api_key_file=api_key_file,
        insecure=insecure,
        for_render=render or False,
        traces=traces,
    )
    prepared = workflow.prepare_serve(request)
    if render is not None:
        from kimictl.runtime.serving.render import render as render_job
        from kimictl.runtime.serving.render import write_private

        workflow.refuse_if_blocked(prepared)
        plan = prepared.plans[0]
        text = render_job(
            plan,
            render,
            nnodes=nnodes if nnodes > 1 else None,
            cluster=prepared.cluster,
            api_key_secret=api_key_secret,
            insecure=insecure,
        )
        holds_key = plan.api_key is not None and plan.api_key in text
        if output is None:
            sys.stdout.write(text)
        else:
            write_private(output, text, private=holds_key)
            if not json_out:
                console.print(f"wrote {output} ({render}) for profile {prepared.profile}")
        if holds_key:
            print(
                f"note: the {render} file holds the API key in a Secret; keep it private "
                "(or name an existing Secret with --api-key-secret).",
                file=sys.stderr,
            )
        if json_out and output is not None:
            emit_json({"render": render, "path": str(output), "profile": prepared.profile})
        return
    if dry_run:
        if json_out:
            emit_json({**prepared.to_json(), "dry_run": True})
        else:
            print_notes(prepared)
            print_gate(prepared)
            for plan in prepared.plans:
                print_plan(plan)
        workflow.refuse_if_blocked(prepared, dry_run=True)  # exit 1, like doctor
        return
    if not json_out:
        print_notes(prepared)
    workflow.refuse_if_blocked(prepared)  # the error lists every blocking reason
    if not json_out:
        print_gate(prepared)
    if not json_out:
        for plan in prepared.plans:
            print_plan(plan, with_env=False)  # --dry-run shows the environment too
            console.print(f"  log: {plan.log_path}", highlight=False, soft_wrap=True)
    records = workflow.run_serve(
        prepared,
        detach=detach,
        on_phase=phase_printer(json_out),
        on_ready=_ready_printer(detach, json_out),
        timeout=timeout,
    )
    if json_out:
        emit_json({**prepared.to_json(), "records": [r.to_json() for r in records]})
    elif not detach:
        console.print("stopped: " + ", ".join(f"{r.id} ({r.state.value})" for r in records))
