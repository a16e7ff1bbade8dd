"""The main job on the embedded default: `kimictl demo`.

Starts the `cpu-demo` deployment and a differently configured twin (its stock twin profile with
`max_num_seqs` lowered, see TWIN_MAX_NUM_SEQS), sends both the same agentic workload (the `small`
preset) in turn, compares them, writes the JSON report and the plots into a new folder, and stops
everything it started. Nothing here is new machinery: profiles -> `workflow.prepare_serve` (the A/B
pair of `serve --ab`), `launcher.start`/`wait_ready`/`stop_launches` for the servers' lifetime,
`benchreport.run_bench` for the load and the comparison, `benchreport.write_plots` for the PNGs.

Lifetime: SIGINT/SIGTERM set a flag (`launcher.stop_signals`) that both the start-up wait and the
bench watch; whatever happens, a `finally` stops the servers (unless `keep` and all went well).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from kimictl.runtime.errors import InputError, Unsupported
from kimictl.runtime.outputs import atomic_write
from kimictl.runtime.serving import launcher, workflow

__all__ = [
    "DEMO_PROFILE",
    "DemoPlan",
    "DemoRequest",
    "DemoResult",
    "TWIN_MAX_NUM_SEQS",
    "default_out_dir",
    "prepare_demo",
    "run_demo",
]

DEMO_PROFILE = workflow.CPU_DEMO
# The twin differs from cpu-demo in one setting a CPU user can see: no batching. With several
# sessions in flight, batching buys throughput and first-token time, not per-user decode speed.
TWIN_MAX_NUM_SEQS = 1
JSON_NAME = "demo.json"
PLOTS_DIR = "plots"
REQUEST_TIMEOUT_S = 120.0
TAKEAWAY = ("output tokens/s", "TTFT mean ms", "interactivity p50 tok/s/user")
_PORT_SEARCH = 100  # ports tried above the profile's when they are taken


@dataclass(frozen=True)
class DemoRequest:
    """What `kimictl demo` was asked for."""

    out: Path | None = None
    sessions: int = 4
    num_prompts: int = 32
    warmup: int = 1
    keep: bool = False
    seed: int = 0
    port: int | None = None
    timeout: float = 900.0


@dataclass
class DemoPlan:
    """The checked demo: the A/B pair's plans (twin re-planned), where results go, what differs."""

    request: DemoRequest
    prepared: workflow.Prepared
    out: Path
    names: tuple[str, str]
    difference: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        a, b = self.prepared.plans
        return {
            "a": {"name": self.names[0], "profile": a.profile, "url": a.url, "run_id": a.run_id},
            "b": {"name": self.names[1], "profile": b.profile, "url": b.url, "run_id": b.run_id},
            "difference": self.difference,
            "notes": self.notes,
        }


@dataclass
class DemoResult:
    plan: DemoPlan
    outcome: Any | None  # benchreport.BenchOutcome; None when stopped before the bench
    records: list[Any]  # runs.RunRecord, as last written
    json_path: Path | None
    plots: list[Path]
    plots_error: str | None
    interrupted: bool
    kept: bool
    wall_s: float
    ready_s: float | None

    def takeaway(self) -> list[dict[str, Any]]:
        """The A/B rows a CPU user learns from (throughput, first token, per-user speed)."""
        if self.outcome is None or not self.outcome.ab:
            return []
        return [r for r in self.outcome.ab if r["metric"] in TAKEAWAY]

    def to_json(self) -> dict[str, Any]:
        return {
            "kimictl_demo": 1,
            **self.plan.describe(),
            "workload": {
                "name": "agentic",
                "preset": "small",
                "sessions": self.plan.request.sessions,
                "num_prompts": self.plan.request.num_prompts,
                "warmup": self.plan.request.warmup,
                "seed": self.plan.request.seed,
            },
            "interrupted": self.interrupted,
            "kept_running": self.kept,
            "wall_s": self.wall_s,
            "ready_s": self.ready_s,
            "runs": [r.to_json() for r in self.records],
            "takeaway": self.takeaway(),
            "bench": None if self.outcome is None else self.outcome.to_json(),
            "plots": [str(p) for p in self.plots],
            "plots_error": self.plots_error,
        }


def default_out_dir(base: Path | None = None) -> Path:
    """`./kimictl-demo-<time>` (kimictl's state folder when the current one is not writable)."""
    from kimictl.runtime.paths import state_dir

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = base or Path.cwd()
    if not os.access(base, os.W_OK):
        base = state_dir() / "demos"
    out = base / f"kimictl-demo-{stamp}"
    n = 1
    while out.exists():
        n += 1
        out = base / f"kimictl-demo-{stamp}-{n}"
    return out


def _check_out(out: Path) -> None:
    if out.exists():
        kind = "folder" if out.is_dir() else "file"
        raise InputError(
            f"--out {out} already exists (a {kind}); the demo never overwrites: "
            "give a new folder name, or leave --out out for a fresh one."
        )
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise InputError(f"--out {out}: cannot create it ({parent} is not a writable folder).")


def _check_sizes(request: DemoRequest) -> None:
    for flag, value, low in (
        ("--sessions", request.sessions, 1),
        ("--num-prompts", request.num_prompts, 2),
        ("--timeout", request.timeout, 1),
    ):
        if value < low:
            raise InputError(f"{flag} {value} must be >= {low}.")
    if request.warmup < 0:
        raise InputError(f"--warmup {request.warmup} must be >= 0.")
    if request.port is not None and not 0 < request.port < 65535:
        raise InputError(f"--port {request.port} is not a TCP port pair; allowed: 1-65534.")


def _port_free(host: str, port: int) -> bool:
    try:
        launcher.check_port_free(host, port)
    except InputError:
        return False
    return True


def _free_pair(host: str, start: int) -> int:
    """The first port P >= start with P and P+1 both free (the demo's pair)."""
    for port in range(start, min(start + _PORT_SEARCH, 65534)):
        if _port_free(host, port) and _port_free(host, port + 1):
            return port
    raise InputError(
        f"no two free ports between {start} and {start + _PORT_SEARCH} on {host}.",
        hint="pick a base with --port (the twin gets PORT+1).",
    )


def prepare_demo(request: DemoRequest) -> DemoPlan:
    """Check the request, plan the pair (no GPU needed), and pick a new output folder.
    Starts nothing and writes nothing."""
    from kimictl.runtime.deployment.profiles import load_profile

    _check_sizes(request)
    out = request.out.expanduser() if request.out is not None else default_out_dir()
    _check_out(out)
    profile = load_profile(DEMO_PROFILE)
    host = profile.spec.host or "127.0.0.1"
    port = request.port
    if port is None:
        port = _free_pair(host, profile.spec.port or launcher.DEFAULT_PORT)
    prepared = workflow.prepare_serve(
        workflow.ServeRequest(profile=DEMO_PROFILE, ab=True, port=port)
    )
    workflow.refuse_if_blocked(prepared)  # e.g. no CPU runtime: CheckFailed naming the remedy
    tuned, stock = prepared.plans
    twin = load_profile(stock.profile or str(profile.stock_twin))
    base_seqs = profile.spec.max_num_seqs
    twin_spec = twin.spec.with_(max_num_seqs=TWIN_MAX_NUM_SEQS)
    # Re-plan the twin through the launcher with the one setting changed (same id, port, group).
    names = (DEMO_PROFILE, f"twin-seqs{TWIN_MAX_NUM_SEQS}")
    stock = launcher.plan_launch(
        twin_spec,
        name=names[1],
        profile=twin.name,
        runtime=stock.runtime,
        host=stock.host,
        port=stock.port,
        role=stock.role,
        ab_group=stock.ab_group,
        run_id=stock.run_id,
    )
    prepared.plans = [tuned, stock]
    difference = {
        "setting": "max_num_seqs",
        names[0]: base_seqs,
        names[1]: TWIN_MAX_NUM_SEQS,
        "why": (
            "the most sequences vLLM batches per step: with several agentic sessions in flight, "
            "batching trades per-user decode speed (TPOT) for throughput and first-token time "
            "(TTFT)"
        ),
    }
    notes = [
        f"A = {names[0]} (profile {profile.name}, max_num_seqs {base_seqs}); "
        f"B = {names[1]} (profile {twin.name} with max_num_seqs {TWIN_MAX_NUM_SEQS}: no batching). "
        "Everything else is the same. On CPU there is no specialized K3 decode path, so the "
        "demo compares two stock configurations: it shows the workflow, not the K3 speed-up.",
    ]
    return DemoPlan(
        request=request,
        prepared=prepared,
        out=out,
        names=names,
        difference=difference,
        notes=notes,
    )


StepFn = Callable[[str], None]


def run_demo(
    plan: DemoPlan,
    *,
    on_step: StepFn | None = None,
    on_phase: launcher.ProgressFn | None = None,
    on_point: Callable[..., None] | None = None,
    on_record: Callable[[Any], None] | None = None,
    live: AbstractContextManager[Any] | None = None,
) -> DemoResult:
    """Start the pair, wait until both are ready, bench them in turn, stop them (unless `keep`),
    then write `demo.json` and the plots into the (new) output folder."""
    from kimictl.runtime.load.benchreport import BenchConfig, resolve_models, run_bench, write_plots
    from kimictl.runtime.load.loadgen import LoadPoint, LoadTarget
    from kimictl.runtime.load.workloads import AGENTIC_PRESETS, AgenticWorkload

    step = on_step or (lambda _text: None)
    request = plan.request
    begin = time.monotonic()
    keep = request.keep
    launches: list[launcher.Launch] = []
    outcome = None
    ready_s = None
    interrupted = False
    handed_over = False
    for p in plan.prepared.plans:  # both ports before any start: the pair starts whole or not
        launcher.check_port_free(p.host, p.port)
    with launcher.stop_signals() as flag:
        try:
            step(f"starting 2 CPU vLLM servers ({plan.names[0]} and {plan.names[1]})")
            for p in plan.prepared.plans:
                launches.append(launcher.start(p, detach=keep))
            launcher.wait_ready(
                launches, timeout=request.timeout, on_phase=on_phase, stop_flag=flag
            )
            ready_s = time.monotonic() - begin
            step(f"both servers ready after {ready_s:.0f} s")
            workload: Any = AgenticWorkload(AGENTIC_PRESETS["small"])  # a frozen Workload
            cfg = BenchConfig(
                targets=tuple(
                    LoadTarget(name=name, url=p.url, model=p.model, api_key=p.api_key, gpus=None)
                    for name, p in zip(plan.names, plan.prepared.plans, strict=True)
                ),
                workload=workload,
                points=(LoadPoint(concurrency=request.sessions),),
                num_prompts=request.num_prompts,
                warmup=request.warmup,
                seed=request.seed,
                timeout=REQUEST_TIMEOUT_S,
            )
            step(
                f"bench: agentic (small preset), {request.sessions} concurrent sessions, "
                f"{request.num_prompts} measured requests per server, one server at a time"
            )

            async def bench() -> Any:
                stop = asyncio.Event()

                async def watch() -> None:  # the signal flag, seen from inside the event loop
                    while not flag():
                        await asyncio.sleep(0.2)
                    stop.set()

                watcher = asyncio.create_task(watch())
                try:
                    targets = await resolve_models(cfg.targets)
                    with live if live is not None else contextlib.nullcontext():
                        return await run_bench(
                            replace(cfg, targets=tuple(targets)),
                            stop=stop,
                            on_record=on_record,
                            on_point=on_point,
                        )
                finally:
                    watcher.cancel()

            outcome = asyncio.run(bench())
            interrupted = flag() or outcome.stop_reason == "interrupted"
        except launcher.StopRequested:
            interrupted = True
        finally:
            if keep and not interrupted and outcome is not None:
                for launch in launches:
                    launcher.hand_over(launch)
                handed_over = True
            else:
                if launches:
                    step("stopping both servers")
                launcher.stop_launches(
                    launches, grace=0.0 if flag.count > 1 else launcher.STOP_GRACE_S
                )
    records = [launch.record for launch in launches]
    plots: list[Path] = []
    plots_error = None
    if outcome is not None:
        plan.out.mkdir(parents=True, exist_ok=False)
        if outcome.summaries:
            step(f"writing the report and plots into {plan.out}")
            try:
                plots = write_plots(outcome.summaries, outcome.records, plan.out / PLOTS_DIR)
            except Unsupported as error:  # no matplotlib: the JSON still gets written
                plots_error = error.message
    result = DemoResult(
        plan=plan,
        outcome=outcome,
        records=records,
        json_path=None,
        plots=plots,
        plots_error=plots_error,
        interrupted=interrupted,
        kept=handed_over,
        wall_s=time.monotonic() - begin,
        ready_s=ready_s,
    )
    if outcome is not None:
        result.json_path = _write_json(result, plan.out / JSON_NAME)
    return result


def _write_json(result: DemoResult, path: Path) -> Path:
    import orjson

    data = orjson.dumps(
        result.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY, default=str
    )
    return atomic_write(path, data + b"\n")
