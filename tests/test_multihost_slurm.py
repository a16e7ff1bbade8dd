"""A real Slurm cluster on the two namespace hosts runs the script `kimictl serve cpu-demo-tp2
--render slurm` writes: munged, slurmctld and one slurmd per host (Debian's slurm-wlm and munge),
everything (config, spool, state, logs, munge key and socket) under the test's tmp folder.

One cluster for the module; one job per check. The job serves on the first node's veth address
and the other host benches it; `scancel` leaves no vLLM process on either host; SIGKILL of the
rank on the second node ends the whole job (`srun --kill-on-bad-exit=1`), never a half-alive
server.

The same job as a kimictl run (`kimictl serve --slurm` on the first host): `ps` shows Slurm's
state (from scontrol) beside /health (from the server), `monitor --once`, `bench -t RUN` and
`logs` take the run id, `stop` leaves nothing on either host within 15 s; a rank's SIGKILL is
`died` in `ps` within 10 s with srun's own line; a job cancelled from outside while starting ends
`serve` with Slurm's state; a bad partition is one `error:`, exit 2, no run recorded.

Needs root (ip netns) and the CPU runtime; skipped with the reason otherwise. Needs slurm-wlm
and munge too: skipped without them, except under KIMICTL_TEST_NEEDS_SLURM=1 (.ci/run installs
them and sets it), where their absence fails the test.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from netns import MASTER, WORKER, Host, two_hosts

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

PROFILE = "cpu-demo-tp2"
PORT = 8100
KEY = "sk-slurm-test-" + secrets.token_hex(8)
NODES = {"kmh-a": MASTER, "kmh-b": WORKER}  # node names that resolve nowhere: Slurm's NodeAddr
CLUSTER_S = 60  # munged, slurmctld, two slurmds: a few seconds alone
STARTUP_S = 600  # two ranks on 2 shared cores; alone they are ready in about a minute
DOWN_S = 120
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch")


def _missing() -> list[str]:
    return [d for d in DAEMONS if shutil.which(d) is None]


@dataclass
class Cluster:
    a: Host
    b: Host
    root: Path
    env: dict[str, str]
    daemons: set[int] = field(default_factory=set)

    def run(
        self, host: Host, *argv: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            host.cmd(*argv, env={**self.env, **(env or {})}),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, host: Host, name: str, *argv: str) -> None:
        with (self.root / f"{name}.out").open("wb") as out:
            subprocess.Popen(host.cmd(*argv, env=self.env), stdout=out, stderr=subprocess.STDOUT)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out"))
        )


def _slurm_conf(root: Path) -> str:
    nodes = "\n".join(
        f"NodeName={name} NodeAddr={addr} CPUs=2 RealMemory=1000 State=UNKNOWN"
        for name, addr in NODES.items()
    )
    # no systemd and no cgroups here, so no task plugin, no gres, and steps tracked by process
    # group: it keeps what a SIGKILLed rank leaves (its vLLM worker, reparented to init) in the
    # step, as proctrack/cgroup does on a real cluster; proctrack/linuxproc follows parent links
    # and lost them (the worker outlived the failed job)
    return f"""\
ClusterName=kimictl-test
SlurmctldHost={socket.gethostname()}({MASTER})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.sock
StateSaveLocation={root}/ctld
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=5
{nodes}
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("slurm")
    with two_hosts(tmp) as (a, b):
        missing = _missing()
        if missing:
            why = f"{', '.join(missing)} missing: apt-get install slurm-wlm munge"
            if os.environ.get("KIMICTL_TEST_NEEDS_SLURM"):  # set by .ci/run, which installs them
                pytest.fail(why)
            pytest.skip(why)
        root = tmp / "slurm"
        root.mkdir(mode=0o700)
        for sub in ("ctld", *(f"spool-{name}" for name in NODES)):
            (root / sub).mkdir()
        conf = root / "slurm.conf"
        conf.write_text(_slurm_conf(root))
        # slurmd loads a cgroup plugin even when no other plugin uses it; autodetect fails on
        # this machine's hybrid mount, so name the v1 hierarchy (nothing is created in it)
        (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        c = Cluster(a, b, root, {"SLURM_CONF": str(conf), "GLOO_SOCKET_IFNAME": a.ifname})
        c.start(a, "munged", "munged", "-F", "--force", f"--key-file={key}",
                f"--socket={root}/munge.sock", f"--pid-file={root}/munged.pid",
                f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed")  # fmt: skip
        c.start(a, "slurmctld", "slurmctld", "-D", "-i")
        for host, name in zip((a, b), NODES, strict=True):
            c.start(host, f"slurmd-{name}", "slurmd", "-D", "-N", name)
        deadline = time.monotonic() + CLUSTER_S
        while True:
            out = c.run(a, "sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
            if out.count("idle") == len(NODES):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"Slurm nodes not idle after {CLUSTER_S} s: {out}\n{c.logs()}")
            time.sleep(1)
        c.daemons = set(a.pids()) | set(b.pids())  # with slurmctld's own slurmscriptd
        yield c


@pytest.fixture(scope="module")
def script(cluster: Cluster) -> Path:
    """The operator's file: rendered on the first host, submitted as is."""
    path = cluster.root / "job.sbatch"
    out = cluster.run(cluster.a, sys.executable, "-m", "kimictl", "serve", PROFILE, "--render",
                      "slurm", "-o", str(path))  # fmt: skip
    assert out.returncode == 0, out.stderr
    return path


def _submit(c: Cluster, script: Path, tag: str) -> str:
    out = c.run(c.a, "sbatch", "--parsable", f"--output={c.root}/{tag}-%j.out",
                f"--chdir={c.root}", str(script), env={"VLLM_API_KEY": KEY})  # fmt: skip
    assert out.returncode == 0, out.stderr + c.logs()
    return out.stdout.strip().split(";")[0]


def _job_state(c: Cluster, job: str) -> str:
    out = c.run(c.a, "scontrol", "-o", "show", "job", job).stdout
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    return fields.get("JobState", "GONE")


def _ask(c: Cluster, path: str, body: dict[str, object] | None = None, key: str = KEY) -> int:
    """HTTP status of a request to the first node's veth address, sent from the other host
    (0: no answer)."""
    probe = f"""
import json, urllib.request
req = urllib.request.Request("http://{MASTER}:{PORT}{path}", headers={{
    "Authorization": "Bearer {key}", "Content-Type": "application/json"}},
    data=json.dumps({body!r}).encode() if {body!r} is not None else None)
try:
    print(urllib.request.urlopen(req, timeout=300).status)
except Exception as exc:
    print(getattr(exc, "code", 0))
"""
    out = c.run(c.b, sys.executable, "-c", probe, timeout=330).stdout.strip()
    return int(out) if out.isdigit() else 0


def _job_log(c: Cluster, tag: str, job: str) -> str:
    path = c.root / f"{tag}-{job}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def _print_job_lines(c: Cluster, tag: str, job: str) -> None:
    """The job's own words (its API line, srun's and slurmstepd's), for docs/serve.md."""
    for line in _job_log(c, tag, job).splitlines():
        if line.startswith(("API:", "srun:", "slurmstepd:")):
            print(f"  {tag}-{job}.out: {line}")


def _wait_ready(c: Cluster, job: str, tag: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < STARTUP_S:
        if _ask(c, "/health") == 200:
            # ready as kimictl's own launch means it: one completion answered (rank 1 included)
            one = {"model": "tiny-k2", "prompt": "Hello", "max_tokens": 1}
            assert _ask(c, "/v1/completions", one) == 200, _job_log(c, tag, job)[-3000:]
            return time.monotonic() - start
        state = _job_state(c, job)
        if state not in ("PENDING", "CONFIGURING", "RUNNING"):
            pytest.fail(f"job {job} is {state} before serving:\n{_job_log(c, tag, job)[-4000:]}")
        time.sleep(2)
    pytest.fail(f"no /health 200 after {STARTUP_S} s:\n{_job_log(c, tag, job)[-4000:]}")


def _strays(c: Cluster) -> dict[str, list[str]]:
    """Processes in either namespace other than the cluster's own daemons."""
    out: dict[str, list[str]] = {}
    for h in (c.a, c.b):
        for pid in set(h.pids()) - c.daemons:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            out.setdefault(h.ns, []).append(f"{pid} {cmd[:120]}")
    return out


def _wait_gone(c: Cluster, job: str) -> None:
    deadline = time.monotonic() + DOWN_S
    while _job_state(c, job) in ("RUNNING", "COMPLETING", "PENDING") or _strays(c):
        if time.monotonic() > deadline:
            pytest.fail(f"job {job} {_job_state(c, job)} {DOWN_S} s on; left: {_strays(c)}")
        time.sleep(1)


def test_sbatch_serves_on_the_first_node_and_scancel_leaves_nothing(cluster, script):
    c = cluster
    job = _submit(c, script, "serve")
    took = _wait_ready(c, job, "serve")
    print(f"job {job}: ready (/health 200, a completion answered) from the other host "
          f"{took:.1f} s after sbatch")  # fmt: skip
    log = _job_log(c, "serve", job)
    assert f"API: http://{MASTER}:{PORT} (model tiny-k2)" in log, log[-2000:]
    report = c.root / "bench.json"
    bench = c.run(c.b, sys.executable, "-m", "kimictl", "bench", "-t", f"http://{MASTER}:{PORT}",
                  "--num-prompts", "4", "--concurrency", "2", "--input-len", "64",
                  "--output-len", "16", "-o", str(report), env={"VLLM_API_KEY": KEY},
                  timeout=600)  # fmt: skip
    assert bench.returncode == 0, bench.stderr[-2000:]
    (run,) = json.loads(report.read_text())["runs"]
    keys = ("completed", "failed", "duration", "output_throughput", "median_ttft_ms")
    print("bench from the other host:", {k: run.get(k) for k in (*keys, "median_tpot_ms")})
    assert (run["completed"], run["failed"]) == (4, 0)
    # the key is the one sbatch's environment carried: without it the API refuses
    assert _ask(c, "/v1/models", key="") == 401
    cancel = c.run(c.a, "scancel", job)
    assert cancel.returncode == 0, cancel.stderr
    t0 = time.monotonic()
    _wait_gone(c, job)
    print(f"scancel: job {job} {_job_state(c, job)}, no process left on either host after "
          f"{time.monotonic() - t0:.1f} s")  # fmt: skip
    _print_job_lines(c, "serve", job)
    assert _ask(c, "/health") == 0


def test_sigkill_of_the_second_nodes_rank_ends_the_whole_job(cluster):
    c = cluster
    record = _serve_slurm(c)  # the same job, submitted by kimictl: ps must say why it ended
    run_id, job = record["id"], record["extra"]["slurm"]["job_id"]
    (victim,) = [
        pid for pid in set(c.b.pids()) - c.daemons
        if b"--headless" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    ]  # fmt: skip
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    died = _until(lambda: _ps(c).get(run_id) if _ps(c)[run_id]["state"] == "died" else None, 10)
    took = time.monotonic() - t0
    assert died and took <= 10, (took, _ps(c, "--all"))
    print(f"SIGKILL of rank 1 (pid {victim}): ps after {took:.1f} s: "
          f"{died['state']}: {died['reason']}")  # fmt: skip
    # srun's own line names the rank; Slurm's final word may still be on its way (COMPLETING)
    assert f"Slurm job {job} " in died["reason"] and "kmh-b: task 1: Killed" in died["reason"]
    _wait_gone(c, job)
    print("$ kimictl ps\n" + _kimictl(c, "ps").stdout)
    assert f"Slurm job {job} FAILED (NonZeroExitCode" in _ps(c)[run_id]["reason"]
    state = _job_state(c, job)
    print(f"job {job} {state}, no process left on either host after "
          f"{time.monotonic() - t0:.1f} s")  # fmt: skip
    assert state == "FAILED", Path(record["log_path"]).read_text()[-3000:]
    assert _ask(c, "/health") == 0
    # a death nobody acknowledged stays in plain ps until `kimictl stop` records it
    assert _ps(c)[run_id]["state"] == "died"
    assert _kimictl(c, "stop", run_id).returncode == 0 and run_id not in _ps(c)


# ---------------------------------------------------------------- the same job as a kimictl run


def _kimictl(c: Cluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return c.run(c.a, sys.executable, "-m", "kimictl", *args, env={"VLLM_API_KEY": KEY},
                 timeout=timeout)  # fmt: skip


def _ps(c: Cluster, *args: str) -> dict[str, dict]:
    out = _kimictl(c, "ps", "--json", *args)
    assert out.returncode == 0, out.stderr
    return {r["id"]: r for r in json.loads(out.stdout)}


def _serve_slurm(c: Cluster) -> dict:
    """`kimictl serve PROFILE --slurm` on the first host: ready, and the one run ps lists."""
    t0 = time.monotonic()
    out = _kimictl(c, "serve", PROFILE, "--slurm", timeout=STARTUP_S + 60)
    assert out.returncode == 0, out.stderr[-3000:] + c.logs()
    print(f"$ kimictl serve {PROFILE} --slurm   ({time.monotonic() - t0:.1f} s)\n{out.stdout}")
    (record,) = [r for r in _ps(c).values() if r["state"] == "ready"]
    assert f"ready {record['id']}: {record['url']}" in out.stdout
    return record


def _until(what, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while (got := what()) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return got


def test_serve_slurm_is_a_run_ps_monitor_logs_and_stop_see_it(cluster):
    c = cluster
    record = _serve_slurm(c)
    run_id, job = record["id"], record["extra"]["slurm"]["job_id"]
    assert record["url"] == f"http://{MASTER}:{PORT}"
    assert record["extra"]["slurm"]["nodes"] == list(NODES)
    # the file kimictl submitted holds no key: sbatch's environment carried it
    assert KEY not in Path(record["extra"]["slurm"]["script"]).read_text()
    print("$ kimictl ps\n" + _kimictl(c, "ps").stdout)
    ps = _ps(c)[run_id]  # Slurm's state and /health, each from its own source
    assert (ps["state"], ps["health"], ps["extra"]["slurm"]["state"]) == ("ready", 200, "RUNNING")
    assert _job_state(c, job) == "RUNNING"
    assert _ask(c, "/v1/completions", {"model": "tiny-k2", "prompt": "Hi", "max_tokens": 2}) == 200
    mon = _kimictl(c, "monitor", run_id, "--once", "--json", timeout=120)
    assert mon.returncode == 0, mon.stderr[-2000:]
    print("monitor --once --json:", mon.stdout[:300].replace("\n", " "))
    assert run_id in mon.stdout
    report = c.root / f"bench-{run_id}.json"
    bench = _kimictl(c, "bench", "-t", run_id, "--num-prompts", "2", "--input-len", "32",
                     "--output-len", "8", "-o", str(report), timeout=300)  # fmt: skip
    assert bench.returncode == 0, bench.stderr[-2000:]
    (run,) = json.loads(report.read_text())["runs"]
    assert (run["completed"], run["failed"]) == (2, 0)
    logs = _kimictl(c, "logs", run_id, "--tail", "0")
    assert f"API: http://{MASTER}:{PORT} (model tiny-k2)" in logs.stdout, logs.stdout[-2000:]
    t0 = time.monotonic()
    stop = _kimictl(c, "stop", run_id, timeout=DOWN_S)
    took = time.monotonic() - t0
    assert stop.returncode == 0, stop.stderr
    print(f"kimictl stop: {stop.stdout.strip()} in {took:.1f} s; job {_job_state(c, job)}, "
          f"left: {_strays(c)}")  # fmt: skip
    assert took < 15 and not _strays(c) and _job_state(c, job) in ("CANCELLED", "GONE")
    assert run_id not in _ps(c) and _ps(c, "--all")[run_id]["state"] == "stopped"


def test_serve_slurm_bad_partition_is_one_error_and_nothing_recorded(cluster):
    c = cluster
    before = _ps(c, "--all")
    out = _kimictl(c, "serve", PROFILE, "--slurm", "--partition", "nosuch")
    print("bad partition:", out.stderr.strip())
    assert out.returncode == 2
    assert out.stderr.startswith("error: sbatch refused the job: Batch job submission failed: "
                                 "Invalid partition name specified."), out.stderr  # fmt: skip
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 2  # error, hint
    assert _ps(c, "--all").keys() == before.keys()


def test_serve_slurm_scancel_from_outside_is_reported_with_slurms_state(cluster):
    """Cancelled by someone else while it starts: serve says so, and so does ps."""
    c = cluster
    before = _ps(c, "--all")
    proc = subprocess.Popen(
        c.a.cmd(sys.executable, "-m", "kimictl", "serve", PROFILE, "--slurm",
                env={**c.env, "VLLM_API_KEY": KEY}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def running() -> str | None:  # this test's job, once Slurm runs it
        return next((r["extra"]["slurm"]["job_id"] for i, r in _ps(c).items() if i not in before
                     and r["extra"]["slurm"].get("state") == "RUNNING"), None)  # fmt: skip

    job = _until(running, 60)
    assert job, _ps(c, "--all")
    assert c.run(c.a, "scancel", job).returncode == 0
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=DOWN_S)
    print(f"serve after an outside scancel (exit {proc.returncode}, "
          f"{time.monotonic() - t0:.1f} s): {err.strip().splitlines()[-2:]}")  # fmt: skip
    assert proc.returncode == 1 and f"Slurm job {job} CANCELLED" in err, err
    (run,) = [r for i, r in _ps(c, "--all").items() if i not in before]
    assert run["state"] == "failed" and "cancelled outside kimictl" in run["reason"], run
    _wait_gone(c, job)


def test_a_job_past_its_time_limit_is_worded_with_slurms_state_and_reason(cluster):
    """Slurm's own time limit as kimictl reads it (scontrol) and words it, while the job ends
    (COMPLETING, Reason=TimeLimit) and once it has (TIMEOUT): a plain one-minute job, no vLLM.
    A preemption needs a preempting partition: not built here."""
    c = cluster
    out = c.run(c.a, "sbatch", "--parsable", "--time=1", f"--output={c.root}/limit-%j.out",
                f"--chdir={c.root}", "--wrap", "sleep 600")  # fmt: skip
    assert out.returncode == 0, out.stderr + c.logs()
    job = out.stdout.strip().split(";")[0]
    read = ("import sys; from kimictl.runtime.serving import slurm; "
            "print(slurm.job_info(sys.argv[1]).describe())")  # fmt: skip
    t0 = time.monotonic()
    seen: list[str] = []

    def worded() -> str | None:
        said = c.run(c.a, sys.executable, "-c", read, job).stdout.strip()
        if not seen or seen[-1] != said:
            seen.append(said)
            print(f"time limit, {time.monotonic() - t0:.1f} s after sbatch: {said}")
        return said if " TIMEOUT " in said else None

    assert _until(worded, 180), seen
    ending = [s for s in seen if " COMPLETING " in s]
    for said in ending:  # Slurm's reason already says why while it ends
        assert said.startswith(f"Slurm job {job} COMPLETING (TimeLimit"), seen
        assert said.endswith(": it reached its time limit"), seen
    assert seen[-1].startswith(f"Slurm job {job} TIMEOUT (TimeLimit"), seen
    assert seen[-1].endswith(": it reached its time limit"), seen
    _wait_gone(c, job)
