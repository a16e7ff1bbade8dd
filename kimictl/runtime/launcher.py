"""Start, watch and stop vLLM servers: one process group per run, logs in the run folder.

Lifetime (style anchor 11): a run moves starting -> ready -> stopping -> stopped, or to failed.
- `plan_launch` turns a DeploymentSpec into a `LaunchPlan` (argv + env, secrets kept out of argv).
- `start` checks the port, starts vLLM in its own session (so its whole tree is one process group),
  sends its output to `<run_dir>/vllm.log` and writes the run record (atomically, runs.py).
  Foreground runs ask the kernel to SIGTERM vLLM when kimictl dies (PR_SET_PDEATHSIG); detached
  runs outlive kimictl on purpose and are found again through their record (`kimictl ps`).
- `wait_ready` reads start-up phases from the log and declares ready only when /health answers 200
  AND a one-token completion succeeds (a healthy server can still die on its first request).
  vLLM exiting meanwhile becomes a LaunchError with the exit code, the last 40 log lines and the
  likely cause.
- `supervise` watches a ready foreground run until a stop is asked (SIGINT/SIGTERM) or the engine
  dies, which is reported (EndpointError), never hidden.
- `stop_run` sends SIGTERM to the group, SIGKILL after the grace period, reaps, and removes the
  run's temp folder (vLLM leaves its ZMQ socket files there even after a clean exit).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from kimictl.runtime import runs
from kimictl.runtime.apikeys import read_api_key
from kimictl.runtime.errors import EndpointError, InputError, KimictlError, LaunchError
from kimictl.runtime.runs import RunRecord, RunState
from kimictl.runtime.stack import VLLM_VERSION

if TYPE_CHECKING:
    from kimictl.runtime.deployment import DeploymentSpec

__all__ = [
    "CPU_DEMO",
    "DEFAULT_PORT",
    "HEADLESS_SETTLE_S",
    "LOG_TAIL_LINES",
    "STOP_GRACE_S",
    "Launch",
    "LaunchPlan",
    "Prepared",
    "ServeRequest",
    "StopRequested",
    "check_port_free",
    "cpu_checks",
    "hand_over",
    "health",
    "likely_cause",
    "log_tail",
    "plan_launch",
    "prepare_serve",
    "read_api_key",
    "read_phases",
    "redact_argv",
    "refuse_if_blocked",
    "run_serve",
    "run_tmp_dir",
    "start",
    "stop_launches",
    "stop_records",
    "stop_run",
    "stop_signals",
    "supervise",
    "wait_ready",
]

DEFAULT_PORT = 8000
LOG_TAIL_LINES = 40
STOP_GRACE_S = 20.0
HEADLESS_SETTLE_S = 10.0
LOG_NAME = "vllm.log"
SECRET_ENV = ("VLLM_API_KEY",)


class StopRequested(Exception):
    """SIGINT/SIGTERM arrived while kimictl was waiting; the caller stops the runs it started."""


# ---------------------------------------------------------------- plans


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start one server. `env` is what kimictl adds to the environment."""

    run_id: str
    name: str
    profile: str | None
    runtime: str  # "gpu" | "cpu"
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    model: str  # served model name
    gpus: int
    run_dir: Path
    role: str | None = None
    ab_group: str | None = None
    # Commands other nodes run (multi-node mp backend): printed, never executed by kimictl.
    other_nodes: list[list[str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def headless(self) -> bool:
        return "--headless" in self.argv

    @property
    def log_path(self) -> Path:
        return self.run_dir / LOG_NAME

    @property
    def api_key(self) -> str | None:
        return self.env.get("VLLM_API_KEY")

    def redacted_env(self) -> dict[str, str]:
        return {k: ("***" if _is_secret(k) else v) for k, v in self.env.items()}

    def redacted_argv(self) -> list[str]:
        return redact_argv(self.argv)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "name": self.name,
            "profile": self.profile,
            "runtime": self.runtime,
            "role": self.role,
            "ab_group": self.ab_group,
            "url": self.url,
            "model": self.model,
            "gpus": self.gpus,
            "argv": self.redacted_argv(),
            "env": self.redacted_env(),
            "log_path": str(self.log_path),
            "other_nodes": [redact_argv(a) for a in self.other_nodes],
        }


_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)", re.IGNORECASE)


def _is_secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redact_argv(argv: list[str]) -> list[str]:
    """Hide the value after `--api-key` (kimictl never puts it there; a user's extra args might)."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append("***")
            hide_next = False
        elif word == "--api-key":
            out.append(word)
            hide_next = True
        elif word.startswith("--api-key="):
            out.append("--api-key=***")
        else:
            out.append(word)
    return out


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or Path(model).expanduser().exists()


def plan_launch(
    spec: DeploymentSpec,
    *,
    name: str,
    profile: str | None = None,
    runtime: str = "gpu",
    host: str | None = None,
    port: int | None = None,
    api_key: str | None = None,
    role: str | None = None,
    ab_group: str | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    ray: bool = False,
    run_id: str | None = None,
) -> LaunchPlan:
    """Resolve the model, pick the executable and environment, and fix host and port."""
    from kimictl.runtime import cpu_runtime, tinymodel

    host = host or spec.host or "127.0.0.1"
    port = port if port is not None else (spec.port or DEFAULT_PORT)
    require_tcp_port(port)
    run_id = run_id or runs.new_run_id(name)
    run_dir = runs.run_dir_for(run_id)

    model = spec.model
    served = spec.served_model_name
    if model.startswith(tinymodel.TINY_MODEL):
        served = served or "tiny-k2"
        if runtime == "cpu":
            cpu_runtime.require_installed()
        model = str(tinymodel.resolve_model(model))
    elif _looks_like_path(model):
        resolved = Path(model).expanduser()
        if not resolved.is_dir():
            raise InputError(
                f"model path '{model}' does not exist or is not a folder.",
                hint="pass --model with a local model folder or a Hugging Face id (org/name).",
            )
        if not (resolved / "config.json").is_file() and not (resolved / "params.json").is_file():
            raise InputError(
                f"model folder '{model}' has no config.json (nor params.json) for vLLM to load.",
                hint="point --model at the folder holding the checkpoint's config.json.",
            )
        model = str(resolved.resolve())
    elif runtime == "cpu":
        raise InputError(
            f"model '{model}' is not a local folder; the CPU runtime runs offline.",
            hint="pass --model with a local model folder, or @tiny-k2 for the built-in model.",
        )
    served = served or spec.model

    spec = spec.with_(model=model, served_model_name=served, host=host, port=port)
    if ray:
        spec = spec.with_(distributed_executor_backend="ray")
    env: dict[str, str] = {}
    if runtime == "cpu":
        if not spec.enforce_eager:
            spec = spec.with_(enforce_eager=True)  # torch.compile's cache never reloads on CPU
        env.update(cpu_runtime.server_env(run_dir, base={}, create=False))
        executable = str(cpu_runtime.venv_dir() / "bin" / "vllm")
    else:
        executable = "vllm"
    env["TMPDIR"] = str(run_tmp_dir(run_dir, run_id))
    env.update(spec.to_env())
    if api_key:
        env["VLLM_API_KEY"] = api_key
    argv = spec.to_argv(executable)

    other_nodes: list[list[str]] = []
    if nnodes > 1:
        if master_addr is None:
            raise InputError("--nnodes above 1 needs --master-addr (the address of node rank 0).")
        if not 0 <= node_rank < nnodes:
            raise InputError(f"--node-rank {node_rank} is outside 0..{nnodes - 1}.")
        base = [*argv, "--nnodes", str(nnodes), "--master-addr", master_addr]
        argv = [*base, "--node-rank", str(node_rank)]
        if node_rank > 0:
            argv.append("--headless")
        other_nodes = [
            [*base, "--node-rank", str(rank), "--headless"]
            for rank in range(nnodes)
            if rank != node_rank and rank > 0
        ]
    return LaunchPlan(
        run_id=run_id,
        name=name,
        profile=profile,
        runtime=runtime,
        argv=argv,
        env=env,
        host=host,
        port=port,
        model=served,
        gpus=0 if runtime == "cpu" else spec.gpus_needed,
        run_dir=run_dir,
        role=role,
        ab_group=ab_group,
        other_nodes=other_nodes,
    )


# Linux limits a unix socket path to 107 bytes; vLLM names its ZMQ sockets with a 36-character
# uuid inside TMPDIR. A run folder too deep for that gets a short per-run folder in /tmp instead.
_SOCKET_PATH_MAX = 107 - 1 - 36 - 8


def run_tmp_dir(run_dir: Path, run_id: str) -> Path:
    """The run's private TMPDIR: `<run_dir>/tmp`, or `/tmp/kimictl-<id>` when that is too long."""
    inside = run_dir / "tmp"
    if len(str(inside)) <= _SOCKET_PATH_MAX:
        return inside
    import tempfile

    return Path(tempfile.gettempdir()) / f"kimictl-{run_id}"


# ---------------------------------------------------------------- ports


def require_tcp_port(port: int) -> None:
    if not 0 < port < 65536:
        raise InputError(f"--port {port} is not a TCP port; allowed: 1-65535.")


def check_port_free(host: str, port: int) -> None:
    """InputError naming who holds the port (a kimictl run if it is one) when it is taken."""
    require_tcp_port(port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Same option uvicorn sets: a port in TIME_WAIT is free, a listening one is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return
        except OSError as error:
            busy = error
    holder = next((r for r in runs.list_runs() if r.port == port), None)
    who = f" by kimictl run '{holder.id}'" if holder else ""
    raise InputError(
        f"port {port} on {host} is already in use{who} ({busy.strerror}).",
        hint=(
            f"`kimictl stop {holder.id}` frees it, or pick another with --port."
            if holder
            else "pick another with --port, or stop what listens there."
        ),
    )


# ---------------------------------------------------------------- start


def _die_with_parent(parent: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec
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
                preexec_fn=None if detach else _die_with_parent(os.getpid()),
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
    runs.write_record(record)
    return Launch(plan=plan, record=record, process=process)


# ---------------------------------------------------------------- start-up phases


# (pattern in vLLM's log, phase shown). Order = the order they happen in.
PHASES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"non-default args|vLLM API server version|version \d"), "starting API server"),
    (re.compile(r"Resolved architecture"), "reading model config"),
    (re.compile(r"Initializing a V1 LLM engine|EngineCore"), "starting engine"),
    (re.compile(r"Starting to load model|Loading safetensors|Loading weights"), "loading weights"),
    (re.compile(r"Compiling a graph|Dynamo bytecode transform|torch\.compile takes"), "compiling"),
    (re.compile(r"KV cache size|Available KV cache memory|init engine"), "allocating KV cache"),
    (
        re.compile(r"Capturing CUDA graph|Capturing cudagraph|Graph capturing"),
        "capturing CUDA graphs",
    ),
    (re.compile(r"Starting vLLM server on|Application startup complete"), "API up, warming"),
)


def read_phases(text: str) -> list[str]:
    """The start-up phases that `text` (a chunk of vLLM's log) shows, in log order."""
    found: list[str] = []
    for line in text.splitlines():
        for pattern, phase in PHASES:
            if pattern.search(line) and phase not in found:
                found.append(phase)
    return found


def log_tail(path: Path | str, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read().decode(errors="replace")
    except OSError:
        return []
    return data.splitlines()[-lines:]


# (pattern in the log, likely cause). First match wins; most specific first.
CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"Kimi K3 specialized decode does not support (.+?)[\"')]*$", re.M),
        "the K3 fast path refused this deployment: {0} (run `kimictl doctor --profile ...`)",
    ),
    (
        re.compile(r"Supported decode_backend values are"),
        "decode_backend must be auto or latency_specialized",
    ),
    (
        re.compile(r"Address already in use"),
        "the port was taken between kimictl's check and vLLM's bind; pick another --port",
    ),
    (
        re.compile(r"Head dimension \d+ is not supported by MLA"),
        "the CPU MLA kernel needs kv_lora_rank + qk_rope_head_dim == 576",
    ),
    (
        re.compile(r"(OutOfMemoryError|CUDA out of memory|No available memory for the cache)"),
        "out of memory: lower --gpu-memory-utilization, --max-model-len or --max-num-seqs",
    ),
    (
        re.compile(r"VLLM_CPU_KVCACHE_SPACE"),
        "the CPU KV cache does not fit: set VLLM_CPU_KVCACHE_SPACE (GiB) lower",
    ),
    (
        re.compile(r"(unrecognized arguments|error: argument|invalid choice)"),
        "a flag this vLLM version does not accept (see the log line above)",
    ),
    (
        re.compile(
            r"(does not appear to have a file named config\.json|HFValidationError|"
            r"Repo id must be|Invalid repository ID or local directory|is not a local folder)"
        ),
        "the model path or id cannot be read (offline, or the folder is missing files)",
    ),
    (
        re.compile(r"(Unrecognized model|does not recognize this architecture|model type `)"),
        "the model's config.json names an architecture this vLLM/transformers cannot load",
    ),
    (
        re.compile(r"(ModuleNotFoundError|ImportError|PackageNotFoundError)"),
        "the vLLM install is broken or incomplete: re-run `kimictl setup cpu-runtime` "
        "(CPU) or reinstall vLLM",
    ),
)


def likely_cause(lines: list[str], returncode: int | None) -> str:
    text = "\n".join(lines)
    for pattern, cause in CAUSES:
        match = pattern.search(text)
        if match:
            return cause.format(*(g.strip() for g in match.groups()))
    if returncode is not None and returncode in (-9, 137):
        return "killed by SIGKILL (often the kernel's out-of-memory killer: see `dmesg`)"
    if returncode is not None and returncode < 0:
        return f"killed by signal {signal.Signals(-returncode).name}"
    return "not recognised: read the log lines above"


def _startup_failure(launch: Launch, code: int | None, during: str) -> LaunchError:
    tail = log_tail(launch.plan.log_path)
    cause = likely_cause(tail, code)
    launch.record = _mark(launch.record, RunState.FAILED, exit_code=code, reason=cause)
    shown = "\n".join("  " + line for line in tail)
    return LaunchError(
        f"vLLM ({launch.plan.name}) exited {during} with exit code {code}; likely cause: {cause}.\n"
        f"last {len(tail)} lines of {launch.plan.log_path}:\n{shown}",
        hint=f"full log: {launch.plan.log_path}",
    )


def _stopped_elsewhere(launch: Launch) -> bool:
    try:
        current = runs.get_run(launch.record.id)
    except InputError:
        return False
    return current.state in (RunState.STOPPING, RunState.STOPPED)


def _mark(record: RunRecord, state: RunState, **changes: Any) -> RunRecord:
    if state in (RunState.STOPPED, RunState.FAILED):
        changes.setdefault("ended_at", time.time())
    return runs.update_record(record, state=state, **changes)


# ---------------------------------------------------------------- readiness


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def health(url: str, *, timeout: float = 2.0, client: httpx.Client | None = None) -> int | None:
    """The /health status code, or None when nothing answers."""
    try:
        if client is not None:
            return client.get(f"{url}/health", timeout=timeout).status_code
        return httpx.get(f"{url}/health", timeout=timeout).status_code
    except httpx.HTTPError:
        return None


def _client() -> httpx.Client:
    # One client per wait: a new client per poll builds an SSL context each time (measurable CPU
    # on a 2-core machine that is also running the server).
    return httpx.Client(trust_env=False)


def _one_token(plan: LaunchPlan, timeout: float, client: httpx.Client) -> tuple[bool, str]:
    try:
        reply = client.post(
            f"{plan.url}/v1/completions",
            json={"model": plan.model, "prompt": "Hello", "max_tokens": 1, "temperature": 0},
            headers=_headers(plan.api_key),
            timeout=timeout,
        )
    except httpx.HTTPError as error:
        return False, f"{type(error).__name__}: {error}"
    if reply.status_code != 200:
        return False, f"HTTP {reply.status_code}: {reply.text[:200]}"
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
    client: httpx.Client,
    timeout: float,
    on_phase: ProgressFn | None,
    stop_flag: Callable[[], bool],
    poll_s: float,
) -> None:
    pending = list(launches)
    begin = time.monotonic()
    next_probe: dict[str, float] = {}
    while pending:
        if stop_flag():
            raise StopRequested()
        now = time.monotonic()
        for launch in list(pending):
            elapsed = time.time() - launch.record.started_at
            _advance_phases(launch, elapsed, on_phase)
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
                    launch.record = _mark(launch.record, RunState.READY, ready_at=time.time())
                    if on_phase:
                        on_phase(launch, "running headless (the API is on rank 0)", elapsed)
                    pending.remove(launch)
                continue
            if health(launch.plan.url, timeout=2.0, client=client) != 200:
                continue
            if on_phase:
                on_phase(launch, "first completion", elapsed)
            ok, detail = _one_token(launch.plan, 60.0, client)
            if ok:
                launch.record = _mark(launch.record, RunState.READY, ready_at=time.time())
                if on_phase:
                    on_phase(launch, "ready", time.time() - launch.record.started_at)
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
            if on_phase:
                on_phase(launch, phase, elapsed)


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
    poll_s: float = 2.0,
    failures_to_dead: int = 2,
) -> None:
    """Watch ready runs until `stop_flag()`; raise EndpointError when an engine dies after ready
    (process gone, or /health not 200 on `failures_to_dead` polls in a row)."""
    with _client() as client:
        _supervise(launches, stop_flag, poll_s, failures_to_dead, client)


def _supervise(
    launches: list[Launch],
    stop_flag: Callable[[], bool],
    poll_s: float,
    failures_to_dead: int,
    client: httpx.Client,
) -> None:
    bad: dict[str, int] = {}
    while not stop_flag():
        for launch in launches:
            code = launch.returncode()
            if code is None and launch.plan.headless:
                continue  # no HTTP on a headless rank: alive is healthy
            status = (
                None if code is not None else health(launch.plan.url, timeout=5.0, client=client)
            )
            if code is None and status == 200:
                bad[launch.plan.run_id] = 0
                continue
            bad[launch.plan.run_id] = bad.get(launch.plan.run_id, 0) + 1
            # An explicit non-200 counts at once; no answer at all (a busy 2-core machine under
            # load can miss a 5 s /health) needs three times as many misses in a row.
            needed = failures_to_dead if status is not None else 3 * failures_to_dead
            if code is None and bad[launch.plan.run_id] < needed:
                continue
            if _stopped_elsewhere(launch):
                return  # `kimictl stop` from another shell: a stop, not a death
            if code is not None:
                what = f"exited with code {code}"
            elif status is None:
                what = f"/health did not answer {needed} times in a row"
            else:
                what = f"/health answered {status}"
            launch.record = _mark(
                launch.record,
                RunState.FAILED,
                exit_code=code,
                reason=f"engine died after ready: {what}",
            )
            tail = "\n".join("  " + line for line in log_tail(launch.plan.log_path))
            raise EndpointError(
                f"vLLM ({launch.plan.name}) died after it was ready: {what}; "
                f"likely cause: {likely_cause(log_tail(launch.plan.log_path), code)}.\n"
                f"last lines of {launch.plan.log_path}:\n{tail}",
                hint=f"full log: {launch.plan.log_path}",
            )
        deadline = time.monotonic() + poll_s
        while time.monotonic() < deadline and not stop_flag():
            time.sleep(0.1)


# ---------------------------------------------------------------- stop


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _clean_run_dir(run_dir: Path, tmp_dir: str | None) -> None:
    """Remove the run's temp folder and any socket file left in the run folder."""
    for folder in {run_dir / "tmp", *([Path(tmp_dir)] if tmp_dir else [])}:
        shutil.rmtree(folder, ignore_errors=True)
    for path in run_dir.rglob("*"):
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()


def stop_run(
    record: RunRecord,
    *,
    grace: float = STOP_GRACE_S,
    process: subprocess.Popen[bytes] | None = None,
    reason: str | None = None,
) -> RunRecord:
    """SIGTERM the run's group, SIGKILL after `grace` seconds, reap, clean, mark stopped."""
    final = record.state if record.state is RunState.FAILED else RunState.STOPPED
    if runs.is_alive(record):
        record = runs.update_record(record, state=RunState.STOPPING)
        _signal_group(record.pgid, signal.SIGTERM)
        if not runs.wait_gone(record, grace):
            _signal_group(record.pgid, signal.SIGKILL)
            runs.wait_gone(record, 10.0)
    code = record.exit_code
    if process is not None:
        try:
            code = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
    _clean_run_dir(Path(record.run_dir), record.extra.get("tmp_dir"))
    changes: dict[str, Any] = {"exit_code": code, "supervisor_pid": None}
    if reason:
        changes["reason"] = reason
    return _mark(record, final, **changes)


def stop_records(records: list[RunRecord], *, grace: float = STOP_GRACE_S) -> list[RunRecord]:
    """Stop several runs: SIGTERM them all first, so their grace periods overlap."""
    for record in records:
        if runs.is_alive(record):
            _signal_group(record.pgid, signal.SIGTERM)
    return [stop_run(record, grace=grace) for record in records]


def stop_launches(launches: list[Launch], *, grace: float = STOP_GRACE_S) -> None:
    """Stop several at once: SIGTERM all first, so their grace periods overlap."""
    for launch in launches:
        if runs.is_alive(launch.record):
            _signal_group(launch.record.pgid, signal.SIGTERM)
    for launch in launches:
        launch.record = stop_run(launch.record, grace=grace, process=launch.process)


def hand_over(launch: Launch) -> RunRecord:
    """Hand a ready run over to its record: no supervisor from now on."""
    launch.record = runs.update_record(launch.record, supervisor_pid=None)
    return launch.record


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
    for_render: bool = False


@dataclass
class Prepared:
    """The checked launch: plans (one, or tuned + stock), gate findings and notes for the user."""

    profile: str
    runtime: str
    plans: list[LaunchPlan]
    checks: list[Any]  # rules.Check
    notes: list[str] = field(default_factory=list)
    forced: bool = False

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
        }


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _load(name: str) -> Any:
    from kimictl.runtime.profiles import load_profile

    return load_profile(name)


def _has_gpu() -> bool:
    from kimictl.runtime import hardware

    return bool(hardware.probe_local(include_stack=False).gpus)


def cpu_checks(plan_model: str, host: str, ports: list[int]) -> list[Any]:
    """What the CPU runtime needs: its venv, a model it can read offline; ports (as warnings)."""
    from kimictl.runtime import cpu_runtime, tinymodel
    from kimictl.runtime.rules.base import Check, Section, Status

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


def _gate(
    spec: DeploymentSpec, runtime: str, host: str, ports: list[int], render: bool
) -> list[Any]:
    from kimictl.runtime.rules import evaluate

    if runtime == "cpu":
        return cpu_checks(spec.model, host, ports)
    if render:  # rendered for other machines: this machine's hardware is beside the point
        return evaluate(spec, None, None)
    from kimictl.runtime import hardware
    from kimictl.runtime.stack import probe_stack

    return evaluate(spec, hardware.probe_local(include_stack=False), probe_stack())


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
    runtime = str(getattr(profile, "runtime", "gpu"))
    if runtime == "cpu" and request.for_render:
        raise InputError(
            f"profile {profile.name} has runtime 'cpu': "
            "--render writes GPU cluster launchers only.",
            hint="render a GPU profile (see `kimictl profiles list`).",
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
    if not _is_loopback(host) and not api_key and not request.insecure:
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
    for (prof, role), run_port in zip(specs, ports, strict=True):
        spec = prof.spec
        if request.model:  # another model: the profile's served name no longer describes it
            spec = spec.with_(model=request.model, served_model_name=None)
        prof_runtime = str(getattr(prof, "runtime", "gpu"))
        if prof_runtime == "cpu" and not any(n == CPU_GATE_NOTE for n in notes):
            notes.append(CPU_GATE_NOTE)
        found = _gate(spec, prof_runtime, host, [run_port], request.for_render)
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
                nnodes=request.nnodes,
                node_rank=request.node_rank,
                master_addr=request.master_addr,
                ray=request.ray,
            )
        except InputError:
            raise  # bad input first: a missing model folder is the user's to fix, whatever the gate
        except KimictlError:
            if any(c.blocking for c in found):
                continue  # the gate already says why (e.g. no CPU runtime to resolve the model)
            raise
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
    )
    return prepared


def refuse_if_blocked(prepared: Prepared, *, dry_run: bool = False) -> None:
    """CheckFailed listing every blocking reason, unless the request was forced. A dry run fails
    too, so scripts can gate on `serve --dry-run`; its gate table (or JSON) already lists them."""
    from kimictl.runtime.errors import CheckFailed

    blocking = prepared.blocking
    if not blocking or prepared.forced:
        return
    hint = "fix the profile (see `kimictl doctor --profile`), or pass --force to launch anyway."
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
    launches: list[Launch] = []
    handed_over = False
    with stop_signals() as flag:
        try:
            for plan in prepared.plans:
                launches.append(start(plan, detach=detach))
            wait_ready(launches, timeout=timeout, on_phase=on_phase, stop_flag=flag)
            records = [launch.record for launch in launches]
            if detach:
                records = [hand_over(launch) for launch in launches]
                handed_over = True
                if on_ready:
                    on_ready(records)
                return records
            if on_ready:
                on_ready(records)
            supervise(launches, stop_flag=flag)
        except StopRequested:
            pass
        finally:
            if not handed_over:
                stop_launches(launches, grace=0.0 if flag.count > 1 else grace)
    return [launch.record for launch in launches]
