"""Two real hosts on one machine: network namespaces joined by a veth pair, one vLLM CPU rank each
(profile cpu-demo-tp2: the tiny model at TP2, one TP rank per host, gloo over the veth).

vLLM's mp backend through `kimictl serve cpu-demo-tp2 --nnodes 2 --node-rank 0|1 --master-addr
10.77.0.1`, each host with its own kimictl state folder (two machines share nothing): rank 0
answers and benches. An idle rank 0 keeps /health at 200 after its peer is gone, until its next
collective (vLLM has no cross-node heartbeat), so kimictl sends it a one-token completion: a
foreground rank 0's supervisor every 15 s (after SIGKILL of rank 1's vLLM it takes the deployment
down, with no client request), `kimictl ps` on each call (a detached rank 0 whose peer stopped is
never shown ready). Neither host keeps a process.

Needs root (ip netns) and the CPU runtime; skipped with the reason otherwise (scripts/check
runs it in CI).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns import MASTER, Host, bench, two_hosts

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

PROFILE = "cpu-demo-tp2"
PORT = 8100
PEER_DOWN_S = 240  # a probe every 15 s, up to 60 s for its answer, then the group stops
STARTUP_S = 600  # two ranks on 2 shared cores; alone they are ready in about a minute
DOWN_S = 120  # a rank's loss reaches the other within the launcher's health polls


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[Host, Host]]:
    with two_hosts(tmp_path) as pair:
        yield pair


def _serve(h: Host, rank: int, log: Path, *, detach: bool = False) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "kimictl", "serve", PROFILE, "--nnodes", "2"]
    argv += ["--detach"] if detach else []
    argv += ["--node-rank", str(rank), "--master-addr", MASTER, "--timeout", str(STARTUP_S)]
    with log.open("wb") as out:
        return subprocess.Popen(h.cmd(*argv), stdout=out, stderr=subprocess.STDOUT)


def _wait_line(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if text in log.read_text(errors="replace"):
            return time.monotonic() - start
        if proc.poll() is not None:
            pytest.fail(f"{log.name} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(1.0)
    pytest.fail(f"no {text!r} in {log.name} after {timeout} s:\n{log.read_text()[-3000:]}")


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {timeout} s after its peer went down: {proc.args}")


def _vllm_pids(h: Host) -> list[int]:
    found = []
    for pid in h.pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"/vllm") for part in cmdline) and b"serve" in cmdline:
            found.append(pid)
    return found


def _start_pair(
    a: Host, b: Host, tmp_path: Path, *, detach0: bool = False
) -> tuple[subprocess.Popen[bytes], ...]:
    ra = _serve(a, 0, tmp_path / "rank0.log", detach=detach0)
    rb = _serve(b, 1, tmp_path / "rank1.log")
    took = _wait_line(tmp_path / "rank0.log", "monitor: kimictl monitor", ra, STARTUP_S)
    print(f"rank 0 ready (answered a completion) after {took:.1f} s")
    return ra, rb


def _ps(h: Host) -> list[dict]:
    done = subprocess.run(
        h.cmd(sys.executable, "-m", "kimictl", "ps", "--json"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_mp_two_hosts_detached_rank0_is_never_shown_ready_without_its_peer(hosts, tmp_path):
    """Rank 0 detached (no supervisor left to notice): after rank 1's host stops its side,
    rank 0's /health still says 200, yet `kimictl ps` on host A must not call it ready; then
    `kimictl stop` there leaves nothing on either host."""
    a, b = hosts
    ra, rb = _start_pair(a, b, tmp_path, detach0=True)
    assert _wait_exit(ra, DOWN_S) == 0  # detached once ready
    (before,) = _ps(a)
    assert (before["state"], before["health"]) == ("ready", 200), before
    run = bench(a, PORT, tmp_path / "bench.json", prompts=8, output_len=32)
    assert (run["completed"], run["failed"]) == (8, 0)
    rb.send_signal(signal.SIGTERM)  # rank 1's host stops its side
    assert _wait_exit(rb, DOWN_S) == 0
    t0 = time.monotonic()
    while True:
        (now,) = _ps(a)
        if now["state"] != "ready":
            break
        assert time.monotonic() - t0 < PEER_DOWN_S, f"ps still says ready: {now}"
        time.sleep(5)
    print(f"ps on host A: {now['state']} ({now.get('peer_lost') or now.get('reason')}) "
          f"{time.monotonic() - t0:.1f} s after rank 1 stopped")  # fmt: skip
    assert now["state"] in ("unhealthy", "died"), now
    stop = subprocess.run(
        a.cmd(sys.executable, "-m", "kimictl", "stop", "--all"),
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert stop.returncode == 0, stop.stderr[-2000:]
    time.sleep(2)
    assert a.pids() == [] and b.pids() == [], (a.pids(), b.pids())


def test_sigkill_of_one_rank_brings_the_deployment_down(hosts, tmp_path):
    a, b = hosts
    ra, rb = _start_pair(a, b, tmp_path)
    (victim,) = _vllm_pids(b)
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    code_a = _wait_exit(ra, PEER_DOWN_S)  # no client request: the supervisor's probe finds it
    took = time.monotonic() - t0
    log0 = (tmp_path / "rank0.log").read_text()
    print(f"rank 0's kimictl exited {code_a} {took:.1f} s after SIGKILL of rank 1's vLLM")
    assert code_a == 1, log0[-2000:]  # reported as died, never left ready with a dead peer
    assert "died" in log0 or "failed" in log0, log0[-2000:]
    assert _wait_exit(rb, DOWN_S) == 1
    time.sleep(2)
    assert a.pids() == [] and b.pids() == [], (a.pids(), b.pids())
