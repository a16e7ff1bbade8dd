"""`kimictl serve PROFILE --slurm`: the `--render slurm` job, submitted and followed as a run.

`submit` writes the rendered script into the run folder, hands it to `sbatch` (the API key travels
in sbatch's environment, never in the file or argv) and records a run whose `extra["slurm"]` holds
the job id, the script, the job's output file and, once it runs, the node list. It then waits as
a local launch does: the job running, /health 200 at the first node's address, one completion.

Afterwards the record is followed through Slurm itself: `scontrol show job` while the controller
remembers the job, `sacct` after (where accounting runs). `observe` turns Slurm's state into the
run's (a job that ends after ready died, with Slurm's state, reason and exit code); `cancel` is
`scancel` and a wait until the job has left its nodes (COMPLETING counts as still there).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kimictl.core.apikeys import ENV_VAR
from kimictl.core.errors import InputError, LaunchError, Unsupported
from kimictl.runtime.serving import runs
from kimictl.runtime.serving.plan import LaunchPlan
from kimictl.runtime.serving.runs import RunRecord, RunState
from kimictl.runtime.serving.startup import log_tail

__all__ = [
    "ACTIVE",
    "CANCEL_WAIT_S",
    "NO_ANSWER",
    "JobInfo",
    "cancel",
    "is_slurm",
    "job_info",
    "observe",
    "settle",
    "submit",
]

CANCEL_WAIT_S = 120.0  # scancel to the job gone from its nodes (KillWait, then the epilog)
_QUERY_TIMEOUT_S = 15.0
# kimictl's word for a controller that did not answer (scontrol failed, sacct knows nothing)
NO_ANSWER = "NO_ANSWER"
# States in which the job still holds (or will hold) nodes; anything else has ended.
ACTIVE = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "REQUEUED",
     "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD",
     NO_ANSWER}
)  # fmt: skip
# What an ended job's state means for a server (Slurm's job state codes, `man squeue`).
_MEANING = {
    "CANCELLED": "cancelled outside kimictl (scancel, or an administrator)",
    "FAILED": "a task exited non-zero: a rank died, and srun --kill-on-bad-exit ended the rest",
    "TIMEOUT": "it reached its time limit",
    "PREEMPTED": "a higher-priority job preempted it",
    "NODE_FAIL": "one of its nodes failed",
    "OUT_OF_MEMORY": "a task ran out of memory",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "it reached its deadline",
    "COMPLETED": "its script exited 0 (the server ended by itself)",
    "UNKNOWN": "neither scontrol nor sacct knows it any more",
}
# A job that is ending (COMPLETING) already names why in its Reason (Slurm 23.02: TimeLimit
# for a time limit, before the final TIMEOUT state).
_ENDING = {"TimeLimit": _MEANING["TIMEOUT"]}


@dataclass(frozen=True)
class JobInfo:
    """One job as Slurm reports it now. `state` is "UNKNOWN" when nothing knows the job."""

    job_id: str
    state: str
    reason: str | None = None  # Slurm's Reason (None when it says "None")
    nodes: str | None = None  # the NodeList expression, e.g. kmh-[a-b]
    exit_code: str | None = None  # Slurm's "code:signal"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "nodelist": self.nodes,
                "exit_code": self.exit_code}  # fmt: skip

    def describe(self) -> str:
        """e.g. "Slurm job 12 FAILED (NonZeroExitCode, exit 1:0): a task exited non-zero ..."."""
        code = self.exit_code if not self.active or self.state == "COMPLETING" else None
        said = [x for x in (self.reason, code and f"exit {code}") if x]
        text = f"Slurm job {self.job_id} {self.state}" + (f" ({', '.join(said)})" if said else "")
        if self.state == "COMPLETING":
            meaning = _ENDING.get(self.reason or "")
        else:
            meaning = None if self.active else _MEANING.get(self.state)
        return f"{text}: {meaning}" if meaning else text


def is_slurm(record: RunRecord) -> bool:
    return "slurm" in record.extra


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=_QUERY_TIMEOUT_S, env=env
        )
    except FileNotFoundError as exc:
        raise Unsupported(
            f"{argv[0]} not found: --slurm runs where Slurm's client commands are installed.",
            hint="run kimictl on a Slurm login node (apt: slurm-client), or use --render slurm.",
        ) from exc
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} timed out: {exc}")


def _fields(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def _clean(value: str | None) -> str | None:
    return None if value in (None, "", "None", "(null)") else value


def job_info(job_id: str) -> JobInfo:
    """The job's state from the controller (`scontrol`), else accounting (`sacct`)."""
    out = _run(["scontrol", "-o", "show", "job", job_id])
    if out.returncode == 0 and "JobState=" in out.stdout:
        f = _fields(out.stdout)
        return JobInfo(
            job_id,
            f.get("JobState", "UNKNOWN"),
            _clean(f.get("Reason")),
            _clean(f.get("NodeList")),
            _clean(f.get("ExitCode")),
        )
    # the controller answered that it has forgotten the job, or did not answer at all
    forgotten = "invalid job id" in out.stderr.lower()
    if shutil.which("sacct"):
        columns = "State,Reason,NodeList,ExitCode"
        acct = _run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", columns])
        rows = [r.split("|") for r in acct.stdout.splitlines() if r.count("|") == 3]
        if acct.returncode == 0 and rows:
            state, reason, nodes, code = rows[0]
            return JobInfo(job_id, state.split()[0], _clean(reason), _clean(nodes), _clean(code))
    if not forgotten:  # no answer is no news: the job is taken as still there, never as ended
        return JobInfo(job_id, NO_ANSWER, _last_line(out.stderr or out.stdout).rstrip("."))
    return JobInfo(job_id, "UNKNOWN")


def _hostnames(nodelist: str) -> list[str]:
    out = _run(["scontrol", "show", "hostnames", nodelist])
    return out.stdout.split() if out.returncode == 0 else []


def _node_addr(node: str) -> str:
    """The node's address as Slurm reaches it (NodeAddr), else its name."""
    out = _run(["scontrol", "-o", "show", "node", node])
    return _clean(_fields(out.stdout).get("NodeAddr")) or node


def _exit_code(info: JobInfo) -> int | None:
    """Slurm's "code:signal" as a process status: the code, or minus the signal."""
    if not info.exit_code or ":" not in info.exit_code:
        return None
    code, sig = info.exit_code.split(":", 1)
    try:
        return -int(sig) if int(sig) else int(code)
    except ValueError:
        return None


def _srun_error(record: RunRecord) -> str | None:
    """srun's own line naming the task that ended the job, e.g. `srun: error: kmh-b: task 1:
    Killed`, from the job's output."""
    lines = [ln.strip() for ln in log_tail(record.log_path, 400) if ln.startswith("srun: error:")]
    return lines[-1] if lines else None


def _why(record: RunRecord, info: JobInfo) -> str:
    said = _srun_error(record) if info.state in ("FAILED", "COMPLETING") else None
    return info.describe() + (f"; the job's output says: {said}" if said else "")


# ---------------------------------------------------------------- following a record


def observe(record: RunRecord) -> tuple[RunRecord, RunState, str | None]:
    """The record with Slurm's view in `extra["slurm"]`, the run's state now and why."""
    job = record.extra["slurm"]
    if record.state not in runs.LIVE_STATES:
        return record, record.state, None  # its end is recorded; Slurm may have forgotten it
    info = job_info(job["job_id"])
    record = replace(record, extra={**record.extra, "slurm": {**job, **info.to_json()}})
    if record.state is RunState.STOPPING:
        return record, RunState.STOPPING if info.active else RunState.STOPPED, None
    if info.state == "COMPLETING":  # ending by itself: say so now, not once Slurm has cleaned up
        state = RunState.DIED if record.state is RunState.READY else RunState.FAILED
        return record, state, f"{_why(record, info)} (ending: Slurm is cleaning up its nodes)"
    said = _srun_error(record) if record.state is RunState.READY else None
    if info.state == "RUNNING" and said:  # a task ended: --kill-on-bad-exit is ending the job
        return (
            record,
            RunState.DIED,
            (
                f"{info.describe()}, ending: the job's output says: {said} "
                "(srun --kill-on-bad-exit ends every task when one fails)"
            ),
        )
    if info.active:
        return record, record.state, info.describe() + (f" on {info.nodes}" if info.nodes else "")
    state = RunState.DIED if record.state is RunState.READY else RunState.FAILED
    return record, state, _why(record, info)


def settle(record: RunRecord, state: RunState, reason: str | None) -> RunRecord:
    """Write down an end that `observe` found (Slurm forgets jobs; the record keeps why).
    A death nobody was told of stays `unseen` (listed by `ps`) until `stop` acknowledges it."""
    info = record.extra["slurm"]
    if (
        state in runs.LIVE_STATES
        or record.state not in runs.LIVE_STATES
        or info.get("state") in ACTIVE
    ):
        return record  # still live, already settled, or Slurm not done with it (COMPLETING)
    code = _exit_code(JobInfo(info["job_id"], info.get("state", "UNKNOWN"),
                              exit_code=info.get("exit_code")))  # fmt: skip
    extra = {**record.extra, "unseen": state is RunState.DIED}
    return runs.update_record(
        record, state=state, reason=reason, ended_at=time.time(), exit_code=code, extra=extra
    )


# ---------------------------------------------------------------- submit


def _sbatch_argv(script: Path, output: Path, run_dir: Path, partition: str | None) -> list[str]:
    argv = ["sbatch", "--parsable", f"--output={output}", f"--chdir={run_dir}"]
    if partition:
        argv.append(f"--partition={partition}")
    return [*argv, str(script)]


def _last_line(text: str) -> str:
    """A Slurm command's last line, without its `sbatch: error: ` prefix, as one sentence."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[-1] if lines else "no message"
    for prefix in ("sbatch: error: ", "scancel: error: "):
        line = line.removeprefix(prefix)
    return line.rstrip(".") + "."


def submit(
    plan: LaunchPlan,
    script: str,
    *,
    nodes: int,
    partition: str | None = None,
    timeout: float = 900.0,
    say: Callable[[str], None] = lambda _: None,
    stop_flag: Callable[[], bool] = lambda: False,
) -> RunRecord:
    """sbatch the rendered `script`, record the run, wait until it serves. An sbatch refusal is
    InputError (nothing recorded); a job that ends first is LaunchError with Slurm's reason; on
    timeout or a stop request the job is cancelled."""
    run_dir = plan.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "job.sbatch"
    path.write_text(script)  # the key is not in it: sbatch's environment carries it
    output = run_dir / "slurm-%j.out"
    argv = _sbatch_argv(path, output, run_dir, partition)
    env = dict(os.environ)
    if plan.api_key:
        env[ENV_VAR] = plan.api_key
    done = _run(argv, env=env)
    if done.returncode != 0:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise InputError(
            f"sbatch refused the job: {_last_line(done.stderr or done.stdout)}",
            hint="nothing was submitted; check --partition and --nnodes against `sinfo`.",
        )
    job_id = done.stdout.strip().split(";")[0]
    record = RunRecord(
        id=plan.run_id,
        name=plan.name,
        role=plan.role,
        ab_group=plan.ab_group,
        url="",  # known once Slurm places the job
        model=plan.model,
        profile=plan.profile,
        pids=[],
        pgid=-1,  # no process group here; never 0, which killpg reads as the caller's own
        port=plan.port,
        host="",
        log_path=str(output).replace("%j", job_id),
        run_dir=str(run_dir),
        argv_redacted=plan.redacted_argv(),
        started_at=time.time(),
        gpus=plan.gpus,
        runtime=plan.runtime,
        extra={"slurm": {"job_id": job_id, "script": str(path), "nodes": None,
                         "partition": partition, "node_count": nodes, "sbatch": argv}},
    )  # fmt: skip
    runs.write_record(record)
    say(f"submitted Slurm job {job_id} ({nodes} node(s)); output {record.log_path}")
    try:
        return _wait_ready(record, plan.api_key, timeout, say, stop_flag)
    except BaseException as exc:
        from kimictl.runtime.serving.launcher import StopRequested

        current = runs.get_run(record.id)
        if current.state in runs.LIVE_STATES:
            stopped = isinstance(exc, StopRequested | KeyboardInterrupt)
            cancel(current, final=RunState.STOPPED if stopped else RunState.FAILED)
        raise


def _wait_ready(
    record: RunRecord,
    api_key: str | None,
    timeout: float,
    say: Callable[[str], None],
    stop_flag: Callable[[], bool],
) -> RunRecord:
    from kimictl.core.http1 import BlockingClient
    from kimictl.runtime.serving.launcher import StopRequested, _complete_one, health

    job_id = record.extra["slurm"]["job_id"]
    begin = time.monotonic()
    last = ""
    with BlockingClient() as client:
        while True:
            if stop_flag():
                raise StopRequested()
            info = job_info(job_id)
            if not info.active:
                why = _why(record, info)
                runs.update_record(record, state=RunState.FAILED, reason=why,
                                   ended_at=time.time(), exit_code=_exit_code(info))  # fmt: skip
                raise LaunchError(
                    f"{why}, before it served.",
                    hint=f"`kimictl logs {record.id}` shows its output.",
                )
            if info.state != last:
                say(info.describe() + (f" on {info.nodes}" if info.nodes else ""))
                last = info.state
            if info.state == "RUNNING" and not record.url and info.nodes:
                names = _hostnames(info.nodes)
                addr = _node_addr(names[0]) if names else info.nodes
                slurm = {**record.extra["slurm"], "nodes": names}
                record = runs.update_record(
                    record, host=addr, url=f"http://{addr}:{record.port}",
                    extra={**record.extra, "slurm": slurm},
                )  # fmt: skip
                say(f"API: {record.url} (model {record.model}); waiting for /health")
            if record.url and health(record.url, client=client) == 200:
                ok, _ = _complete_one(record.url, record.model, api_key, 60.0, client)
                if ok:
                    return runs.update_record(record, state=RunState.READY, ready_at=time.time())
            if time.monotonic() - begin > timeout:
                raise LaunchError(
                    f"Slurm job {job_id} not serving after {timeout:g} s ({info.state}); "
                    "kimictl cancelled it.",
                    hint="raise --timeout (a queued job waits for its nodes).",
                )
            time.sleep(2.0)


# ---------------------------------------------------------------- cancel


def cancel(record: RunRecord, *, final: RunState = RunState.STOPPED) -> RunRecord:
    """scancel the job and wait until it has left its nodes; a run already ended is only
    acknowledged (no longer listed by `ps`)."""
    job_id = record.extra["slurm"]["job_id"]
    info = job_info(job_id)
    if not info.active:
        record, state, reason = observe(record)
        record = settle(record, state, reason)
        return runs.update_record(record, extra={**record.extra, "unseen": False})
    record = runs.update_record(record, state=RunState.STOPPING)
    done = _run(["scancel", job_id])
    if done.returncode != 0:
        raise LaunchError(f"scancel {job_id} failed: {_last_line(done.stderr)}")
    deadline = time.monotonic() + CANCEL_WAIT_S
    while info.active and time.monotonic() < deadline:
        time.sleep(1.0)
        info = job_info(job_id)
    if info.active:
        raise LaunchError(
            f"Slurm job {job_id} still {info.state} {CANCEL_WAIT_S:g} s after scancel.",
            hint="`squeue -j JOB` and the node's slurmd log show what holds it.",
        )
    slurm = {**record.extra["slurm"], **info.to_json()}
    return runs.update_record(
        record, state=final, ended_at=time.time(), exit_code=_exit_code(info),
        extra={**record.extra, "slurm": slurm, "unseen": False},
    )  # fmt: skip
