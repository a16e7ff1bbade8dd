"""Two hosts on one machine for the multi-host tests: network namespaces joined by a veth pair
(10.77.0.1 and 10.77.0.2), each with its own kimictl state folder (two machines share nothing).
Inside each namespace the veth end has the same name (IFNAME), as a cluster's nodes name their
shared network alike: one GLOO_SOCKET_IFNAME fits every rank a scheduler starts.

`two_hosts(own_pids=True)` also gives each host its own PID namespace (and /proc): one machine
has one process table, so a tool that scans it (`ray stop`) would otherwise see, and end, both
hosts' processes. Each host's commands then run under that namespace's init (a reaper), by nsenter.

`two_hosts()` needs root (ip netns) and the CPU runtime; it skips the test with the reason
otherwise, and on the way out kills whatever the test left in its namespaces, then deletes them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
MASTER = "10.77.0.1"
WORKER = "10.77.0.2"
IFNAME = "kmh0"


@dataclass
class Host:
    ns: str
    ifname: str
    addr: str
    state: Path
    init: int | None = None  # the PID namespace's init (as this machine numbers it), if any
    keep: tuple[int, ...] = ()  # that init and its unshare: not the test's processes

    def cmd(self, *argv: str, env: dict[str, str] | None = None) -> list[str]:
        extra = {
            "PYTHONPATH": str(ROOT),
            "KIMICTL_STATE_DIR": str(self.state),
            # the namespaces share the machine's host name, which resolves to loopback: tell
            # gloo which interface the ranks share (a real host's name resolves to its address)
            "GLOO_SOCKET_IFNAME": self.ifname,
            **(env or {}),
        }
        enter = ["ip", "netns", "exec", self.ns]
        if self.init is not None:  # nsenter forks: the command is a child of nsenter
            enter = ["nsenter", f"--target={self.init}", "--net", "--pid", "--mount"]
        return [
            *enter,
            "env",
            *(f"{k}={v}" for k, v in extra.items()),
            *argv,
        ]

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split() if int(p) not in self.keep]

    def command_pid(self, proc: subprocess.Popen[bytes]) -> int:
        """The pid (this machine's numbering) of the command `proc` runs through `cmd`: proc
        itself, or under nsenter its one child."""
        if self.init is None:
            return proc.pid
        for _ in range(100):
            children = _children(proc.pid)
            if children:
                return children[0]
            time.sleep(0.05)
        raise AssertionError(f"nsenter (pid {proc.pid}) started no command")


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


# PID 1 of a host's PID namespace: reaps the orphans that daemons (ray start) leave to it
_REAPER = (
    "import os, time\n"
    "while True:\n"
    "    try: os.wait()\n"
    "    except ChildProcessError: time.sleep(0.5)"
)


def _own_pid_namespace(h: Host) -> Host:
    unshare = subprocess.Popen(
        ["ip", "netns", "exec", h.ns, "unshare", "--pid", "--fork", "--kill-child",
         "--mount-proc", sys.executable, "-c", _REAPER],
    )  # fmt: skip
    for _ in range(100):
        children = _children(unshare.pid)
        if children:
            return replace(h, init=children[0], keep=(unshare.pid, children[0]))
        time.sleep(0.05)
    unshare.kill()
    pytest.skip("cannot give a host its own PID namespace (unshare --pid --mount-proc)")


def bench(h: Host, port: int, report: Path, prompts: int, output_len: int) -> dict[str, Any]:
    """`kimictl bench` from host `h` against its own port (2 concurrent, 64-token prompts);
    asserts it ran, prints the main figures and returns the report's one run."""
    done = subprocess.run(
        h.cmd(sys.executable, "-m", "kimictl", "bench", "-t", f"http://127.0.0.1:{port}",
              "--num-prompts", str(prompts), "--concurrency", "2", "--input-len", "64",
              "--output-len", str(output_len), "-o", str(report)),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (run,) = json.loads(report.read_text())["runs"]
    keys = ("completed", "failed", "duration", "output_throughput", "median_ttft_ms")
    print("bench:", {k: run.get(k) for k in (*keys, "median_tpot_ms")})
    return dict(run)


def _why_no_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    from kimictl.runtime.serving import cpu_runtime

    if not cpu_runtime.is_installed():
        return "kimictl's CPU vLLM runtime is missing: run `kimictl setup cpu-runtime`"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def two_hosts(tmp_path: Path, own_pids: bool = False) -> Iterator[tuple[Host, Host]]:
    why = _why_no_namespaces()
    if why:
        pytest.skip(why)
    tag = f"{os.getpid() % 100000}"
    a = Host(f"kmh{tag}a", IFNAME, MASTER, tmp_path / "host-a")
    b = Host(f"kmh{tag}b", IFNAME, WORKER, tmp_path / "host-b")
    try:
        for h in (a, b):
            _ip("netns", "add", h.ns)
        # unique names in the machine's own namespace, the same name once inside
        _ip("link", "add", f"{a.ns}0", "type", "veth", "peer", "name", f"{b.ns}0")
        for h in (a, b):
            _ip("link", "set", f"{h.ns}0", "netns", h.ns)
            _ip("-n", h.ns, "link", "set", f"{h.ns}0", "name", h.ifname)
            _ip("-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", h.ifname)
            _ip("-n", h.ns, "link", "set", "lo", "up")
            _ip("-n", h.ns, "link", "set", h.ifname, "up")
            # vLLM finds its own address through the default route
            _ip("-n", h.ns, "route", "add", "default", "dev", h.ifname)
    except subprocess.CalledProcessError as exc:
        for h in (a, b):
            subprocess.run(["ip", "netns", "del", h.ns], capture_output=True)
        pytest.skip(f"cannot build two network namespaces: {exc.stderr.decode().strip()}")
    try:
        if own_pids:
            a = _own_pid_namespace(a)
            b = _own_pid_namespace(b)
        yield a, b
    finally:
        _teardown(a, b)


def _teardown(*hosts: Host) -> None:
    for h in hosts:  # whatever a failed test left in our own namespaces, then the namespaces
        for pid in (*h.pids(), *h.keep):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["ip", "netns", "del", h.ns], capture_output=True)
