"""Run records: what kimictl launched, where it listens, and whether it is still alive.

One folder per run under `paths.runs_dir()/<id>/` holds `run.json` (written atomically), the vLLM
log and the run's private cache/temp folders. Records are the contract other commands read:
`bench`, `monitor` and `validate` turn a run id, `NAME=URL` or a URL into a `Target` through
`resolve_target`, and find the latest A/B pair through `latest_ab_pair`.

States: starting -> ready -> stopping -> stopped; failed (never ready) or died (after ready).
Who writes an end (a stop, a watcher or `ps` that saw a death) decides under the run's lock
(`record_lock`): `begin_stop` marks the record before any signal is sent, and a death is only
written down (`claim_death`) while no stop has begun, so a member ended by a stop is never taken
for a death.
A record's stored state is what the launcher last wrote; `observed_state` corrects it with what is
true now: a run is only as alive as the members recorded when it became ready (API server, engine
core, workers), so a "ready" run with one of them gone is reported as died, never as ready.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kimictl.core.errors import InputError
from kimictl.core.jsondoc import dumps
from kimictl.core.outputs import atomic_write
from kimictl.core.paths import runs_dir
from kimictl.core.urls import server_root

__all__ = [
    "RECORD_FILE",
    "RunRecord",
    "RunState",
    "Target",
    "Member",
    "get_run",
    "group_members",
    "missing_members",
    "is_alive",
    "ORPHAN_GRACE_S",
    "ab_targets",
    "begin_stop",
    "claim_death",
    "clean_run_files",
    "end_dead",
    "end_group",
    "latest_ab_pair",
    "list_runs",
    "new_run_id",
    "observed_state",
    "process_start_ticks",
    "read_record",
    "record_lock",
    "resolve_target",
    "resolve_targets",
    "run_dir_for",
    "update_record",
    "wait_gone",
    "write_record",
]

RECORD_FILE = "run.json"
LOCK_FILE = "run.lock"  # flock'ed around every read-decide-write of an end (see record_lock)
# What is left of a deployment whose API server or a member died gets this long to exit on
# SIGTERM before SIGKILL: engine cores and workers re-parented to pid 1 ignore SIGTERM, and a
# worker holds its whole share of the model's memory meanwhile.
ORPHAN_GRACE_S = 2.0


class RunState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"  # never became ready
    DIED = "died"  # a member of the deployment died after ready


LIVE_STATES = (RunState.STARTING, RunState.READY, RunState.STOPPING)


@dataclass(frozen=True)
class RunRecord:
    """One launched server. `url` is the server base (no `/v1`), e.g. http://127.0.0.1:8000."""

    id: str
    name: str
    role: str | None  # "tuned" | "stock" | None
    ab_group: str | None
    url: str
    model: str  # the served model name clients must send
    profile: str | None
    pids: list[int]
    pgid: int
    port: int
    host: str
    log_path: str
    run_dir: str
    argv_redacted: list[str]
    started_at: float
    gpus: int
    state: RunState = RunState.STARTING
    runtime: str = "gpu"  # "gpu" | "cpu"
    # The leader's start time in clock ticks since boot (/proc/PID/stat field 22): guards against
    # a recycled PID being taken for our server.
    start_ticks: int | None = None
    # The kimictl process supervising a foreground run (None once detached).
    supervisor_pid: int | None = None
    ready_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    # The deployment's processes when it became ready (`Member.to_json()` each): any of them gone
    # means the deployment is broken, whatever the others still answer.
    members: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # When `kimictl stop` (or a foreground stop) began, written before its first signal: from
    # then on a member gone is the stop's doing, never a death.
    stop_begun_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["state"] = RunState(kwargs.get("state", RunState.STARTING))
        return cls(**kwargs)

    @property
    def leader_pid(self) -> int:
        return self.pids[0] if self.pids else self.pgid


@dataclass(frozen=True)
class Target:
    """An endpoint to talk to. `model` is None when only a URL was given (ask /v1/models)."""

    name: str
    url: str
    model: str | None
    gpus: int | None
    run_id: str | None = None
    role: str | None = None


# ---------------------------------------------------------------- ids, folders, atomic writes


_ID_SAFE = re.compile(r"[^a-z0-9-]+")
_ID_SHAPE = re.compile(r"[a-z0-9][a-z0-9-]*")  # what new_run_id can produce (and its prefixes)


def new_run_id(name: str) -> str:
    """`<name>-<4 hex>`, e.g. `cpu-demo-3f9a`; unique among existing run folders."""
    stem = _ID_SAFE.sub("-", name.lower()).strip("-")[:40] or "run"
    for _ in range(100):
        candidate = f"{stem}-{secrets.token_hex(2)}"
        if not run_dir_for(candidate).exists():
            return candidate
    return f"{stem}-{secrets.token_hex(6)}"


def run_dir_for(run_id: str) -> Path:
    return runs_dir() / run_id


def write_record(record: RunRecord) -> Path:
    """Write `run.json` atomically (temp file in the same folder, fsync, rename)."""
    target = Path(record.run_dir) / RECORD_FILE
    return atomic_write(target, dumps(record.to_json()), mode=0o600)


def update_record(record: RunRecord, **changes: Any) -> RunRecord:
    """Return the record with `changes` applied, and write it (atomically)."""
    updated = replace(record, **changes)
    write_record(updated)
    return updated


def read_record(run_id: str) -> RunRecord | None:
    """The record of `run_id` as stored (not corrected by `observed_state`); None if absent."""
    return _read_record(run_dir_for(run_id) / RECORD_FILE)


def _read_record(path: Path) -> RunRecord | None:
    try:
        return RunRecord.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None  # a half-deleted or foreign folder is not a run


def _stored(record: RunRecord) -> RunRecord | None:
    return _read_record(Path(record.run_dir) / RECORD_FILE)


@contextlib.contextmanager
def record_lock(record: RunRecord) -> Iterator[None]:
    """Hold the run's lock (flock on `run.lock` beside its record) for a read-decide-write of
    its end; without a run folder (it was removed) there is nothing to guard."""
    try:
        fd = os.open(Path(record.run_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        fd = None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # closing releases the lock


_ENDED = (RunState.STOPPED, RunState.FAILED, RunState.DIED)


def begin_stop(record: RunRecord) -> RunRecord:
    """Mark the run as being stopped, under its lock, before any signal: a live run becomes
    stopping; an end already known (died, failed: stored, or as `record` observed it) is kept.
    Returns the record as stored now (a stop already begun is left as it is)."""
    with record_lock(record):
        stored = _stored(record) or record
        if stored.stop_begun_at is not None:
            return stored
        if stored.state in _ENDED:
            state = stored.state
        elif record.state in _ENDED:
            state, stored = record.state, replace(stored, reason=record.reason or stored.reason)
        else:
            state = RunState.STOPPING
        return update_record(stored, state=state, stop_begun_at=time.time())


def claim_death(record: RunRecord) -> RunRecord | None:
    """Write down `record` (observed died, with its reason) as died, under the run's lock, unless
    a stop has begun: then a member gone is the stop's doing, and None is returned (nothing is
    written, nothing should be signalled). A death already written is returned as stored."""
    with record_lock(record):
        stored = _stored(record)
        if stored is None:
            return record
        if stored.stop_begun_at is not None or stored.state not in (RunState.READY, RunState.DIED):
            return None
        if stored.state is RunState.DIED:
            return stored
        return update_record(
            stored, state=RunState.DIED, reason=record.reason, ended_at=time.time()
        )


# ---------------------------------------------------------------- liveness


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = stat[stat.rfind(")") + 2 :].split()
    if not rest or rest[0] in ("Z", "X"):
        return None
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg succeeds while only zombies remain; look for one live member.
    return any(True for _ in _live_in_group(pgid))


def _live_in_group(pgid: int) -> Iterator[tuple[int, int | None]]:
    """(pid, start ticks) of every live (non-zombie) process of a process group, from /proc."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) > 2 and rest[2] == str(pgid) and rest[0] not in ("Z", "X"):
            yield int(entry.name), int(rest[19]) if len(rest) > 19 else None


@dataclass(frozen=True)
class Member:
    """One process of a deployment, named by what vLLM calls it (its process title)."""

    pid: int
    role: str  # "API server" | "engine core" | "worker" | "coordinator"
    start_ticks: int | None

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "role": self.role, "start_ticks": self.start_ticks}

    def alive(self) -> bool:
        ticks = process_start_ticks(self.pid)
        return ticks is not None and ticks == self.start_ticks


# vLLM's process titles (vllm/utils/system_utils.set_process_title: `<prefix>::<name>`, set when
# setproctitle is installed, as vLLM's own requirements have it), in the order they are looked
# for. Processes with none of them (compile pools, resource trackers) come and go.
_ROLES = (
    ("EngineCore", "engine core"),
    ("Worker", "worker"),
    ("DPCoordinator", "coordinator"),
    ("APIServer", "API server"),
)


def _role(pid: int, leader: int) -> str | None:
    if pid == leader:
        return "API server"
    try:
        title = (
            Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        )
    except OSError:
        return None
    for marker, role in _ROLES:
        if f"::{marker}" in title:  # the prefix is VLLM_PROCESS_NAME_PREFIX (default VLLM)
            return role
    return None


def group_members(record: RunRecord) -> list[Member]:
    """The live processes of the run's group that make up the deployment (the leader, engine
    cores, workers), found through /proc."""
    found: list[Member] = []
    for pid, ticks in _live_in_group(record.pgid):
        role = _role(pid, record.leader_pid)
        if role is not None and ticks is not None:
            found.append(Member(pid, role, ticks))
    found.sort(key=lambda m: (m.pid != record.leader_pid, m.pid))
    return found


def missing_members(record: RunRecord) -> list[Member]:
    """The recorded members that are gone (a recycled PID counts as gone)."""
    members = [Member(m["pid"], m["role"], m.get("start_ticks")) for m in record.members]
    return [m for m in members if not m.alive()]


def is_alive(record: RunRecord) -> bool:
    """True while any process of the run's process group lives (a recycled PID does not count);
    for a Slurm run, while its job holds or waits for nodes."""
    if "slurm" in record.extra:
        from kimictl.runtime.serving import slurm

        return slurm.job_info(record.extra["slurm"]["job_id"]).active
    if record.start_ticks is not None:
        ticks = process_start_ticks(record.leader_pid)
        if ticks is not None and ticks == record.start_ticks:
            return True
    return _group_alive(record.pgid)


def observed_state(record: RunRecord) -> tuple[RunState, str | None]:
    """The state as it is now, and why it differs from the stored one (None when it does not)."""
    alive = is_alive(record)
    supervisor_gone = (
        record.supervisor_pid is not None and process_start_ticks(record.supervisor_pid) is None
    )
    if record.state in (RunState.STARTING, RunState.READY) and not alive and supervisor_gone:
        return RunState.STOPPED, (
            f"the kimictl (pid {record.supervisor_pid}) running it in the foreground exited "
            "and the server ended with it"
        )
    if record.state is RunState.READY and alive:
        gone = missing_members(record)
        if gone:
            return RunState.DIED, (
                f"its {', '.join(f'{m.role} (pid {m.pid})' for m in gone)} died after ready"
            )
    if record.state in (RunState.STARTING, RunState.READY) and not alive:
        if record.state is RunState.READY:
            return RunState.DIED, "its processes are gone (the engine died after ready)"
        return RunState.FAILED, "its processes are gone (vLLM exited during start-up)"
    if alive and supervisor_gone and record.state in (RunState.STARTING, RunState.READY):
        return record.state, (
            f"the kimictl (pid {record.supervisor_pid}) that started it is gone; "
            "`kimictl stop` ends it"
        )
    if record.state is RunState.STOPPING and not alive:
        return RunState.STOPPED, None
    return record.state, None


# ---------------------------------------------------------------- queries


def _as_observed(record: RunRecord) -> RunRecord:
    state, reason = observed_state(record)
    if state is not record.state:
        return replace(record, state=state, reason=reason or record.reason)
    return replace(record, reason=reason) if reason else record


def list_runs(*, include_finished: bool = False) -> list[RunRecord]:
    """Runs with a record, oldest first, with their observed state. Finished ones (stopped, or
    failed with no process left) only when `include_finished`."""
    folder = runs_dir()
    if not folder.is_dir():
        return []
    found: list[RunRecord] = []
    for entry in folder.iterdir():
        record = _read_record(entry / RECORD_FILE)
        if record is None:
            continue
        if "slurm" in record.extra:
            found += _slurm_listed(record, include_finished)
            continue
        stored = record.state
        record = _as_observed(record)
        # a death nobody saw (a detached run) stays listed until `kimictl stop` records it
        unseen = record.state is RunState.DIED and stored in LIVE_STATES
        live = record.state in LIVE_STATES or unseen or is_alive(record)
        if live or include_finished:
            found.append(record)
    found.sort(key=lambda r: (r.started_at, r.id))
    return found


def _slurm_listed(record: RunRecord, include_finished: bool) -> list[RunRecord]:
    """A Slurm run as Slurm sees it now; an end found now is written down (Slurm forgets)."""
    from kimictl.runtime.serving import slurm

    stored = record.state
    record, state, reason = slurm.observe(record)
    record = slurm.settle(record, state, reason)
    if state is not record.state or reason:
        record = replace(record, state=state, reason=reason or record.reason)
    # a death nobody saw stays listed until `kimictl stop` acknowledges it (clears "unseen")
    unseen = state is RunState.DIED and (stored in LIVE_STATES or bool(record.extra.get("unseen")))
    listed = state in LIVE_STATES or unseen
    return [record] if listed or include_finished else []


def get_run(run_id: str) -> RunRecord:
    """The run with this id, or the only run whose id starts with it. InputError otherwise."""
    runs = list_runs(include_finished=True)
    exact = [r for r in runs if r.id == run_id]
    if exact:
        return exact[0]
    prefixed = [r for r in runs if r.id.startswith(run_id)] if run_id else []
    if len(prefixed) == 1:
        return prefixed[0]
    if len(prefixed) > 1:
        raise InputError(
            f"run id '{run_id}' is ambiguous: it matches {', '.join(r.id for r in prefixed)}.",
            hint="give more of the id (see `kimictl ps`).",
        )
    live = [r.id for r in runs if r.state in LIVE_STATES]
    known = ", ".join(live) if live else "none running"
    raise InputError(
        f"no run with id '{run_id}' (known runs: {known}).",
        hint="`kimictl ps --all` lists every run kimictl recorded.",
    )


def latest_ab_pair() -> tuple[RunRecord, RunRecord] | None:
    """The most recent A/B group whose two servers are both alive, as (tuned, stock)."""
    groups: dict[str, dict[str, RunRecord]] = {}
    for record in list_runs():
        if record.ab_group and record.role in ("tuned", "stock") and is_alive(record):
            groups.setdefault(record.ab_group, {})[record.role] = record
    complete = [g for g in groups.values() if "tuned" in g and "stock" in g]
    if not complete:
        return None
    latest = max(complete, key=lambda g: max(g["tuned"].started_at, g["stock"].started_at))
    return latest["tuned"], latest["stock"]


def ab_targets(names: tuple[str, str], *, missing: str, hint: str) -> tuple[Target, Target]:
    """The latest live `serve --ab` pair as two targets named `names` (tuned first, then stock);
    InputError(`missing`, `hint`) when there is none. Bench, monitor and validate use it."""
    pair = latest_ab_pair()
    if pair is None:
        raise InputError(missing, hint=hint)
    return _target_of(pair[0], names[0]), _target_of(pair[1], names[1])


def _check_url(url: str, text: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as error:
        raise InputError(f"'{text}' is not a valid URL ({error}).") from error
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(
            f"'{text}' is not a target: expected a URL (http://HOST:PORT), NAME=URL or a run id.",
            hint="`kimictl ps` lists run ids.",
        )
    return server_root(url)


def _target_of(record: RunRecord, name: str | None = None) -> Target:
    return Target(
        name=name or record.role or record.id,
        url=record.url,
        model=record.model,
        gpus=record.gpus,
        run_id=record.id,
        role=record.role,
    )


def resolve_target(text: str) -> Target:
    """`URL`, `NAME=URL`, `NAME=RUN_ID`, a run id (or unique prefix), or `tuned`/`stock` (the
    latest live A/B pair). Raises InputError for anything else."""
    text = text.strip()
    if not text:
        raise InputError("empty target: expected a URL, NAME=URL or a run id.")
    name: str | None = None
    value = text
    if "=" in text and "://" not in text.split("=", 1)[0]:
        name, value = (part.strip() for part in text.split("=", 1))
        if not name or not value:
            raise InputError(f"'{text}' is not a target: expected NAME=URL with both parts.")
    if "://" in value:
        url = _check_url(value, text)
        return Target(name=name or (urlsplit(url).netloc or url), url=url, model=None, gpus=None)
    if value in ("tuned", "stock"):
        pair = latest_ab_pair()
        if pair is not None:
            record = pair[0] if value == "tuned" else pair[1]
            return _target_of(record, name)
    if not _ID_SHAPE.fullmatch(value):
        raise _neither_url_nor_id(value)
    record = get_run(value)
    if record.state not in LIVE_STATES:
        raise InputError(
            f"run '{record.id}' is {record.state.value}"
            + (f" ({record.reason})" if record.reason else "")
            + ": it has no live endpoint.",
            hint=f"`kimictl logs {record.id}` shows why; start it again with `kimictl serve`.",
        )
    if not record.url:  # a Slurm job not placed yet
        raise InputError(
            f"run '{record.id}' has no endpoint yet ({record.reason or 'not placed'}).",
            hint="`kimictl ps` shows when it runs.",
        )
    return _target_of(record, name)


def resolve_targets(texts: Sequence[str], *, missing: str, hint: str, apart: str) -> list[Target]:
    """Each of `texts` resolved (`resolve_target`), or, given none, the latest live A/B pair
    (tuned, stock; InputError(`missing`, `hint`) without one). Two targets of one name are refused:
    `apart` shows how to name them (`a=URL b=URL`)."""
    if not texts:
        return list(ab_targets(("tuned", "stock"), missing=missing, hint=hint))
    targets = [resolve_target(t) for t in texts]
    seen: set[str] = set()
    for t in targets:
        if t.name in seen:
            raise InputError(f"two targets are named '{t.name}'; name them apart, e.g. {apart}.")
        seen.add(t.name)
    return targets


def _neither_url_nor_id(value: str) -> InputError:
    """`htp:/127.0.0.1:8100`, `localhost:8000`: say what a URL and a run id look like."""
    rest = re.sub(r"^[A-Za-z][A-Za-z0-9+.-]*:/*", "", value) if "/" in value else value
    guess = f"; did you mean http://{rest}?" if re.fullmatch(r"[\w.-]+:\d+(/.*)?", rest) else "."
    return InputError(
        f"'{value}' is neither a URL nor a run id: a URL looks like http://127.0.0.1:8000 "
        f"(http or https), a run id like cpu-demo-3f9a{guess}",
        hint="`kimictl ps` lists the run ids of the servers kimictl launched.",
    )


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def end_group(record: RunRecord, grace: float) -> None:
    """SIGTERM the run's process group, SIGKILL what is left after `grace` seconds."""
    _signal_group(record.pgid, signal.SIGTERM)
    if not wait_gone(record, grace):
        _signal_group(record.pgid, signal.SIGKILL)
        wait_gone(record, 10.0)


def _live_count(pgid: int) -> int:
    return sum(1 for _ in _live_in_group(pgid))


def end_dead(record: RunRecord, *, grace: float = ORPHAN_GRACE_S) -> RunRecord:
    """A died deployment (a member gone) with processes of its group still running: end them
    (SIGKILL after `grace`), record it as died with what was ended and what is really left.
    Any other record, or one whose foreground supervisor lives (it does this itself), is returned
    as it is. Used by the detached run's watcher and by `ps`."""
    if record.state is not RunState.DIED:
        return record
    supervisor = record.supervisor_pid
    if supervisor is not None and process_start_ticks(supervisor) is not None:
        return record
    if not _live_count(record.pgid):
        return record
    claimed = claim_death(record)
    if claimed is None:  # a stop has begun: it ends the group and writes the end
        stored = _stored(record)
        return _as_observed(stored) if stored is not None else record
    before = _live_count(record.pgid)
    end_group(claimed, grace)
    left = _live_count(record.pgid)
    cause = (claimed.reason or "a member died after ready").split("; kimictl ended", 1)[0]
    ended = f"kimictl ended the {before - left} process(es) left of its group"
    reason = f"{cause}; {ended}" + (f"; {left} could not be ended" if left else "")
    with record_lock(record):
        stored = _stored(record)
        if stored is not None and stored.stop_begun_at is not None:
            return _as_observed(stored)  # a stop began meanwhile: its end is the one written
        ended_record = update_record(
            claimed, state=RunState.DIED, reason=reason, supervisor_pid=None
        )
    if not left:
        clean_run_files(ended_record)
    return ended_record


def clean_run_files(record: RunRecord) -> None:
    """Remove what a run's processes leave that nothing reads once they are gone: its temp
    folder (vLLM's zmq sockets) and any socket file in the run folder. Logs and the record stay."""
    run_dir = Path(record.run_dir)
    tmp_dir = record.extra.get("tmp_dir")
    for folder in {run_dir / "tmp", *([Path(tmp_dir)] if tmp_dir else [])}:
        shutil.rmtree(folder, ignore_errors=True)
    for path in run_dir.rglob("*"):
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()


def wait_gone(record: RunRecord, timeout: float) -> bool:
    """Poll until the run's processes are gone; True if they are."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(record):
            return True
        time.sleep(0.1)
    return not is_alive(record)
