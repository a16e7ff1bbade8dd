"""Shared fixtures. `cpu_server`: ONE real vLLM CPU server (tiny K2-architecture model) per test
session, shared by every slow test (2 cores cannot run several at once)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

STARTUP_TIMEOUT_S = 600  # 30 s alone on 2 cores; far more when the box is shared


@dataclass(frozen=True)
class Server:
    url: str
    model: str
    process: subprocess.Popen[bytes]
    log_path: Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torch_python() -> str | None:
    """An interpreter with torch: this one, else the CPU vLLM runtime kimictl sets up (CI runs
    `kimictl setup cpu-runtime`), else None."""
    try:
        import torch  # noqa: F401

        return sys.executable
    except ImportError:
        pass
    from kimictl.runtime.serving import cpu_runtime

    return str(cpu_runtime.python_path()) if cpu_runtime.is_installed() else None


def niceness(pid: int) -> int:
    """The CPU niceness of a running process (field 19 of /proc/PID/stat)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def start_cpu_server(
    run_dir: Path,
    *,
    perturb: str | None = None,
    port: int | None = None,
    max_model_len: int = 2048,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Server:
    """Start a real vLLM CPU server and wait until it answers a one-token completion; `env` is
    added to the server's environment."""
    from kimictl.core.http1 import own_request_headers
    from kimictl.runtime.serving import cpu_runtime, launcher, tinymodel
    from kimictl.runtime.serving.plan import run_tmp_dir

    if not cpu_runtime.is_installed():
        pytest.skip("kimictl's CPU vLLM runtime is missing: run `kimictl setup cpu-runtime`")
    model_dir = tinymodel.build(0, perturb)
    port = port or free_port()
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "vllm.log"
    base_env = env or {}
    env = cpu_runtime.server_env(run_dir)
    env.update(base_env)
    # pytest's folders can be too deep for vLLM's unix socket paths: the launcher's rule decides.
    env["TMPDIR"] = str(run_tmp_dir(run_dir, f"test-{port}"))
    Path(env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cpu_runtime.server_argv(model_dir, port=port, max_model_len=max_model_len, extra=extra),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # as serve does: niced, and gone with this process (a killed benchmark leaves no server)
            preexec_fn=launcher.child_setup(os.getpid(), cpu_runtime.SERVER_NICE),
        )
    server = Server(f"http://127.0.0.1:{port}", "tiny-k2", proc, log_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"vLLM exited with {proc.returncode}: {log_path.read_text()[-2000:]}"
            )
        try:
            reply = httpx.post(  # kimictl's own request: never captured or judged
                f"{server.url}/v1/completions",
                json={"model": server.model, "prompt": "hi", "max_tokens": 1},
                headers=own_request_headers("probe"),
                timeout=10,
            )
            if reply.status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_cpu_server(server)
    raise RuntimeError(
        f"vLLM not ready after {STARTUP_TIMEOUT_S} s: {log_path.read_text()[-2000:]}"
    )


def stop_cpu_server(server: Server) -> None:
    import signal

    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()


def start_cpu_server_retrying(run_dir: Path, attempts: int = 2, **kwargs: object) -> Server:
    """On an overloaded 2-core box vLLM's worker can fail to initialise once; try again."""
    for attempt in range(1, attempts + 1):
        try:
            return start_cpu_server(run_dir / f"attempt{attempt}", **kwargs)  # type: ignore[arg-type]
        except RuntimeError:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def run_cli_diagnosed(
    args: list[str], *, timeout: float, server: Server | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m kimictl ARGS` in its own process. If it outlives `timeout`, fail with where it
    was (faulthandler's stacks), what the machine was running and the server log's tail."""
    import signal
    import sys

    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kimictl", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        out, err = proc.communicate()
        top = subprocess.run(
            ["ps", "-eo", "pid,ppid,stat,pcpu,rss,etimes,args", "--sort=-pcpu"],
            capture_output=True,
            text=True,
        ).stdout
        log = server.log_path.read_text(errors="replace")[-3000:] if server else ""
        pytest.fail(
            f"kimictl {' '.join(args)} ran past {timeout:g} s.\n--- its stderr:\n{err[-6000:]}"
            f"\n--- processes:\n{top[:4000]}\n--- server log tail:\n{log}"
        )
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="session")
def cpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_cpu_server_retrying(tmp_path_factory.mktemp("cpu-server"))
    try:
        yield server
    finally:
        stop_cpu_server(server)
