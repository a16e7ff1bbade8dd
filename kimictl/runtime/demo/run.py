"""The main job on the embedded default: `kimictl demo`.

The operator's workflow, start to finish, on kimictl's tiny K2-architecture model and CPU build of
vLLM: (1) the gate, as `kimictl serve` runs it; (2) a measured tune over a small real search space
(tune.CANDIDATES: vLLM's defaults and a few settings that plausibly change per-user decode
speed), each candidate served in turn and benched with the same seeded agentic workload; (3) the
choice, by a stated rule over those measurements (tune.choose) against an interactivity SLO
derived from the defaults; (4) an A/B of the chosen configuration against vLLM's defaults with
bootstrap CIs; (5) a paired replay of the traffic phase 2 served: every server is traced to the
demo's own span receiver, the first bench (vLLM's defaults alone) is captured from those spans as
a Mooncake trace (observe.capture, `capture.jsonl` in the folder), and that trace is replayed to
the A/B pair, row by row on its clock, for one paired verdict (load.paired, verdict.paired; no
A/A calibration: the verdict says so when it decides); (6) the verdicts, demo.json and the plots
in a new folder, and every server stopped.

Nothing here is new machinery: profiles -> `workflow.prepare_serve` (the gate) and
`serving.plan.plan_launch`, `launcher.start`/`wait_ready`/`stop_launches` for the servers' lifetime,
`load.bench.run_bench` for the load and the comparison, `load.exports.write_plots` for the PNGs.

vLLM's defaults stay up through the tune: each candidate is benched back to back with them, so a
shared machine's load drift and the servers' warm-up hit both sides of each comparison alike.
Only the defaults and the current choice stay up while the next candidate is measured (at most
three servers), so the chosen one is already running for the A/B. SIGINT/SIGTERM set a flag
(`launcher.stop_signals`) that the start-up waits and the benches watch; whatever happens, a
`finally` stops the servers (unless `keep` and all went well: then the A/B pair stays up).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from kimictl.core.errors import InputError, LaunchError, Unsupported, WriteFailed
from kimictl.core.outputs import check_new_folder, save_or_keep
from kimictl.deployment.traces import DEFAULT_TRACES_PORT, kimictl_endpoint
from kimictl.runtime.demo.tune import (
    CANDIDATES,
    DEFAULTS,
    KNOBS,
    P10,
    Candidate,
    Choice,
    Measured,
    choose,
    decide,
    flag_suspects,
    measured_from,
    verdict,
)
from kimictl.runtime.serving import launcher, workflow
from kimictl.runtime.serving.plan import DEFAULT_PORT, LaunchPlan, check_port_free, plan_launch

__all__ = [
    "DEMO_PROFILE",
    "DemoPlan",
    "DemoRequest",
    "DemoResult",
    "default_out_dir",
    "prepare_demo",
    "run_demo",
]

DEMO_PROFILE = workflow.CPU_DEMO
JSON_NAME = "demo.json"
CAPTURE_NAME = "capture.jsonl"
PLOTS_DIR = "plots"
TUNE_PLOTS_DIR = "plots/tune"
REQUEST_TIMEOUT_S = 120.0
SPAN_WAIT_S = 10.0  # after phase 2's first bench, the longest wait for its last spans
CONTROL = "defaults-control"  # A's name when the choice is vLLM's defaults (a control run)
TAKEAWAY = (
    "interactivity p10 (slow tail) tok/s/user",
    "interactivity p50 tok/s/user",
    "output tokens/s",
    "TTFT mean ms",
)
_PORT_SEARCH = 100  # ports tried above the profile's when they are taken

StepFn = Callable[[str], None]
# (measured requests) -> (live display, on_point, on_record) for one bench
BenchUi = Callable[[int], tuple[AbstractContextManager[Any], Any, Any]]


@dataclass(frozen=True)
class DemoRequest:
    """What `kimictl demo` was asked for."""

    out: Path | None = None
    sessions: int = 4
    num_prompts: int = 32
    # 32: a p10 needs 30 requests a side for an interval (load.ab.MIN_TAIL), and without one
    # no candidate can be told from the defaults
    tune_prompts: int = 32
    warmup: int = 1
    keep: bool = False
    seed: int = 0
    port: int | None = None
    timeout: float = 900.0
    candidates: tuple[str, ...] | None = None  # names from tune.CANDIDATES; None = all


@dataclass
class DemoPlan:
    """The checked demo: the gate's findings, one launch plan per candidate, the output folder."""

    request: DemoRequest
    prepared: workflow.Prepared  # the gate, as `kimictl serve` runs it
    out: Path
    candidates: list[tuple[Candidate, LaunchPlan]]
    ab_group: str
    notes: list[str] = field(default_factory=list)
    traces_port: int | None = None  # the demo's span receiver (phase 2's capture, the replay)

    def describe(self) -> dict[str, Any]:
        return {
            "profile": DEMO_PROFILE,
            "gate": [
                {"id": c.id, "status": c.status.value, "message": c.message}
                for c in self.prepared.checks
            ],
            "candidates": [
                {
                    "name": c.name,
                    "changes": dict(c.changes),
                    "why": c.why,
                    "url": p.url,
                    "run_id": p.run_id,
                    "argv": p.redacted_argv(),
                }
                for c, p in self.candidates
            ],
            "notes": self.notes,
        }


@dataclass
class DemoResult:
    plan: DemoPlan
    measured: list[Measured]
    choice: Choice | None
    names: tuple[str, str] | None  # the A/B's (A = chosen, B = vLLM's defaults)
    outcome: Any | None  # the A/B's load.bench.BenchOutcome; None when stopped before it
    tune_outcome: Any | None  # every candidate's bench, merged (summaries, records)
    records: list[Any]  # runs.RunRecord of every server started, as last written
    json_path: Path | None
    plots: list[Path]
    plots_error: str | None
    interrupted: bool
    kept: bool
    wall_s: float
    timings: dict[str, float]
    write_error: Any = None  # core.errors.WriteFailed: the report is kept in the state folder
    paired: Any = None  # load.paired.PairedOutcome of the replay of phase 2's capture
    capture: dict[str, Any] | None = None  # the capture's status (rows, files, left out)

    def takeaway(self) -> list[dict[str, Any]]:
        """The A/B rows the story needs: per-user speed (the SLO's metric), what it costs."""
        if self.outcome is None or not self.outcome.ab:
            return []
        return [r for r in self.outcome.ab if r["metric"] in TAKEAWAY]

    def verdict(self) -> str | None:
        if self.outcome is None or not self.outcome.ab or self.choice is None:
            return None
        assert self.names is not None
        chosen = DEFAULTS if self.choice.is_defaults else self.names[0]
        return verdict(self.outcome.ab, chosen=chosen, defaults=self.names[1])

    def decision(self) -> dict[str, Any] | None:
        """What to deploy, why, with what confidence, and what to try next (the final screen)."""
        if self.choice is None:
            return None
        req = self.plan.request
        return decide(
            self.choice,
            self.measured,
            self.outcome.ab if self.outcome is not None and self.outcome.ab else [],
            a=None if self.names is None else self.names[0],
            describe={c.name: c.describe() for c, _ in self.plan.candidates},
            argv={c.name: p.redacted_argv() for c, p in self.plan.candidates},
            profile=DEMO_PROFILE,
            tune_prompts=req.tune_prompts,
            num_prompts=req.num_prompts,
        )

    def to_json(self) -> dict[str, Any]:
        req = self.plan.request
        return {
            "kimictl_demo": 2,
            **self.plan.describe(),
            "workload": {
                "name": "agentic",
                "preset": "small",
                "sessions": req.sessions,
                "tune_num_prompts": req.tune_prompts,
                "ab_num_prompts": req.num_prompts,
                "warmup": req.warmup,
                "seed": req.seed,
            },
            "measured": [m.to_json() for m in self.measured],
            "choice": None if self.choice is None else self.choice.to_json(),
            "a": None if self.names is None else self.names[0],
            "b": None if self.names is None else self.names[1],
            "takeaway": self.takeaway(),
            "verdict": self.verdict(),
            "decision": self.decision(),
            "bench": None if self.outcome is None else self.outcome.to_json(),
            "tune_bench": None if self.tune_outcome is None else self.tune_outcome.to_json(),
            "runs": [r.to_json() for r in self.records],
            "plots": [str(p) for p in self.plots],
            "plots_error": self.plots_error,
            "capture": self.capture,
            "paired_replay": None if self.paired is None else self.paired.to_json(),
            "interrupted": self.interrupted,
            "kept_running": self.kept,
            "wall_s": self.wall_s,
            "timings_s": self.timings,
        }


def default_out_dir(base: Path | None = None) -> Path:
    """`./kimictl-demo-<time>` (kimictl's state folder when the current one is not writable)."""
    from kimictl.core.paths import state_dir

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


def _pick_candidates(names: tuple[str, ...] | None) -> list[Candidate]:
    if names is None:
        return list(CANDIDATES)
    known = {c.name: c for c in CANDIDATES}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(
            f"--candidates: unknown candidate {', '.join(unknown)}; allowed: {', '.join(known)}."
        )
    wanted = {DEFAULTS, *names}  # the defaults are the baseline: always measured
    return [c for c in CANDIDATES if c.name in wanted]


def _check_sizes(request: DemoRequest, count: int) -> None:
    for flag, value, low in (
        ("--sessions", request.sessions, 1),
        ("--num-prompts", request.num_prompts, 2),
        ("--tune-prompts", request.tune_prompts, 2),
        ("--timeout", request.timeout, 1),
    ):
        if value < low:
            raise InputError(f"{flag} {value} must be >= {low}.")
    if request.warmup < 0:
        raise InputError(f"--warmup {request.warmup} must be >= 0.")
    top = 65535 - count
    if request.port is not None and not 0 < request.port <= top:
        raise InputError(
            f"--port {request.port} leaves no room for {count} servers "
            f"(PORT..PORT+{count - 1}); allowed: 1-{top}."
        )


def _port_free(host: str, port: int) -> bool:
    try:
        check_port_free(host, port)
    except InputError:
        return False
    return True


def _free_block(host: str, start: int, count: int) -> int:
    """The first port P >= start with P..P+count-1 all free (one per candidate)."""
    for port in range(start, min(start + _PORT_SEARCH, 65535 - count)):
        if all(_port_free(host, port + i) for i in range(count)):
            return port
    raise InputError(
        f"no {count} free ports in a row between {start} and {start + _PORT_SEARCH} on {host}.",
        hint="pick a base with --port (the candidates get PORT..PORT+N-1).",
    )


def prepare_demo(request: DemoRequest) -> DemoPlan:
    """Check the request, run the gate, plan one server per candidate, pick a new output folder.
    Starts nothing and writes nothing."""
    from kimictl.deployment.profiles import load_profile

    candidates = _pick_candidates(request.candidates)
    _check_sizes(request, len(candidates))
    out = request.out.expanduser() if request.out is not None else default_out_dir()
    check_new_folder(out, flag="--out")
    profile = load_profile(DEMO_PROFILE)
    host = profile.spec.host or "127.0.0.1"
    port = request.port
    if port is None:
        port = _free_block(host, profile.spec.port or DEFAULT_PORT, len(candidates))
    # The gate exactly as `kimictl serve cpu-demo` runs it (e.g. no CPU runtime: CheckFailed
    # naming `kimictl setup cpu-runtime`).
    prepared = workflow.prepare_serve(workflow.ServeRequest(profile=DEMO_PROFILE, port=port))
    workflow.refuse_if_blocked(prepared, forceable=False)  # demo has no --force
    # vLLM's defaults = the profile with every tuning knob unset; max_model_len and
    # enforce_eager stay (the CPU build needs both).
    base = profile.spec.with_(**dict.fromkeys(KNOBS))
    # every server sends its per-request spans to the demo's receiver: phase 2's capture, and the
    # paired replay's join
    traces_port = _free_block("127.0.0.1", DEFAULT_TRACES_PORT + 1, 1)
    base = base.with_(otlp_traces_endpoint=kimictl_endpoint(traces_port))
    ab_group = f"ab-{os.urandom(2).hex()}"
    planned = []
    for i, cand in enumerate(candidates):
        is_base = cand.name == DEFAULTS
        planned.append(
            (
                cand,
                plan_launch(
                    base.with_(**cand.changes),
                    name=cand.name,
                    profile=profile.name,
                    runtime=prepared.runtime,
                    host=host,
                    port=port + i,
                    role="stock" if is_base else None,
                    ab_group=ab_group if is_base else None,
                ),
            )
        )
    prepared.plans = [planned[0][1]]
    notes = [
        f"vLLM's defaults = profile {profile.name} with {', '.join(KNOBS)} unset; max_model_len "
        f"{base.max_model_len} and enforce_eager stay, because the CPU build needs them (the CPU "
        "MLA kernel is sized for short contexts; torch.compile's cache never reloads on CPU).",
        "On CPU there is no specialized K3 decode path: the demo tunes stock vLLM settings "
        "on this machine. It shows the workflow (gate, measured tune, A/B, verdict), not the K3 "
        "speed-up.",
        f"Every server is traced (--otlp-traces-endpoint, port {traces_port}): its spans are the "
        "demo's capture of phase 2 and the paired replay's per-request figures.",
    ]
    return DemoPlan(
        request=request,
        prepared=prepared,
        out=out,
        candidates=planned,
        ab_group=ab_group,
        notes=notes,
        traces_port=traces_port,
    )


def _bench(
    plan: DemoPlan,
    targets: list[tuple[str, LaunchPlan]],
    num_prompts: int,
    flag: Callable[[], bool],
    bench_ui: BenchUi | None,
) -> Any:
    """One run_bench over `targets` (one at a time), watching the signal flag."""
    from kimictl.runtime.load.bench import BenchConfig, resolve_models, run_bench
    from kimictl.runtime.load.records import LoadPoint, LoadTarget
    from kimictl.runtime.load.workloads import AGENTIC_PRESETS, AgenticWorkload

    request = plan.request
    workload: Any = AgenticWorkload(AGENTIC_PRESETS["small"])  # a frozen Workload
    cfg = BenchConfig(
        targets=tuple(
            LoadTarget(name=name, url=p.url, model=p.model, api_key=p.api_key, gpus=None)
            for name, p in targets
        ),
        workload=workload,
        points=(LoadPoint(concurrency=request.sessions),),
        num_prompts=num_prompts,
        warmup=request.warmup,
        seed=request.seed,
        timeout=REQUEST_TIMEOUT_S,
        primary=P10,  # the SLO's metric carries each A/B's verdict
    )
    live, on_point, on_record = bench_ui(num_prompts) if bench_ui else (None, None, None)

    async def bench(stop: asyncio.Event) -> Any:
        resolved = await resolve_models(cfg.targets)
        with live if live is not None else contextlib.nullcontext():
            return await run_bench(
                replace(cfg, targets=tuple(resolved)),
                stop=stop,
                on_record=on_record,
                on_point=on_point,
            )

    return _watched(flag, bench)


def _watched(flag: Callable[[], bool], body: Callable[[asyncio.Event], Awaitable[Any]]) -> Any:
    """asyncio.run of `body(stop)`, `stop` set when the signal flag is."""

    async def main() -> Any:
        stop = asyncio.Event()

        async def watch() -> None:  # the signal flag, seen from inside the event loop
            while not flag():
                await asyncio.sleep(0.2)
            stop.set()

        watcher = asyncio.create_task(watch())
        try:
            return await body(stop)
        finally:
            watcher.cancel()

    return asyncio.run(main())


class _Capture:
    """The demo's span receiver, and phase 2's capture: the spans of the first bench (vLLM's
    defaults alone) written as a Mooncake trace in a private folder until the report's is made."""

    def __init__(self, port: int | None) -> None:
        from kimictl.runtime.observe.capture import CaptureWriter
        from kimictl.runtime.observe.otlp import OtlpReceiver

        self.folder = Path(tempfile.mkdtemp(prefix="kimictl-demo-"))
        self.writer = CaptureWriter(self.folder / CAPTURE_NAME)
        self.receiver = None
        self.error: str | None = None
        try:
            self.receiver = OtlpReceiver(port=port).start() if port else None
        except OSError as exc:  # the port was taken since the plan was made
            self.error = f"no span receiver on port {port}: {exc.strerror or exc}"

    def begin(self) -> None:
        if self.receiver is not None:
            self.receiver.store.listeners.append(self.writer.take)

    def end(self, expected: int) -> None:
        """Wait (a few seconds at most) for the spans of `expected` requests, write the trace."""
        if self.receiver is None or self.writer.take not in self.receiver.store.listeners:
            return
        deadline = time.monotonic() + SPAN_WAIT_S
        while time.monotonic() < deadline:
            status = self.writer.status()
            if status["rows"] + status["held"] >= expected:
                break
            time.sleep(0.1)
        self.receiver.store.listeners.remove(self.writer.take)
        self.writer.close()

    @property
    def trace(self) -> Path | None:
        return self.writer.files[0] if self.writer.rows else None

    def status(self) -> dict[str, Any]:
        return self.writer.status() | {"error": self.error}

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.close()  # idempotent

    def close(self, keep_in: Path | None) -> None:
        """Stop receiving; move the trace into `keep_in` (the report's folder) or drop it."""
        self.stop()
        if keep_in is not None and self.trace is not None:
            target = keep_in / CAPTURE_NAME
            with contextlib.suppress(OSError):
                shutil.move(str(self.trace), target)
                self.writer.files[0] = target
        shutil.rmtree(self.folder, ignore_errors=True)


def _replay(
    plan: DemoPlan,
    pair: list[tuple[str, LaunchPlan]],
    capture: _Capture,
    flag: Callable[[], bool],
) -> Any:
    """Phase 2's capture replayed to the A/B pair, paired (A/A when both are one server)."""
    from kimictl.runtime.load.bench import resolve_models
    from kimictl.runtime.load.paired import PairedConfig, run_paired
    from kimictl.runtime.load.records import LoadTarget

    assert capture.trace is not None and capture.receiver is not None and plan.traces_port
    store = capture.receiver.store
    targets = [
        LoadTarget(name=name.replace("-", "_"), url=p.url, model=p.model, api_key=p.api_key)
        for name, p in pair
    ]
    cfg = PairedConfig(
        trace=capture.trace,
        targets=(targets[0], targets[1]),
        traces_port=plan.traces_port,
        timeout=REQUEST_TIMEOUT_S,
        aa=pair[0][1] is pair[1][1],
        seed=plan.request.seed,
    )

    async def replay(stop: asyncio.Event) -> Any:
        resolved = await resolve_models(cfg.targets)
        return await run_paired(
            replace(cfg, targets=(resolved[0], resolved[1])), stop=stop, store=store
        )

    return _watched(flag, replay)


def _line(m: Measured, choice: Choice) -> str:
    if m.error is not None:
        return f"{m.name}: not measured ({m.error})"
    p10 = "-" if m.interactivity_p10 is None else f"{m.interactivity_p10:.1f}"
    p50 = "-" if m.interactivity_p50 is None else f"{m.interactivity_p50:.1f}"
    ttft = "-" if m.ttft_mean_ms is None else f"{m.ttft_mean_ms:.0f}"
    beside = "" if m.baseline_p10 is None else f"; the defaults beside it: p10 {m.baseline_p10:.1f}"
    if m.name == DEFAULTS:
        judged = "the baseline every SLO derives from"
    else:
        slo = "meets" if choice.met.get(m.name) else "misses"
        ci = m.p10_ratio_ci
        span = "no p10 interval" if ci is None else f"p10 ratio 95% CI {ci[0]:.2f}-{ci[1]:.2f}"
        judged = f"{slo} its SLO p10 >= {choice.thresholds[m.name]:.1f}; {span}"
    flag = f" [{m.suspect}]" if m.suspect else ""
    return (
        f"{m.name}: interactivity p10 {p10} / p50 {p50} tok/s/user, TTFT mean {ttft} ms, "
        f"{m.output_throughput:.1f} tok/s{beside} ({judged}){flag}"
    )


class _Merged:
    """The candidates' benches as one document (bench's `--json` shape, no A/B)."""

    def __init__(self) -> None:
        self.summaries: list[dict[str, Any]] = []
        self.records: list[Any] = []

    def add(self, outcome: Any) -> None:
        self.summaries.extend(outcome.summaries)
        self.records.extend(outcome.records)

    def to_json(self) -> dict[str, Any]:
        return {"kimictl_bench": 1, "stop_reason": None, "runs": self.summaries, "ab": None}


def run_demo(
    plan: DemoPlan,
    *,
    on_step: StepFn | None = None,
    on_phase: launcher.ProgressFn | None = None,
    bench_ui: BenchUi | None = None,
) -> DemoResult:
    """Gate -> measured tune -> choice -> A/B -> report; stops every server (unless `keep`)."""
    from kimictl.runtime.serving import runs

    step = on_step or (lambda _text: None)
    request = plan.request
    begin = time.monotonic()
    timings: dict[str, float] = {}
    launches: dict[str, launcher.Launch] = {}
    measured: list[Measured] = []
    tune = _Merged()
    choice: Choice | None = None
    names: tuple[str, str] | None = None
    outcome = None
    interrupted = False
    handed_over = False
    total = len(plan.candidates)
    for _, p in plan.candidates:  # every port before any start
        check_port_free(p.host, p.port)
    checks = plan.prepared.checks
    passed = sum(1 for c in checks if c.status.value == "pass")
    step(f"1/6 gate (as `kimictl serve` runs it): {passed} of {len(checks)} checks pass")
    capture = _Capture(plan.traces_port)
    paired = None

    stopped: set[str] = set()

    def stop(names_: list[str]) -> None:
        gone = [n for n in names_ if n in launches and n not in stopped]
        if gone:
            launcher.stop_launches([launches[n] for n in gone], grace=launcher.STOP_GRACE_S)
            stopped.update(gone)

    with launcher.stop_signals() as flag:
        try:
            step(
                f"2/6 tune: {total} configurations served in turn, each benched back to back with "
                f"vLLM's defaults: agentic workload (small preset, {request.sessions} sessions, "
                f"{request.tune_prompts} requests, seed {request.seed})"
            )
            for i, (cand, lp) in enumerate(plan.candidates, start=1):
                step(f"candidate {i}/{total} {cand.name}: {cand.describe()} (port {lp.port})")
                t0 = time.monotonic()
                try:
                    launch = launcher.start(lp, detach=request.keep)
                    launches[cand.name] = launch
                    launcher.wait_ready(
                        [launch], timeout=request.timeout, on_phase=on_phase, stop_flag=flag
                    )
                except LaunchError as error:
                    if cand.name == DEFAULTS:
                        raise  # no baseline, no tune
                    first = error.message.splitlines()[0]
                    measured.append(_failed(cand.name, f"did not start: {first}"))
                    step(f"{cand.name} did not start ({first}); left out of the choice")
                    stop([cand.name])
                    continue
                timings[f"{cand.name}.ready"] = round(time.monotonic() - t0, 1)
                t1 = time.monotonic()
                # Back to back with the defaults (still up): load drift hits both alike.
                targets = [(cand.name, lp)]
                if cand.name != DEFAULTS:
                    targets.append((DEFAULTS, plan.candidates[0][1]))
                else:
                    capture.begin()  # phase 2's traffic: the defaults' own bench
                result = _bench(plan, targets, request.tune_prompts, flag, bench_ui)
                if cand.name == DEFAULTS:
                    capture.end(sum(int(s.get("completed", 0)) for s in result.summaries))
                timings[f"{cand.name}.bench"] = round(time.monotonic() - t1, 1)
                if flag():
                    raise launcher.StopRequested()
                tune.add(result)
                by_target = {s["kimictl"]["target"]: s for s in result.summaries}
                m = (
                    measured_from(
                        cand.name,
                        by_target[cand.name],
                        baseline=by_target.get(DEFAULTS) if cand.name != DEFAULTS else None,
                        ab=result.ab if cand.name != DEFAULTS else None,
                    )
                    if cand.name in by_target
                    else _failed(cand.name, "no request finished")
                )
                if result.stop_reason and m.error is None:
                    m = replace(m, error=f"bench stopped early: {result.stop_reason}")
                measured.append(m)
                measured = flag_suspects(measured)
                choice = choose(measured)
                step(_line(measured[-1], choice))
                # Keep only the baseline and the current choice: the next candidate gets the CPU.
                stop([n for n in launches if n not in (DEFAULTS, choice.chosen)])
            assert choice is not None
            step(f"3/6 choice: {choice.chosen}: {choice.reason}")
            base_plan = plan.candidates[0][1]
            if choice.is_defaults:
                names = (CONTROL, DEFAULTS)
                pair = [(CONTROL, base_plan), (DEFAULTS, base_plan)]
            else:
                chosen_plan = next(p for c, p in plan.candidates if c.name == choice.chosen)
                names = (choice.chosen, DEFAULTS)
                pair = [(choice.chosen, chosen_plan), (DEFAULTS, base_plan)]
                launch = launches[choice.chosen]
                launch.record = runs.update_record(
                    launch.record, role="tuned", ab_group=plan.ab_group
                )
            step(
                f"4/6 A/B: {names[0]} vs {names[1]}, {request.num_prompts} requests each, one "
                "server at a time"
            )
            t2 = time.monotonic()
            outcome = _bench(plan, pair, request.num_prompts, flag, bench_ui)
            timings["ab.bench"] = round(time.monotonic() - t2, 1)
            interrupted = flag() or outcome.stop_reason == "interrupted"
            if not interrupted and capture.trace is not None:
                step(
                    f"5/6 paired replay: the {capture.writer.rows} requests phase 2 served to "
                    f"vLLM's defaults (captured from their spans), replayed to {names[0]} and "
                    f"{names[1]} at once, row by row on their clock"
                )
                t3 = time.monotonic()
                paired = _replay(plan, pair, capture, flag)
                timings["paired.replay"] = round(time.monotonic() - t3, 1)
                interrupted = flag() or paired.stop_reason == "interrupted"
            elif not interrupted:
                step(f"5/6 paired replay: skipped, nothing captured ({capture.status()})")
        except launcher.StopRequested:
            interrupted = True
        finally:
            capture.stop()
            keep_pair = request.keep and not interrupted and outcome is not None
            kept = list(dict.fromkeys([DEFAULTS, choice.chosen])) if keep_pair and choice else []
            rest = [n for n in launches if n not in kept and n not in stopped]
            if rest:
                step("6/6 stopping " + ", ".join(rest))
            launcher.stop_launches(
                [launches[n] for n in rest],
                grace=0.0 if flag.count > 1 else launcher.STOP_GRACE_S,
            )
            for n in kept:
                launcher.hand_over(launches[n])
            handed_over = bool(kept)
    records = [launch.record for launch in launches.values()]
    plots: list[Path] = []
    plots_error = None
    made = False
    if measured and any(m.error is None for m in measured):
        with contextlib.suppress(OSError):  # taken or read-only meanwhile: the JSON is kept
            plan.out.mkdir(parents=True, exist_ok=False)
            made = True
    capture.close(plan.out if made else None)
    if made:
        step(f"writing the report and plots into {plan.out}")
        plots, plots_error = _plots(plan.out, outcome, tune)
    result = DemoResult(
        plan=plan,
        measured=measured,
        choice=choice,
        names=names,
        outcome=outcome,
        tune_outcome=tune if tune.summaries else None,
        records=records,
        json_path=None,
        plots=plots,
        plots_error=plots_error,
        interrupted=interrupted,
        kept=handed_over,
        wall_s=round(time.monotonic() - begin, 1),
        timings=timings,
        paired=paired,
        capture=capture.status(),
    )
    if not interrupted and outcome is not None:  # a whole demo: the next one's estimate
        from kimictl.runtime.serving.estimate import record_demo

        record_demo(len(plan.candidates), result.wall_s, timings)
    if measured and any(m.error is None for m in measured):
        try:
            result.json_path = _write_json(result, plan.out / JSON_NAME)
        except WriteFailed as error:
            result.write_error = error
    return result


def _failed(name: str, why: str) -> Measured:
    return Measured(name, 0, 0, None, None, None, None, 0.0, error=why)


def _plots(out: Path, outcome: Any, tune: _Merged) -> tuple[list[Path], str | None]:
    from kimictl.runtime.load.exports import write_plots

    plots: list[Path] = []
    try:
        if outcome is not None and outcome.summaries:
            plots += write_plots(outcome.summaries, outcome.records, out / PLOTS_DIR, ab=outcome.ab)
        if tune.summaries:
            plots += write_plots(tune.summaries, tune.records, out / TUNE_PLOTS_DIR)
    except Unsupported as error:  # no matplotlib: the JSON still gets written
        return plots, error.message
    return plots, None


def _write_json(result: DemoResult, path: Path) -> Path:
    from kimictl.core.jsondoc import dumps

    return save_or_keep(path, dumps(result.to_json()), flag="--out")
