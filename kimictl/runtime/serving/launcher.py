"""Start, watch and stop vLLM servers: one process group per run, logs in the run folder.

Lifetime: a run moves starting -> ready -> stopping -> stopped, or to failed (never ready) or
died (a member of the deployment died after ready).
- `plan_launch` (plan.py) turns a DeploymentSpec into a `LaunchPlan` (argv + env, secrets kept
  out of argv).
- `start` checks the port, starts vLLM in its own session (so its whole tree is one process group),
  sends its output to `<run_dir>/vllm.log` and writes the run record (atomically, runs.py).
  Foreground runs ask the kernel to SIGTERM vLLM when kimictl dies (PR_SET_PDEATHSIG); detached
  runs outlive kimictl on purpose and are found again through their record (`kimictl ps`).
- `wait_ready` reads start-up phases from the log (startup.py) and declares ready only when
  /health answers 200 AND a one-token completion succeeds (a healthy server can still die on its
  first request). vLLM exiting meanwhile becomes a LaunchError with the exit code, the last 40 log
  lines and the likely cause.
- `supervise` watches a ready foreground run until a stop is asked (SIGINT/SIGTERM) or a member
  of the deployment (API server, engine core, worker: recorded at ready) dies or /health fails;
  then it takes the rest of the process group down, records the run as died with the cause and
  raises EndpointError: a broken deployment is never left half-running or reported ready.
- `stop_run` sends SIGTERM to the group, SIGKILL after the grace period, reaps, and removes the
  run's temp folder (vLLM leaves its ZMQ socket files there even after a clean exit).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kimictl.core.apikeys import env_api_key
from kimictl.core.errors import EndpointError, InputError, LaunchError
from kimictl.core.http1 import BlockingClient, own_request_headers
from kimictl.runtime.checks.stack import VLLM_VERSION
from kimictl.runtime.serving import runs
from kimictl.runtime.serving.plan import LaunchPlan, check_port_free, leads_other_nodes
from kimictl.runtime.serving.ray_cluster import ADDRESS_ENV
from kimictl.runtime.serving.runs import RunRecord, RunState
from kimictl.runtime.serving.startup import (
    likely_cause,
    log_tail,
    lost_member_line,
    read_phases,
)

__all__ = [
    "DEATH_GRACE_S",
    "HEADLESS_SETTLE_S",
    "HEARTBEAT_S",
    "STOP_GRACE_S",
    "Launch",
    "Probed",
    "StopRequested",
    "child_setup",
    "hand_over",
    "health",
    "start",
    "stop_launches",
    "stop_records",
    "stop_run",
    "stop_signals",
    "supervise",
    "wait_ready",
    "ProgressFn",
]

STOP_GRACE_S = 20.0
HEADLESS_SETTLE_S = 10.0
# Start-up quiet for this long gets a "still <phase>" line.
HEARTBEAT_S = 12.0
# A deployment with a dead member gets this long to exit on SIGTERM before SIGKILL (what is
# orphaned by a dead API server ignores SIGTERM; runs.ORPHAN_GRACE_S).
DEATH_GRACE_S = runs.ORPHAN_GRACE_S
# vLLM's rank 0 has no heartbeat to ranks on other hosts: idle, it answers /health 200 with a dead
# peer until its next collective. A one-token completion this often finds that out.
PEER_PROBE_S = 15.0
PEER_PROBE_TIMEOUT_S = 60.0
PS_PEER_PROBE_TIMEOUT_S = 10.0  # `ps` waits less: a slow answer is not counted as a loss anyway


class StopRequested(Exception):
    """SIGINT/SIGTERM arrived while kimictl was waiting; the caller stops the runs it started."""


# ---------------------------------------------------------------- start


def lower_priority(nice: int) -> None:
    """Lower this process's CPU priority by `nice`, also across sessions: with the kernel's
    autogroup on (the common default), a process that started a new session is weighed against
    other sessions by its autogroup's nice alone, not by its own."""
    os.nice(nice)
    try:
        Path("/proc/self/autogroup").write_text(f"{nice}\n")
    except OSError:  # no autogroup in this kernel
        pass


def child_setup(parent: int | None, nice: int) -> Callable[[], None] | None:
    """What the child does between fork and exec: lower its priority by `nice`, and unless
    `parent` is None (a detached run) die with that parent."""
    if parent is None and not nice:
        return None

    def preexec() -> None:
        if nice:  # after setsid: the new session is an autogroup of its own
            lower_priority(nice)
        if parent is not None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)

    return preexec


@dataclass
class Launch:
    """A started server: its plan, its record (as last written) and, when ours, its Popen."""

    plan: LaunchPlan
    record: RunRecord
    process: subprocess.Popen[bytes] | None = None
    log_offset: int = 0
    phases: list[tuple[float, str]] = field(default_factory=list)
    said_at: float = 0.0  # seconds after start of the last progress line

    def returncode(self) -> int | None:
        if self.process is not None:
            return self.process.poll()
        return None if runs.is_alive(self.record) else -1


def start(plan: LaunchPlan, *, detach: bool = False) -> Launch:
    """Start vLLM for `plan` in its own process group and record it as starting."""
    check_port_free(plan.host, plan.port)
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **plan.env}
    for sub in ("cache", "inductor") if plan.runtime == "cpu" else ():
        (plan.run_dir / sub).mkdir(exist_ok=True)
    if "TMPDIR" in plan.env:
        Path(plan.env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
    with plan.log_path.open("ab") as log:
        try:
            process = subprocess.Popen(
                plan.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=plan.run_dir,
                start_new_session=True,
                preexec_fn=child_setup(None if detach else os.getpid(), plan.nice),
            )
        except OSError as error:
            raise LaunchError(
                f"could not start `{plan.argv[0]}`: {error.strerror}.",
                hint=(
                    "run `kimictl setup cpu-runtime` first."
                    if plan.runtime == "cpu"
                    else f"install vLLM {VLLM_VERSION} on this node (see `kimictl doctor`)."
                ),
            ) from error
    record = RunRecord(
        id=plan.run_id,
        name=plan.name,
        role=plan.role,
        ab_group=plan.ab_group,
        url=plan.url,
        model=plan.model,
        profile=plan.profile,
        pids=[process.pid],
        pgid=process.pid,
        port=plan.port,
        host=plan.host,
        log_path=str(plan.log_path),
        run_dir=str(plan.run_dir),
        argv_redacted=plan.redacted_argv(),
        started_at=time.time(),
        gpus=plan.gpus,
        state=RunState.STARTING,
        runtime=plan.runtime,
        start_ticks=runs.process_start_ticks(process.pid),
        supervisor_pid=os.getpid(),
        extra={"env": plan.redacted_env(), "detach": detach, "tmp_dir": plan.env.get("TMPDIR")},
    )
    if plan.ray:  # the cluster it runs on; `stop` ends this deployment only, never the cluster
        record.extra["ray"] = {"address": plan.env.get(ADDRESS_ENV, "auto")}
    runs.write_record(record)
    return Launch(plan=plan, record=record, process=process)


def _log_evidence(log_path: Path, code: int | None) -> tuple[str, str | None, str, list[str]]:
    """(likely cause, vLLM's own line naming the member it lost or None, what to show, the
    log's tail): that line alone where vLLM wrote one (the traceback after it says nothing
    more), else the tail."""
    tail = log_tail(log_path)
    named = lost_member_line(log_path)
    cause = likely_cause([*tail, named] if named else tail, code)
    if named:
        return cause, named, f"vLLM's own line in {log_path}:\n  {named}", tail
    shown = "\n".join("  " + line for line in tail)
    return cause, None, f"last {len(tail)} lines of {log_path}:\n{shown}", tail


def _startup_failure(launch: Launch, code: int | None, during: str) -> LaunchError:
    cause, named, shown, _tail = _log_evidence(launch.plan.log_path, code)
    reason = f"{cause} ({named})" if named else cause
    launch.record = _mark(launch.record, RunState.FAILED, exit_code=code, reason=reason)
    return LaunchError(
        f"vLLM ({launch.plan.name}) exited {during} with exit code {code}; likely cause: {cause}.\n"
        f"{shown}",
        hint=f"full log: {launch.plan.log_path}",
    )


def _stopped_elsewhere(launch: Launch) -> bool:
    try:
        current = runs.get_run(launch.record.id)
    except InputError:
        return False
    return current.state in (RunState.STOPPING, RunState.STOPPED)


def _mark(record: RunRecord, state: RunState, **changes: Any) -> RunRecord:
    if state in (RunState.STOPPED, RunState.FAILED, RunState.DIED):
        changes.setdefault("ended_at", time.time())
    return runs.update_record(record, state=state, **changes)


def _mark_ready(record: RunRecord) -> RunRecord:
    """Ready, with the deployment's members as they are now: from here on, any of them gone
    means the run died."""
    members = [m.to_json() for m in runs.group_members(record)]
    return _mark(record, RunState.READY, ready_at=time.time(), members=members)


# ---------------------------------------------------------------- readiness


def health(url: str, *, timeout: float = 2.0, client: BlockingClient | None = None) -> int | None:
    """The /health status code, or None when nothing answers."""
    if client is None:
        with BlockingClient() as own:
            return health(url, timeout=timeout, client=own)
    try:
        return client.request(url, "GET", "/health", timeout=timeout)[0]
    except (OSError, TimeoutError):
        return None


@dataclass(frozen=True)
class Probed:
    """A run as `kimictl ps` shows it: its processes' state (runs.list_runs), what /health answers
    now, and "unhealthy" when a ready run's server does not answer 200."""

    record: RunRecord
    alive: bool
    health: int | None  # None: not alive, or nothing answered
    peer_lost: str | None = None  # a multi-node rank 0 whose one-token request failed: why

    @property
    def state(self) -> str:
        if self.record.state is RunState.READY and (self.health != 200 or self.peer_lost):
            return "unhealthy"
        return self.record.state.value


def probe(record: RunRecord, *, timeout: float = 1.0) -> Probed:
    """Probe a run now. A ready multi-node rank 0 also gets a one-token request: an idle rank 0
    keeps /health at 200 after a rank on another node is gone (a detached run has no supervisor
    to notice); only a failed answer counts, not a slow one or a refused key."""
    alive = runs.is_alive(record)
    status = health(record.url, timeout=timeout) if alive and record.url else None
    lost = None
    if status == 200 and record.state is RunState.READY and leads_other_nodes(record.argv_redacted):
        with BlockingClient() as client:
            ok, why = _complete_one(
                record.url,
                record.model,
                env_api_key(),
                PS_PEER_PROBE_TIMEOUT_S,
                client,
                kind="heartbeat",
            )
        if not ok and not why.startswith(("no answer", "HTTP 401", "HTTP 403")):
            lost = f"a one-token completion failed ({why}): a rank on another node may be gone"
    return Probed(record, alive, status, lost)


def _client() -> BlockingClient:
    # One client per wait: one keep-alive connection per server, one round trip per poll.
    return BlockingClient()


def _one_token(
    plan: LaunchPlan, timeout: float, client: BlockingClient, *, kind: str = "probe"
) -> tuple[bool, str]:
    return _complete_one(plan.url, plan.model, plan.api_key, timeout, client, kind=kind)


def _complete_one(
    url: str,
    model: str,
    api_key: str | None,
    timeout: float,
    client: BlockingClient,
    *,
    kind: str = "probe",
) -> tuple[bool, str]:
    """One one-token completion, marked as kimictl's own (`http1.own_request_headers`): the
    readiness probe and the multi-node heartbeat are never captured or judged."""
    body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    try:
        status, text = client.request(
            url,
            "POST",
            "/v1/completions",
            body=json.dumps(body).encode(),
            api_key=api_key,
            timeout=timeout,
            headers=own_request_headers(kind),
        )
    except TimeoutError:
        return False, f"no answer within {timeout:g} s"
    except OSError as error:
        return False, f"{type(error).__name__}: {error}"
    if status != 200:
        return False, f"HTTP {status}: {text[:200].decode(errors='replace')}"
    return True, "ok"


ProgressFn = Callable[[Launch, str, float], None]


def wait_ready(
    launches: list[Launch],
    *,
    timeout: float = 900.0,
    on_phase: ProgressFn | None = None,
    stop_flag: Callable[[], bool] = lambda: False,
    poll_s: float = 0.5,
) -> None:
    """Wait until every launch is ready (health 200 and a one-token completion), or raise.

    LaunchError when one exits or times out; StopRequested when `stop_flag()` turns true. The
    caller stops the launches in both cases (this function only marks records)."""
    with _client() as client:
        _wait_ready(launches, client, timeout, on_phase, stop_flag, poll_s)


def _wait_ready(
    launches: list[Launch],
    client: BlockingClient,
    timeout: float,
    on_phase: ProgressFn | None,
    stop_flag: Callable[[], bool],
    poll_s: float,
) -> None:
    pending = list(launches)
    begin = time.monotonic()
    next_probe: dict[str, float] = {}
    for launch in launches:  # a first line at once: vLLM logs nothing while it imports
        _say(launch, "launching vLLM", time.time() - launch.record.started_at, on_phase)
    while pending:
        if stop_flag():
            raise StopRequested()
        now = time.monotonic()
        for launch in list(pending):
            elapsed = time.time() - launch.record.started_at
            _advance_phases(launch, elapsed, on_phase)
            _heartbeat(launch, elapsed, on_phase)
            code = launch.returncode()
            if code is not None:
                if _stopped_elsewhere(launch):
                    raise StopRequested()
                raise _startup_failure(launch, code, "during start-up")
            if now < next_probe.get(launch.plan.run_id, 0.0):
                continue
            next_probe[launch.plan.run_id] = now + 1.0
            if launch.plan.headless:
                # A headless rank serves no HTTP: running for a while is all it can show.
                if elapsed >= HEADLESS_SETTLE_S:
                    launch.record = _mark_ready(launch.record)
                    _say(launch, "running headless (the API is on rank 0)", elapsed, on_phase)
                    pending.remove(launch)
                continue
            if health(launch.plan.url, timeout=2.0, client=client) != 200:
                continue
            # Whatever vLLM logged before /health answered is in the file now: read it before
            # "ready", or phases written between the read above and the probe are never shown.
            _advance_phases(launch, elapsed, on_phase)
            _say(launch, "first completion", elapsed, on_phase)
            ok, detail = _one_token(launch.plan, 60.0, client)
            if ok:
                launch.record = _mark_ready(launch.record)
                _say(launch, "ready", time.time() - launch.record.started_at, on_phase)
                pending.remove(launch)
                continue
            # A healthy server that fails its first request: dead, or about to be.
            time.sleep(1.0)
            code = launch.returncode()
            if code is not None or health(launch.plan.url, client=client) != 200:
                raise _startup_failure(
                    launch, code, f"on its first request ({detail}) right after /health said 200"
                )
        if pending and time.monotonic() - begin > timeout:
            launch = pending[0]
            tail = "\n".join("  " + line for line in log_tail(launch.plan.log_path))
            launch.record = _mark(launch.record, RunState.FAILED, reason="start-up timed out")
            raise LaunchError(
                f"vLLM ({launch.plan.name}) was not ready after {timeout:.0f} s.\n"
                f"last lines of {launch.plan.log_path}:\n{tail}",
                hint="a first start can be slow (downloads, compilation); raise --timeout.",
            )
        time.sleep(poll_s)


def _say(launch: Launch, text: str, elapsed: float, on_phase: ProgressFn | None) -> None:
    launch.said_at = elapsed
    if on_phase:
        on_phase(launch, text, elapsed)


def _heartbeat(launch: Launch, elapsed: float, on_phase: ProgressFn | None) -> None:
    """vLLM is quiet for minutes at a time (imports, the worker's start, compiling): after
    HEARTBEAT_S without a line, say which phase it is still in and for how long."""
    if elapsed - launch.said_at < HEARTBEAT_S:
        return
    since, phase = launch.phases[-1] if launch.phases else (0.0, "launching vLLM")
    _say(launch, f"still {phase} ({elapsed - since:.0f} s in this phase)", elapsed, on_phase)


def _advance_phases(launch: Launch, elapsed: float, on_phase: ProgressFn | None) -> None:
    try:
        with open(launch.plan.log_path, "rb") as handle:
            handle.seek(launch.log_offset)
            chunk = handle.read()
    except OSError:
        return
    # Only whole lines: a half-written line is read again next time.
    cut = chunk.rfind(b"\n") + 1
    launch.log_offset += cut
    seen = {p for _, p in launch.phases}
    for phase in read_phases(chunk[:cut].decode(errors="replace")):
        if phase not in seen:
            launch.phases.append((elapsed, phase))
            _say(launch, phase, elapsed, on_phase)


# ---------------------------------------------------------------- signals and supervision


class _Flag:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> bool:
        return self.count > 0


@contextlib.contextmanager
def stop_signals() -> Iterator[_Flag]:
    """SIGINT and SIGTERM set a flag (counted) instead of raising; handlers restored on exit."""
    flag = _Flag()

    def handler(signum: int, frame: Any) -> None:
        flag.count += 1

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def supervise(
    launches: list[Launch],
    *,
    stop_flag: Callable[[], bool],
    poll_s: float = 1.0,
    failures_to_dead: int = 2,
    grace: float = DEATH_GRACE_S,
    expendable: Callable[[Launch, EndpointError], None] | None = None,
) -> None:
    """Watch ready runs until `stop_flag()`. When a member of a deployment dies (API server,
    engine core, worker) or its /health fails `failures_to_dead` polls in a row, take the rest of
    its process group down, record it as died with the cause, and raise EndpointError; except
    for the first launch when `expendable` is given (a shadow): it is told, and the others are
    watched on."""
    with _client() as client:
        _supervise(launches, stop_flag, poll_s, failures_to_dead, grace, client, expendable)


def _death(launch: Launch) -> str | None:
    """What died in this deployment, or None while all its members live."""
    code = launch.returncode()
    gone = runs.missing_members(launch.record)
    if code is None and not gone:
        return None
    leader = launch.record.leader_pid
    parts = []
    if code is not None:
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        parts.append(f"its API server (pid {leader}) {how}")
    for member in gone:
        if member.pid != leader:  # not kimictl's child: its exit status went to its parent
            parts.append(f"its {member.role} (pid {member.pid}) is gone")
    return "; ".join(parts) or f"its API server (pid {leader}) is gone"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _supervise(
    launches: list[Launch],
    stop_flag: Callable[[], bool],
    poll_s: float,
    failures_to_dead: int,
    grace: float,
    client: BlockingClient,
    expendable: Callable[[Launch, EndpointError], None] | None = None,
) -> None:
    launches = list(launches)
    spare = launches[0] if expendable is not None else None
    bad: dict[str, int] = {}
    probed: dict[str, float] = {}
    while not stop_flag():
        for launch in launches:
            what = _death(launch)
            if what is None and launch.plan.headless:
                continue  # no HTTP on a headless rank: alive is healthy
            if what is None:
                status = health(launch.plan.url, timeout=5.0, client=client)
                if status == 200 and launch.plan.leads_other_nodes:
                    what = _probe_peers(launch, probed, client)
                if status == 200 and what is None:
                    bad[launch.plan.run_id] = 0
                    continue
            if what is None:
                bad[launch.plan.run_id] = bad.get(launch.plan.run_id, 0) + 1
                # An explicit non-200 counts at once; no answer at all (a busy 2-core machine
                # under load can miss a 5 s /health) needs three times as many misses in a row.
                needed = failures_to_dead if status is not None else 3 * failures_to_dead
                if bad[launch.plan.run_id] < needed:
                    continue
                what = (
                    f"/health did not answer {needed} times in a row"
                    if status is None
                    else f"/health answered {status}"
                )
            seen = replace(launch.record, state=RunState.DIED, reason=f"died after ready: {what}")
            if runs.claim_death(seen) is None:
                return  # `kimictl stop` from another shell began: a stop, not a death
            try:
                _die(launch, what, grace)
            except EndpointError as exc:
                if launch is not spare or expendable is None:
                    raise
                launches.remove(launch)
                expendable(launch, exc)
        deadline = time.monotonic() + poll_s
        while time.monotonic() < deadline and not stop_flag():
            time.sleep(0.1)


def _probe_peers(launch: Launch, probed: dict[str, float], client: BlockingClient) -> str | None:
    """Why a multi-node rank 0 has lost a peer, or None (also while no probe is due)."""
    now = time.monotonic()
    if now - probed.setdefault(launch.plan.run_id, now) < PEER_PROBE_S:
        return None
    probed[launch.plan.run_id] = now
    ok, why = _one_token(launch.plan, PEER_PROBE_TIMEOUT_S, client, kind="heartbeat")
    if ok or why.startswith("no answer"):  # a slow answer is a busy server, not a lost rank
        return None
    return f"a one-token completion failed ({why}): a rank on another node is gone"


def _die(launch: Launch, what: str, grace: float) -> None:
    """Take the rest of the deployment down, record it as died with the cause, and raise."""
    record = launch.record
    own = launch.returncode()  # the run's own exit, before our SIGTERM gives it a clean one
    cause, named, shown, tail = _log_evidence(launch.plan.log_path, own)
    if runs.is_alive(record):
        runs.end_group(record, grace)
    left = len(runs.group_members(record))
    if not left:
        runs.clean_run_files(record)
    launch.record = _mark(
        record,
        RunState.DIED,
        exit_code=own,
        reason=f"died after ready: {what}" + (f"; vLLM: {named}" if named else ""),
        extra={**record.extra, "last_log_lines": tail[-10:]},
    )
    taken = "the rest of its process group was stopped" if not left else f"{left} process(es) left"
    # `what` already names the cause when the log does not (a lost remote rank: nothing of it
    # reaches this node's log), so "not recognised" would contradict it
    known = "" if cause.startswith("not recognised") else f"; likely cause: {cause}"
    raise EndpointError(
        f"vLLM ({launch.plan.name}) died after it was ready: {what}; {taken}{known}.\n{shown}",
        hint=f"full log: {launch.plan.log_path}",
    )


# ---------------------------------------------------------------- stop


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_run(
    record: RunRecord,
    *,
    grace: float = STOP_GRACE_S,
    process: subprocess.Popen[bytes] | None = None,
    reason: str | None = None,
) -> RunRecord:
    """SIGTERM the run's group, SIGKILL after `grace` seconds (ORPHAN_GRACE_S at most for a died
    deployment: what is left of it ignores SIGTERM), reap, clean, mark stopped. The stop is
    marked in the record (`runs.begin_stop`, under its lock) before the first signal, so a
    watcher or `ps` that sees a member go takes it for the stop, not a death; the end is written
    under the same lock. A run that had died (or failed) before the stop began keeps that end."""
    record = runs.begin_stop(record)
    final = record.state if record.state in (RunState.FAILED, RunState.DIED) else RunState.STOPPED
    if record.state is RunState.DIED:
        grace = min(grace, runs.ORPHAN_GRACE_S)
    if runs.is_alive(record):
        runs.end_group(record, grace)
    code = record.exit_code
    if process is not None:
        try:
            code = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
    if final is not RunState.STOPPED:  # keep the run's own end, not our stop's
        code = record.exit_code
    runs.clean_run_files(record)
    changes: dict[str, Any] = {"exit_code": code, "supervisor_pid": None}
    if reason:
        changes["reason"] = reason
    with runs.record_lock(record):
        return _mark(record, final, **changes)


def stop_records(records: list[RunRecord], *, grace: float = STOP_GRACE_S) -> list[RunRecord]:
    """Stop several runs: SIGTERM them all first, so their grace periods overlap. A Slurm run
    is cancelled through Slurm (slurm.cancel)."""
    from kimictl.runtime.serving import slurm

    begun = [r if slurm.is_slurm(r) else runs.begin_stop(r) for r in records]  # before signals
    for record in begun:
        if not slurm.is_slurm(record) and runs.is_alive(record):
            _signal_group(record.pgid, signal.SIGTERM)
    return [
        slurm.cancel(record) if slurm.is_slurm(record) else stop_run(record, grace=grace)
        for record in begun
    ]


def stop_launches(launches: list[Launch], *, grace: float = STOP_GRACE_S) -> None:
    """Stop several at once: SIGTERM all first, so their grace periods overlap."""
    for launch in launches:
        launch.record = runs.begin_stop(launch.record)  # marked before any signal
    for launch in launches:
        if runs.is_alive(launch.record):
            _signal_group(launch.record.pgid, signal.SIGTERM)
    for launch in launches:
        launch.record = stop_run(launch.record, grace=grace, process=launch.process)


def hand_over(launch: Launch) -> RunRecord:
    """Hand a ready run over to its record and its watcher (a small process of its own session,
    watch.py): no foreground supervisor from now on, yet a member's death still ends the rest
    of the group within seconds."""
    from kimictl.runtime.serving.watch import spawn_watcher

    launch.record = runs.update_record(launch.record, supervisor_pid=None)
    launch.record = runs.update_record(
        launch.record, extra={**launch.record.extra, "watcher": spawn_watcher(launch.record)}
    )
    return launch.record
