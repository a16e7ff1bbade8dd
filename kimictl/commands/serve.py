"""`kimictl serve`: launch vLLM with a profile (one node, many, or a tuned/stock A/B pair)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kimictl.commands._options import ApiKeyFileOpt, JsonOpt
from kimictl.deployment.cluster import JobFormat

if TYPE_CHECKING:
    from kimictl.runtime.serving.proxy import EdgePlan
    from kimictl.runtime.serving.runs import RunRecord
    from kimictl.runtime.serving.workflow import Prepared, ServeRequest

app = typer.Typer(add_completion=False)


def _ready_printer(detach: bool, quiet: bool, edge: EdgePlan | None = None):  # type: ignore[no-untyped-def]
    from kimictl.commands._output import console, print_command

    def on_ready(records: list[RunRecord]) -> None:
        if quiet:
            return
        for record in records:
            took = (record.ready_at or time.time()) - record.started_at
            role = f" ({record.role})" if record.role else ""
            if "--headless" in record.argv_redacted:  # no HTTP here: rank 0 serves the API
                console.print(
                    f"[bold green]started[/] {record.id}: headless rank (no HTTP on this node; "
                    f"rank 0 serves the API once every rank has joined)  ({took:.1f} s)",
                    highlight=False,
                )
                continue
            console.print(
                f"[bold green]ready[/] {record.id}{role}: {record.url}  model {record.model}  "
                f"({took:.1f} s)",
                highlight=False,
            )
        ids = [r.id for r in records]
        served = [r.id for r in records if "--headless" not in r.argv_redacted]
        if edge is not None:
            tuned, stock = records
            console.print(
                f"[bold green]edge[/] nginx ({edge.mode} {edge.pct:g}%): {edge.url}  "
                "send users here",
                highlight=False,
            )
            arms = [f"tuned={tuned.url}", f"stock={stock.url}", f"--{edge.mode}", f"{edge.pct:g}"]
            print_command("monitor: ", ["kimictl", "monitor", *arms])
        elif served:
            print_command("monitor: ", ["kimictl", "monitor", *served])
        if len(records) == 2 and records[0].ab_group:
            print_command("bench:   ", ["kimictl", "bench", "--ab"])
        if detach:
            print_command("stop:    ", ["kimictl", "stop", *ids])
            print_command("logs:    ", ["kimictl", "logs", records[0].id])
        else:
            console.print("Ctrl-C (or SIGTERM) stops the server(s).")

    return on_ready


ProfileArg = Annotated[
    str | None, typer.Argument(help="Profile name or .toml file (see `kimictl profiles list`).")
]
ModelOpt = Annotated[
    str | None, typer.Option(help="Override the profile's model (folder or hub id).")
]
HostOpt = Annotated[
    str | None, typer.Option(help="Bind address (default 127.0.0.1; others need a key).")
]
PortOpt = Annotated[int | None, typer.Option(help="Port (A/B: the stock twin gets PORT+1).")]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run", help="Print env and argv (key redacted) and exit (1 if the gate blocks)."
    ),
]
DetachOpt = Annotated[
    bool, typer.Option("--detach", help="Leave it running once ready; see `kimictl ps`.")
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Launch despite failing checks.")]
NnodesOpt = Annotated[int, typer.Option(help="Nodes of one deployment (vLLM mp backend).")]
NodeRankOpt = Annotated[int, typer.Option(help="This node's rank (0 serves the API).")]
MasterAddrOpt = Annotated[
    str | None, typer.Option(help="Address of node rank 0 (with --nnodes > 1).")
]
RayOpt = Annotated[
    bool,
    typer.Option(
        "--ray",
        help="Serve through a running Ray cluster ($RAY_ADDRESS, else the one `ray start` "
        "started here); CPU runtime: after `kimictl setup cpu-runtime --ray`.",
    ),
]
RenderOpt = Annotated[JobFormat | None, typer.Option(help="Write a cluster job instead.")]
OutputOpt = Annotated[
    Path | None,
    typer.Option("--output", "-o", help="--render: write to FILE (default stdout)."),
]
AbOpt = Annotated[
    bool, typer.Option("--ab", help="Start the profile and its stock twin (A/B pair).")
]
ApiKeySecretOpt = Annotated[
    str | None,
    typer.Option(help="--render k8s: read the key from this existing Secret (key 'key')."),
]
WeightsPathOpt = Annotated[
    str | None,
    typer.Option(
        help="--render: the weights on a path every node mounts (HF_HOME PATH/hf, read offline), "
        "instead of the profile's [cluster] volume."
    ),
]
SlurmOpt = Annotated[
    bool,
    typer.Option(
        "--slurm",
        help="Submit the --render slurm job through sbatch and follow it as a run (ps, stop, "
        "logs, monitor); the key travels in sbatch's environment.",
    ),
]
PartitionOpt = Annotated[
    str | None, typer.Option(help="--slurm: the Slurm partition (default: Slurm's).")
]
ApplyOpt = Annotated[
    bool,
    typer.Option(
        "--apply", help="--render k8s: hand the objects to `kubectl apply` (needs a cluster)."
    ),
]
InsecureOpt = Annotated[
    bool, typer.Option("--insecure", help="Allow a non-loopback bind without an API key.")
]
TimeoutOpt = Annotated[float, typer.Option(help="Seconds to wait for readiness (> 0).")]
TracesOpt = Annotated[
    str | None,
    typer.Option(
        help="Send one trace span per finished request: kimictl (to `kimictl monitor` on "
        "this host), off, or an OTLP/HTTP URL; default: the profile's \\[metrics] traces."
    ),
]

CanaryOpt = Annotated[
    float | None,
    typer.Option(
        help="--ab behind an nginx edge: send PCT% of requests to tuned, the rest to stock "
        "(--render k8s: an HTTPRoute with weighted backendRefs).",
    ),
]
ShadowOpt = Annotated[
    float | None,
    typer.Option(
        help="--ab behind an nginx edge: stock answers; PCT% of requests are copied to tuned "
        "and its answers discarded (--render k8s: HTTPRoute RequestMirror).",
    ),
]
ProxyPortOpt = Annotated[
    int | None, typer.Option(help="--canary/--shadow: the edge's port (default stock's + 1).")
]
GatewayOpt = Annotated[
    str,
    typer.Option(help="--render k8s with --canary/--shadow: the Gateway the route attaches to."),
]


def _print_edge(edge: EdgePlan | None) -> None:
    from kimictl.commands._output import console

    if edge is not None:
        console.print(
            f"edge nginx ({edge.mode} {edge.pct:g}%) -> {edge.url}: tuned {edge.tuned}, "
            f"stock {edge.stock}",
            highlight=False,
        )


@app.command(
    help="Launch vLLM with a profile. Runs the doctor gate first (refuses on any blocking check "
    "unless --force). With no GPU and no profile, serves the embedded CPU demo (cpu-demo). "
    "Exit 0 ok / stopped cleanly, 1 refused or died, 2 bad input."
)
def serve(
    profile: ProfileArg = None,
    model: ModelOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    dry_run: DryRunOpt = False,
    detach: DetachOpt = False,
    force: ForceOpt = False,
    nnodes: NnodesOpt = 1,
    node_rank: NodeRankOpt = 0,
    master_addr: MasterAddrOpt = None,
    ray: RayOpt = False,
    render: RenderOpt = None,
    slurm: SlurmOpt = False,
    partition: PartitionOpt = None,
    apply: ApplyOpt = False,
    output: OutputOpt = None,
    ab: AbOpt = False,
    api_key_file: ApiKeyFileOpt = None,
    api_key_secret: ApiKeySecretOpt = None,
    weights_path: WeightsPathOpt = None,
    insecure: InsecureOpt = False,
    timeout: TimeoutOpt = 900.0,
    json_out: JsonOpt = False,
    traces: TracesOpt = None,
    canary: CanaryOpt = None,
    shadow: ShadowOpt = None,
    proxy_port: ProxyPortOpt = None,
    gateway: GatewayOpt = "inference-gateway",
) -> None:
    from kimictl.core.errors import InputError
    from kimictl.runtime.serving import workflow

    if slurm and (render is not None or dry_run):
        raise InputError(
            "--slurm submits the job; drop --render and --dry-run "
            "(`--render slurm` prints the same job without submitting it)."
        )
    if detach and (canary is not None or shadow is not None):
        raise InputError(
            "--canary/--shadow run their nginx edge with the foreground serve; drop --detach."
        )

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
        for_render=render.value if render is not None else ("slurm" if slurm else False),
        traces=traces,
        render_output=output,
        api_key_secret=api_key_secret,
        weights_path=weights_path,
        timeout=timeout,
        slurm=slurm,
        partition=partition,
        apply=apply,
        canary=canary,
        shadow=shadow,
        proxy_port=proxy_port,
    )
    prepared = workflow.prepare_serve(request)
    if slurm:
        _submit_slurm(prepared, request, json_out)
    elif render is not None:
        _render(prepared, request, json_out, gateway)
    elif dry_run:
        _dry_run(prepared, json_out)
    else:
        _launch(prepared, request, detach=detach, json_out=json_out)


def _render(prepared: Prepared, request: ServeRequest, json_out: bool, gateway: str) -> None:
    """--render: the job file on stdout or in --output (private when it holds the key)."""
    from kimictl.commands._output import console, emit_json
    from kimictl.core.outputs import check_new_file, write_new
    from kimictl.runtime.serving import workflow
    from kimictl.runtime.serving.render import render as render_job
    from kimictl.runtime.serving.render import render_ab

    render, output = str(request.for_render), request.render_output
    if output is not None:
        check_new_file(output, flag="--output", forceable=False)
    workflow.refuse_if_blocked(prepared)
    plan = prepared.plans[0]
    if request.ab:  # with --canary/--shadow (ServeRequest refuses a bare --ab render)
        text = render_ab(
            prepared.plans,
            render,
            canary=request.canary,
            shadow=request.shadow,
            gateway=gateway,
            cluster=prepared.cluster,
            api_key_secret=request.api_key_secret,
            weights_path=request.weights_path,
            insecure=request.insecure,
        )
    else:
        text = render_job(
            plan,
            render,
            nnodes=request.nnodes if request.nnodes > 1 else None,
            cluster=prepared.cluster,
            api_key_secret=request.api_key_secret,
            weights_path=request.weights_path,
            insecure=request.insecure,
        )
    holds_key = plan.api_key is not None and plan.api_key in text
    if request.apply:
        from kimictl.runtime.serving.k8s_apply import apply as kubectl_apply

        for line in kubectl_apply(text):
            console.print(line, highlight=False)
        return
    if output is None:
        sys.stdout.write(text)
    else:
        write_new(output, text, flag="--output", mode=0o600 if holds_key else 0o644)
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


def _submit_slurm(prepared: Prepared, request: ServeRequest, json_out: bool) -> None:
    """--slurm: sbatch the rendered job, follow it until it serves, print the run."""
    from kimictl.commands._output import console, emit_json
    from kimictl.commands._render import print_notes
    from kimictl.runtime.serving import workflow

    if not json_out:
        print_notes(prepared)

    def say(line: str) -> None:
        if not json_out:
            console.print(line, highlight=False, soft_wrap=True)

    record = workflow.submit_slurm(prepared, request, say=say)
    if json_out:
        emit_json({**prepared.to_json(), "records": [record.to_json()]})
        return
    took = (record.ready_at or time.time()) - record.started_at
    job = record.extra["slurm"]
    say(
        f"[bold green]ready[/] {record.id}: {record.url}  model {record.model}  Slurm job "
        f"{job['job_id']} on {','.join(job['nodes'] or [])}  ({took:.1f} s)"
    )
    say(f"monitor: kimictl monitor {record.id}")
    say(f"stop:    kimictl stop {record.id}   logs: kimictl logs {record.id}")


def _dry_run(prepared: Prepared, json_out: bool) -> None:
    """--dry-run: the plans, notes and gate; exit 1 when the gate blocks, like doctor."""
    from kimictl.commands._output import emit_json
    from kimictl.commands._render import print_gate, print_notes, print_plan
    from kimictl.runtime.serving import workflow

    if json_out:
        emit_json({**prepared.to_json(), "dry_run": True})
    else:
        print_notes(prepared)
        print_gate(prepared)
        for plan in prepared.plans:
            print_plan(plan)
        _print_edge(prepared.edge)
    workflow.refuse_if_blocked(prepared, dry_run=True)


def _launch(prepared: Prepared, request: ServeRequest, *, detach: bool, json_out: bool) -> None:
    """Launch past the gate, wait for readiness; stay in the foreground unless --detach."""
    from kimictl.commands._output import console, emit_json
    from kimictl.commands._render import phase_printer, print_gate, print_notes, print_plan
    from kimictl.runtime.serving import workflow
    from kimictl.runtime.serving.estimate import start_estimate

    if not json_out:
        print_notes(prepared)
    workflow.refuse_if_blocked(prepared)  # the error lists every blocking reason
    if not json_out:
        print_gate(prepared)
        for plan in prepared.plans:
            print_plan(plan, with_env=False)  # --dry-run shows the environment too
            console.print(f"  log: {plan.log_path}", highlight=False, soft_wrap=True)
            if plan.profile:  # from this machine's own starts of the profile, load said
                said = start_estimate(plan.profile).line("  start to ready")
                console.print(said, highlight=False, markup=False, soft_wrap=True)
        _print_edge(prepared.edge)
    records = workflow.run_serve(
        prepared,
        detach=detach,
        on_phase=phase_printer(json_out),
        on_ready=_ready_printer(detach, json_out, prepared.edge),
        timeout=request.timeout,
    )
    if json_out:
        emit_json({**prepared.to_json(), "records": [r.to_json() for r in records]})
    elif not detach:
        console.print("stopped: " + ", ".join(f"{r.id} ({r.state.value})" for r in records))
