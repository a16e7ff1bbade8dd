"""A real two-node Ray cluster on two hosts (network namespaces, tests/netns.py) serving
`kimictl serve cpu-demo-tp2 --ray`: TP2, one Ray rank per host.

Host A (10.77.0.1) runs `ray start --head`, host B `ray start --address 10.77.0.1:6379`, each with
one CPU for Ray, its own temp folder and its own PID namespace (so `ray stop` on one host sees
that host's processes only, as on two machines), and the Ray that `kimictl setup cpu-runtime
--ray` adds to the CPU runtime (with kimictl's fix-ups for vLLM CPU 0.32's Ray executor); the
cluster is started once for the module.
- the head's wait for both nodes (the code the Slurm and k8s renders run) passes; the cluster
  offers CPUs and no GPU;
- vLLM's own CpuPlatform names no Ray device; with the fix-ups it names "CPU";
- serve on host A: ready with one rank (a RayWorkerProc actor) on each host, a short bench, then
  `kimictl stop`: no vLLM process or actor is left on either host, while another job's detached
  actor on the same cluster still answers and both nodes stay;
- again, then SIGKILL of host B's actor: kimictl exits 1 ("died") with no client request,
  quoting vLLM's own "RayWorkerProc rank=[1] died unexpectedly" line, and nothing of vLLM is left;
- `ray stop` on host B (the operator's part: kimictl never starts or stops Ray) ends host B's
  Ray only: host A's daemons run on and the head sees B's node dead; then `ray stop` on A.

Skipped when not root or without `ip` (two_hosts says why), or when KIMICTL_SKIP_RAY=1; Ray or
the fix-ups missing from the CPU runtime fails (CI runs `kimictl setup cpu-runtime --ray` first).
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

from kimictl.runtime.serving import cpu_runtime
from kimictl.runtime.serving.ray_cluster import (
    ADDRESS_ENV,
    RAY_PORT,
    RAY_VERSION,
    wait_for_nodes_code,
)

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

PROFILE = "cpu-demo-tp2"
ADDRESS = f"{MASTER}:{RAY_PORT}"
PORT = 8100
STARTUP_S = 600  # two ranks on 2 shared cores
STOP_S = 120
PEER_DOWN_S = 240  # vLLM's own actor watch, or the launcher's probe every 15 s


def _ray(h: Host, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    argv = [str(cpu_runtime.venv_dir() / "bin" / "ray"), *args]
    env = {"RAY_USAGE_STATS_ENABLED": "0", ADDRESS_ENV: ADDRESS}
    return subprocess.run(h.cmd(*argv, env=env), capture_output=True, text=True, timeout=timeout)


def _python(h: Host, code: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    argv = [str(cpu_runtime.python_path()), "-c", code]
    env = {"RAY_USAGE_STATS_ENABLED": "0", ADDRESS_ENV: ADDRESS}
    return subprocess.run(h.cmd(*argv, env=env), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, Host]]:
    if os.environ.get("KIMICTL_SKIP_RAY") == "1":
        pytest.skip("KIMICTL_SKIP_RAY=1")
    with two_hosts(tmp_path_factory.mktemp("ray"), own_pids=True) as (a, b):
        found = cpu_runtime.installed_versions(("ray",))["ray"]
        assert cpu_runtime.ray_ready(), (
            f"ray {found} (wanted {RAY_VERSION}) or kimictl's fix-ups missing in the CPU "
            "runtime: run `kimictl setup cpu-runtime --ray` (KIMICTL_SKIP_RAY=1 skips this)"
        )
        # one CPU per node for Ray; its own temp folder per host (docs/serve.md; Unix socket
        # paths stay short)
        common = ["--num-cpus=1", "--disable-usage-stats"]
        t0 = time.monotonic()
        head = _ray(a, "start", "--head", f"--node-ip-address={a.addr}", f"--port={RAY_PORT}",
                    "--include-dashboard=false", f"--temp-dir=/tmp/{a.ns}-ray",
                    *common)  # fmt: skip
        assert head.returncode == 0, head.stderr[-3000:]
        worker = _ray(b, "start", f"--address={ADDRESS}", f"--node-ip-address={b.addr}",
                      f"--temp-dir=/tmp/{b.ns}-ray", *common)  # fmt: skip
        assert worker.returncode == 0, worker.stderr[-3000:]
        print(f"ray start on both hosts: {time.monotonic() - t0:.1f} s")
        try:
            yield a, b
        finally:
            for h in (a, b):
                if h.pids():  # a test failed before its own `ray stop`
                    _ray(h, "stop", "--force")


def test_the_renders_wait_sees_both_nodes_and_no_gpu(cluster):
    a, _ = cluster
    t0 = time.monotonic()
    wait = _python(a, wait_for_nodes_code(2, timeout_s=120))
    assert wait.returncode == 0, wait.stderr[-3000:]
    print(f"both Ray nodes alive after {time.monotonic() - t0:.1f} s more")
    # what vLLM's placement group would ask for: one {ray_device_key: 1} bundle per rank
    out = _python(
        a,
        "import json, ray; ray.init(logging_level='ERROR'); "
        "print(json.dumps([sorted(ray.cluster_resources().items()), "
        "sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])]))",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    resources, addresses = json.loads(out.stdout.strip().splitlines()[-1])
    resources = dict(resources)
    print("cluster resources:", resources)
    assert addresses == ["10.77.0.1", "10.77.0.2"]
    assert resources["CPU"] == 2.0 and "GPU" not in resources


def test_vllm_cpu_names_no_ray_device_and_kimictls_fixups_give_it_one(cluster):
    # the independent truth behind the fix-ups: vLLM's own CpuPlatform, with and without them
    a, _ = cluster
    code = "from vllm.platforms.cpu import CpuPlatform; print(repr(CpuPlatform.ray_device_key))"
    plain = subprocess.run(
        a.cmd(str(cpu_runtime.python_path()), "-c", code, env={"KIMICTL_CPU_RAY_SHIM": "0"}),
        capture_output=True,
        text=True,
        timeout=180,
    )
    fixed = _python(a, code)
    assert plain.stdout.split()[-1:] == ["''"], plain.stderr[-2000:]
    assert fixed.stdout.split()[-1:] == ["'CPU'"], fixed.stderr[-2000:]


def _serve(h: Host, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "kimictl", "serve", PROFILE, "--ray", "--nnodes", "2"]
    argv += ["--timeout", str(STARTUP_S)]
    with log.open("wb") as out:
        cmd = h.cmd(*argv, env={ADDRESS_ENV: ADDRESS})
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def _ready(a: Host, b: Host, log: Path) -> subprocess.Popen[bytes]:
    proc = _serve(a, log)
    t0 = time.monotonic()
    while "monitor: kimictl monitor" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() - t0 > STARTUP_S:
            proc.kill()
            pytest.fail(f"not ready (exit {proc.poll()}):\n{log.read_text()[-4000:]}")
        time.sleep(1.0)
    print(f"ready (answered a completion) {time.monotonic() - t0:.1f} s after kimictl serve")
    # Ray placed one rank per host: one CPU per node, one {"CPU": 1} bundle per rank
    assert len(_rank_pids(a)) == 1 and len(_rank_pids(b)) == 1, (_procs(a), _procs(b))
    return proc


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"kimictl serve still running {timeout} s later")


def _nothing_of_vllm_left(*hosts: Host) -> None:
    deadline = time.monotonic() + 30  # Ray reaps a dead owner's actors on its own schedule
    while any(_vllm_pids(h) or _rank_pids(h) for h in hosts) and time.monotonic() < deadline:
        time.sleep(1)
    for h in hosts:
        assert not _vllm_pids(h) and not _rank_pids(h), _procs(h)


# someone else's work on the same Ray cluster: a detached actor of another job and namespace
# (no CPU, so vLLM's placement group still finds one CPU per node)
OTHER_JOB_START = (
    "import ray\n"
    "ray.init(namespace='someone-else', logging_level='ERROR')\n"
    "@ray.remote(num_cpus=0)\n"
    "class Keeper:\n"
    "    def ping(self): return 'pong'\n"
    "k = Keeper.options(name='keeper', lifetime='detached').remote()\n"
    "print(ray.get(k.ping.remote()))"
)
OTHER_JOB_PING = (
    "import ray; ray.init(namespace='someone-else', logging_level='ERROR'); "
    "print(ray.get(ray.get_actor('keeper').ping.remote(), timeout=60))"
)


def test_serve_ray_on_two_hosts_answers_benches_and_stops(cluster, tmp_path):
    a, b = cluster
    other = _python(a, OTHER_JOB_START)
    assert other.returncode == 0 and other.stdout.split()[-1:] == ["pong"], other.stderr[-2000:]
    log = tmp_path / "serve.log"
    proc = _ready(a, b, log)
    run = bench(a, PORT, tmp_path / "bench.json", prompts=4, output_len=16)
    assert (run["completed"], run["failed"]) == (4, 0)
    ps = _kimictl(a, "ps", "--json")
    (record,) = json.loads(ps.stdout)
    assert record["extra"]["ray"] == {"address": ADDRESS}, record["extra"]
    t0 = time.monotonic()
    stop = _kimictl(a, "stop", record["id"], timeout=STOP_S)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    _wait_exit(proc, STOP_S)
    _nothing_of_vllm_left(a, b)  # both ranks' actors gone; Ray's own daemons stay
    print(f"kimictl stop: nothing of vLLM left {time.monotonic() - t0:.1f} s later")
    # the stop ended this deployment only: another job's actor on the same cluster answers,
    # and the operator's Ray cluster still has both nodes
    other = _python(a, OTHER_JOB_PING)
    assert other.returncode == 0 and other.stdout.split()[-1:] == ["pong"], other.stderr[-2000:]
    alive = _python(a, wait_for_nodes_code(2, timeout_s=30))
    assert alive.returncode == 0, alive.stderr[-2000:]


def test_sigkill_of_the_rank_on_host_b_brings_the_deployment_down(cluster, tmp_path):
    a, b = cluster
    log = tmp_path / "serve.log"
    proc = _ready(a, b, log)
    (victim,) = _rank_pids(b)
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    code = _wait_exit(proc, PEER_DOWN_S)  # no client request
    text = log.read_text(errors="replace")
    print(f"kimictl serve exited {code} {time.monotonic() - t0:.1f} s after SIGKILL of host "
          f"B's rank")  # fmt: skip
    print(text[text.find("error:") :][-1500:])
    assert code == 1, text[-3000:]
    # the message quotes vLLM's own line naming the rank, not the traceback after it
    (named,) = (ln for ln in text.splitlines() if "RayWorkerProc rank=[1] died unexpectedly" in ln)
    assert named.strip().startswith("(EngineCore") and "Traceback" not in text, text[-3000:]
    assert "likely cause: a rank's Ray actor died" in text, text[-3000:]
    _nothing_of_vllm_left(a, b)


def test_ray_stop_on_one_host_stops_that_hosts_ray_only(cluster):
    a, b = cluster
    _ray_stop(b)
    assert {"gcs_server", "raylet"} <= _ray_daemons(a), _procs(a)  # host A's Ray runs on
    # and the head sees host B's node gone, its own alive
    nodes = _python(a, NODES_ALIVE)
    assert nodes.returncode == 0, nodes.stderr[-2000:]
    seen = json.loads(nodes.stdout.strip().splitlines()[-1])
    assert seen == [["10.77.0.1", True], ["10.77.0.2", False]], seen
    _ray_stop(a)


def _ray_stop(h: Host) -> None:
    """`ray stop` on host h: nothing of it left there within 30 s."""
    stop = _ray(h, "stop")
    assert stop.returncode == 0, stop.stderr[-2000:]
    deadline = time.monotonic() + 30
    while h.pids() and time.monotonic() < deadline:
        time.sleep(1)
    assert h.pids() == [], _procs(h)


# the nodes as the head's GCS sees them, once host B's node is no longer alive (60 s at most)
NODES_ALIVE = (
    "import json, ray, time\n"
    "ray.init(logging_level='ERROR')\n"
    "for _ in range(60):\n"
    "    nodes = sorted((n['NodeManagerAddress'], n['Alive']) for n in ray.nodes())\n"
    "    if all(alive for addr, alive in nodes if addr == '10.77.0.1') and not any(\n"
    "        alive for addr, alive in nodes if addr == '10.77.0.2'): break\n"
    "    time.sleep(1)\n"
    "print(json.dumps(nodes))"
)


def _kimictl(h: Host, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = h.cmd(sys.executable, "-m", "kimictl", *args)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def _ray_daemons(h: Host) -> set[str]:
    names = ("gcs_server", "raylet")
    return {n for _, args in _procs(h) for n in names if f"/{n} " in args or args.startswith(n)}


def _procs(h: Host) -> list[tuple[int, str]]:
    found = []
    for pid in h.pids():
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found.append((pid, args))
    return found


def _vllm_pids(h: Host) -> list[int]:
    return [pid for pid, args in _procs(h) if "/vllm " in args and " serve " in args]


def _rank_pids(h: Host) -> list[int]:
    """vLLM's worker on this host: a Ray actor (its process title names the class)."""
    return [pid for pid, args in _procs(h) if "RayWorkerProc" in args]
