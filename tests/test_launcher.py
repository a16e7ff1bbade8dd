"""Launcher: plans, ports, start-up phases, readiness, supervision, stop, causes of failure.

Fast tests drive a stand-in server (tests/fixtures/launcher/fake_vllm.py: a real process with a
real HTTP server that prints vLLM's own log lines); the real vLLM CPU server is in test_serve.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from conftest import niceness

from kimictl.core.apikeys import read_api_key
from kimictl.core.errors import EndpointError, InputError, LaunchError
from kimictl.runtime.serving import launcher, runs, startup, workflow
from kimictl.runtime.serving import plan as plan_module
from kimictl.runtime.serving.plan import LaunchPlan
from kimictl.runtime.serving.runs import RunRecord, RunState

FAKE = Path(__file__).parent / "fixtures" / "launcher" / "fake_vllm.py"
REAL_LOG = Path(__file__).parent / "fixtures" / "launcher" / "vllm_cpu_startup.log"
# host A's vllm.log from the SIGKILL of host B's Ray rank on (tests/test_multihost_ray.py): vLLM's
# line naming the rank, then the engine core's and API server's tracebacks
RAY_DEATH_LOG = Path(__file__).parent / "fixtures" / "launcher" / "vllm_ray_rank_died.log"
RAY_NAMING = "RayWorkerProc rank=[1] died unexpectedly, shutting down executor."


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KIMICTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    return tmp_path / "state"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fake_plan(mode: str, *, port: int | None = None, env: dict[str, str] | None = None):
    port = port or free_port()
    run_id = runs.new_run_id(f"fake-{mode}")
    run_dir = runs.run_dir_for(run_id)
    return LaunchPlan(
        run_id=run_id,
        name=f"fake-{mode}",
        profile=None,
        runtime="gpu",
        argv=[sys.executable, str(FAKE), str(port), mode],
        env={"TMPDIR": str(plan_module.run_tmp_dir(run_dir, run_id)), **(env or {})},
        host="127.0.0.1",
        port=port,
        model="fake",
        gpus=0,
        run_dir=run_dir,
    )


def group_gone(pgid: int) -> bool:
    """No live (non-zombie) process left in the group: an unreaped zombie is dead already."""
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return False
    return True


def sockets_under(folder: Path) -> list[Path]:
    import stat

    return [p for p in folder.rglob("*") if stat.S_ISSOCK(p.lstat().st_mode)]


# ---------------------------------------------------------------- pure pieces


def test_phases_from_a_real_vllm_cpu_log():
    # The log of a real `vllm serve` (vllm-cpu 0.32.0, tiny model, --enforce-eager).
    phases = startup.read_phases(REAL_LOG.read_text())
    assert phases == [
        "starting API server",
        "reading model config",
        "starting engine",
        "starting workers",
        "loading weights",
        "allocating KV cache",
        "API up, warming",
    ]
    # "Enforce eager set, disabling torch.compile" must not read as a compile phase.
    assert "compiling" not in phases


@pytest.mark.parametrize(
    ("line", "code", "expected"),
    [
        (
            "ValueError: Kimi K3 specialized decode does not support TP other than 8/16",
            1,
            "refused this deployment: TP other than 8/16",
        ),
        ("OSError: [Errno 98] Address already in use", 1, "port was taken"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", 1, "out of memory"),
        ("Value error, Invalid repository ID or local directory specified: '/x'", 1, "model path"),
        ("vllm serve: error: unrecognized arguments: --bogus", 2, "flag this vLLM version"),
        ("ModuleNotFoundError: No module named 'vllm._C'", 1, "install is broken"),
        ("Head dimension 96 is not supported by MLA", 1, "576"),
        ("ConnectionError: Could not find any running Ray instance.", 1, "no Ray cluster"),
        (
            "(EngineCore pid=21375) ERROR 12-03 07:01:31 [ray_executor_v2.py:522] RayWorkerProc "
            "rank=[1] died unexpectedly, shutting down executor.",
            -15,
            "a rank's Ray actor died",
        ),
        ("  RuntimeError: Executor failed.", -15, "the executor lost a rank"),
        (  # vLLM 0.32 multiproc_executor.py's own words for a lost worker process
            "(EngineCore pid=7) ERROR 12-05 04:00:00 [multiproc_executor.py:316] Worker proc "
            "VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.",
            -15,
            "vLLM's worker process VllmWorker-1 died (exit code -9)",
        ),
        ("nothing useful", -9, "SIGKILL"),
        ("nothing useful", -11, "SIGSEGV"),
        ("nothing useful", 1, "not recognised"),
    ],
)
def test_likely_cause(line, code, expected):
    assert expected in startup.likely_cause(["INFO start", line, "INFO end"], code)


def test_vllms_line_naming_the_lost_ray_rank_is_found_beyond_the_traceback_tail():
    tail = startup.log_tail(RAY_DEATH_LOG)
    assert not any("RayWorkerProc" in line for line in tail)  # the tail is traceback only
    assert "Traceback" in "\n".join(tail)
    named = startup.lost_member_line(RAY_DEATH_LOG)
    assert named is not None and named.endswith(RAY_NAMING) and "\x1b" not in named
    assert "a rank's Ray actor died" in startup.likely_cause([*tail, named], -15)


def test_vllms_line_is_cut_from_another_process_write_it_was_run_onto(tmp_path):
    # recorded from a 2-host Ray run: the worker's unfinished write and the engine core's
    # record share one line of the log
    log = tmp_path / "vllm.log"
    log.write_text(
        "(RayWorkerProc pid=193, ip=10.77.0.2) (Worker_TP1 pid=193) INFO 12-05 07:01:36 "
        "[unquantized.py:528] Using MoEPrepareAndFinalizeNoDPEPModular"
        "(EngineCore pid=554) ERROR 12-05 07:01:44 [ray_executor_v2.py:522] " + RAY_NAMING + "\n"
        "Traceback (most recent call last):\n"
    )
    named = startup.lost_member_line(log)
    assert (
        named == "(EngineCore pid=554) ERROR 12-05 07:01:44 [ray_executor_v2.py:522] " + RAY_NAMING
    )
    alone = tmp_path / "alone.log"
    alone.write_text("ERROR 12-05 07:01:44 [ray_executor_v2.py:522] " + RAY_NAMING + "\n")
    assert (
        startup.lost_member_line(alone)
        == "ERROR 12-05 07:01:44 [ray_executor_v2.py:522] " + RAY_NAMING
    )


def test_tmp_dir_is_short_enough_for_unix_sockets(tmp_path):
    deep = tmp_path / ("d" * 80) / "runs" / "cpu-demo-1234"
    chosen = plan_module.run_tmp_dir(deep, "cpu-demo-1234")
    assert len(str(chosen / ("x" * 36))) <= 107
    shallow = Path("/s/runs/cpu-demo-1234")
    assert plan_module.run_tmp_dir(shallow, "cpu-demo-1234") == shallow / "tmp"


def test_redaction_of_argv_and_env(tmp_path):
    plan = fake_plan("ok", env={"VLLM_API_KEY": "s3cret", "HF_TOKEN": "hf_x"})
    plan = LaunchPlan(**{**plan.__dict__, "argv": [*plan.argv, "--api-key", "k2", "--api-key=k3"]})
    shown = repr(plan.to_json())
    assert "s3cret" not in shown and "hf_x" not in shown and "k2" not in shown and "k3" not in shown
    assert plan.redacted_env()["VLLM_API_KEY"] == "***"


def test_port_in_use_is_refused_before_launch():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(InputError, match=f"port {port} on 127.0.0.1 is already in use"):
            plan_module.check_port_free("127.0.0.1", port)
        plan = fake_plan("ok", port=port)
        with pytest.raises(InputError, match="already in use"):
            launcher.start(plan)
        assert not plan.run_dir.exists()  # nothing started, nothing recorded
    plan_module.check_port_free("127.0.0.1", port)  # free again once closed


def test_api_key_sources(tmp_path, monkeypatch):
    key = tmp_path / "key"
    key.write_text("abc123\n")
    assert read_api_key(key) == "abc123"
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert read_api_key(None) == "from-env"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(InputError, match="is empty"):
        read_api_key(tmp_path / "empty")
    with pytest.raises(InputError, match="cannot read"):
        read_api_key(tmp_path / "missing")


# ---------------------------------------------------------------- real processes, fake server


def test_ready_then_stop_cleans_group_and_sockets():
    plan = fake_plan("ok")
    launch = launcher.start(plan)
    seen: list[str] = []
    launcher.wait_ready([launch], timeout=30, on_phase=lambda _l, p, _t: seen.append(p))
    assert launch.record.state is RunState.READY
    assert runs.get_run(plan.run_id).state is RunState.READY
    assert seen[-2:] == ["first completion", "ready"] and "loading weights" in seen
    tmp = Path(plan.env["TMPDIR"])
    assert sockets_under(tmp), "the stand-in creates a socket file like vLLM"
    record = launcher.stop_run(launch.record, process=launch.process, grace=5)
    assert record.state is RunState.STOPPED
    assert group_gone(record.pgid)
    assert sockets_under(plan.run_dir) == [] and not tmp.exists()
    assert runs.list_runs() == []


def test_phases_logged_before_health_answers_are_shown(monkeypatch):
    """The loaded-machine order, made certain: the log is read, then kimictl loses the CPU while
    vLLM logs its last phases and starts answering; the first /health probe then says 200."""
    real_health = launcher.health

    def late_health(url, **kwargs):
        deadline = time.monotonic() + 20
        while real_health(url, **kwargs) != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        return real_health(url, **kwargs)

    monkeypatch.setattr(launcher, "health", late_health)
    plan = fake_plan("ok")
    launch = launcher.start(plan)
    seen: list[str] = []
    try:
        launcher.wait_ready([launch], timeout=30, on_phase=lambda _l, p, _t: seen.append(p))
    finally:
        launcher.stop_run(launch.record, process=launch.process, grace=5)
    assert seen == [
        "launching vLLM",
        "starting API server",
        "reading model config",
        "loading weights",
        "API up, warming",
        "first completion",
        "ready",
    ]


def test_quiet_start_up_gets_a_heartbeat(monkeypatch):
    """vLLM prints nothing while it imports: a "still ..." line keeps coming meanwhile."""
    monkeypatch.setattr(launcher, "HEARTBEAT_S", 0.5)
    plan = fake_plan("ok")
    plan = LaunchPlan(
        **{**plan.__dict__, "argv": [sys.executable, "-c", "import time; time.sleep(60)"]}
    )
    launch = launcher.start(plan)
    seen: list[tuple[str, float]] = []
    try:
        with pytest.raises(LaunchError, match="not ready after 2 s"):
            launcher.wait_ready(
                [launch], timeout=2, poll_s=0.1, on_phase=lambda _l, p, t: seen.append((p, t))
            )
    finally:
        launcher.stop_run(launch.record, process=launch.process, grace=1)
    assert seen[0][0] == "launching vLLM"
    beats = [(p, t) for p, t in seen if p.startswith("still launching vLLM (")]
    assert len(beats) >= 2 and all(
        b[1] - a[1] >= 0.5 for a, b in zip(beats, beats[1:], strict=False)
    )


@pytest.mark.parametrize("detach", [False, True])
def test_server_runs_at_the_plansniceness(detach):
    plan = LaunchPlan(**{**fake_plan("ok").__dict__, "nice": 7})
    launch = launcher.start(plan, detach=detach)
    try:
        launcher.wait_ready([launch], timeout=30)
        pid = launch.record.pids[0]
        assert niceness(pid) == os.nice(0) + 7
        autogroup = Path(f"/proc/{pid}/autogroup")
        enabled = Path("/proc/sys/kernel/sched_autogroup_enabled")
        if enabled.exists() and enabled.read_text().strip() == "1":
            # its own session, so its own autogroup, niced too
            assert autogroup.read_text().split()[-2:] == ["nice", "7"]
            assert autogroup.read_text() != Path("/proc/self/autogroup").read_text()
    finally:
        launcher.stop_run(launch.record, process=launch.process, grace=5)


def test_exit_during_startup_reports_code_tail_and_cause():
    plan = fake_plan("exit")
    launch = launcher.start(plan)
    with pytest.raises(LaunchError) as info:
        launcher.wait_ready([launch], timeout=30)
    message = info.value.message
    assert "exited during start-up with exit code 3" in message
    assert "refused this deployment: TP other than 8/16" in message
    assert "Resolved architecture" in message  # the log tail is in the message
    assert runs.get_run(plan.run_id).state is RunState.FAILED
    launcher.stop_run(launch.record, process=launch.process, grace=1)


def test_healthy_server_dying_on_first_request_is_not_ready():
    plan = fake_plan("first-fails")
    launch = launcher.start(plan)
    with pytest.raises(LaunchError, match="on its first request") as info:
        launcher.wait_ready([launch], timeout=30)
    assert "576" in info.value.message  # the MLA head-dimension cause
    launcher.stop_run(launch.record, process=launch.process, grace=1)


def test_engine_sick_after_ready_is_reported():
    plan = fake_plan("sick-after")
    launch = launcher.start(plan)
    launcher.wait_ready([launch], timeout=30)
    with pytest.raises(EndpointError, match="died after it was ready: /health answered 503"):
        launcher.supervise([launch], stop_flag=lambda: False, poll_s=0.2)
    assert runs.get_run(plan.run_id).state is RunState.DIED
    assert group_gone(launch.record.pgid)  # supervise took it down
    launcher.stop_run(launch.record, process=launch.process, grace=2)
    assert group_gone(launch.record.pgid)


def test_engine_process_gone_after_ready_is_reported():
    plan = fake_plan("ok")
    launch = launcher.start(plan)
    launcher.wait_ready([launch], timeout=30)
    os.killpg(launch.record.pgid, signal.SIGKILL)
    with pytest.raises(EndpointError, match=r"API server \(pid \d+\) was killed by SIGKILL"):
        launcher.supervise([launch], stop_flag=lambda: False, poll_s=0.2)
    launcher.stop_run(launch.record, process=launch.process, grace=1)


def test_a_shadow_dying_after_ready_is_taken_down_and_the_primary_serves_on():
    """Behind a shadow edge the tuned server (the first launch) is expendable: when it turns
    sick it is taken down and said, and the stock server is watched on."""
    shadow, primary = launcher.start(fake_plan("sick-after")), launcher.start(fake_plan("ok"))
    launcher.wait_ready([shadow, primary], timeout=30)
    told: list[str] = []
    told_at: list[float] = []
    deadline = time.monotonic() + 30
    launcher.supervise(
        [shadow, primary],
        stop_flag=lambda: time.monotonic() > (told_at[0] if told_at else deadline),
        poll_s=0.2,
        grace=1,
        expendable=lambda launch, exc: (
            told.append(str(exc)),
            told_at.append(time.monotonic() + 1),
        ),
    )
    assert len(told) == 1 and "/health answered 503" in told[0], told
    assert group_gone(shadow.record.pgid)
    assert runs.get_run(shadow.plan.run_id).state is RunState.DIED
    assert launcher.health(primary.plan.url, timeout=5.0) == 200  # watched on, not stopped
    launcher.stop_run(primary.record, process=primary.process, grace=1)


def test_the_shadows_death_is_said_with_its_time_since_start():
    from types import SimpleNamespace

    said: list[tuple[str, float]] = []
    lost = workflow._shadow_loss(
        SimpleNamespace(mode="shadow"), lambda _launch, text, t: said.append((text, t))
    )
    assert lost is not None
    shadow = SimpleNamespace(record=SimpleNamespace(started_at=time.time() - 42.0))
    lost(shadow, EndpointError("vLLM (tuned) died: /health answered 503.\nmore"))
    ((text, elapsed),) = said
    assert text.startswith("vLLM (tuned) died: /health answered 503. The shadow is gone")
    assert 42.0 <= elapsed < 60.0  # seconds since the shadow started, not 0
    assert workflow._shadow_loss(SimpleNamespace(mode="canary"), print) is None


@pytest.mark.parametrize("victim", ["API server", "engine core"])
def test_any_member_dying_takes_the_group_down_and_is_recorded(victim):
    plan = fake_plan("engine")
    launch = launcher.start(plan)
    launcher.wait_ready([launch], timeout=30)
    roles = {m["role"]: m["pid"] for m in launch.record.members}
    assert set(roles) == {"API server", "engine core"}
    os.kill(roles[victim], signal.SIGKILL)
    with pytest.raises(EndpointError, match=f"its {victim} \\(pid {roles[victim]}\\)"):
        launcher.supervise([launch], stop_flag=lambda: False, poll_s=0.2, grace=2)
    assert group_gone(launch.record.pgid)
    record = runs.get_run(plan.run_id)
    assert record.state is RunState.DIED and victim in (record.reason or "")
    assert record.extra["last_log_lines"]  # the cause's evidence is in the record
    # the run's own exit: SIGKILL of the API server; none while it lived (our SIGTERM after
    # its engine died is not the run's end)
    own = -signal.SIGKILL if victim == "API server" else None
    assert record.exit_code == own
    launcher.stop_run(record, process=launch.process, grace=1)
    stopped = runs.get_run(plan.run_id)
    assert stopped.state is RunState.DIED and stopped.exit_code == own  # a stop keeps the cause


def test_a_lost_ray_rank_is_reported_by_vllms_own_line_not_a_traceback():
    plan = fake_plan("replay-death", env={"FAKE_DEATH_LOG": str(RAY_DEATH_LOG)})
    launch = launcher.start(plan)
    launcher.wait_ready([launch], timeout=30)
    with pytest.raises(EndpointError) as died:
        launcher.supervise([launch], stop_flag=lambda: False, poll_s=0.2, grace=2)
    said = str(died.value)
    named = startup.lost_member_line(RAY_DEATH_LOG)
    assert f"vLLM's own line in {plan.log_path}:\n  {named}" in said
    assert "likely cause: a rank's Ray actor died" in said and "Traceback" not in said
    record = runs.get_run(plan.run_id)
    assert record.state is RunState.DIED and record.exit_code == 1
    assert (record.reason or "").endswith(f"; vLLM: {named}")
    launcher.stop_run(record, process=launch.process, grace=1)


def test_a_detached_runs_watcher_records_vllms_line_naming_the_lost_rank() -> None:
    record = _detached("replay-death", env={"FAKE_DEATH_LOG": str(RAY_DEATH_LOG)})
    try:

        def recorded() -> RunRecord | None:  # by the watcher (ps only shows the death)
            seen = runs.read_record(record.id)
            return seen if seen is not None and seen.state is RunState.DIED else None

        _wait(lambda: recorded() is not None, 10)
        seen = recorded()
        assert seen is not None, runs.read_record(record.id)
        assert RAY_NAMING in (seen.reason or "")
    finally:
        launcher.stop_records([runs.get_run(record.id)], grace=2)


@pytest.mark.parametrize(
    "extra",
    [
        ["--nnodes", "2", "--node-rank", "0"],
        ["--distributed-executor-backend", "ray"],  # Ray places ranks on any node of its cluster
    ],
)
def test_multinode_leader_with_a_lost_peer_is_taken_down(monkeypatch, extra):
    """/health stays 200 on vLLM's rank 0 when another host's rank dies; a completion fails."""
    from dataclasses import replace

    monkeypatch.setattr(launcher, "PEER_PROBE_S", 0.3)
    plan = fake_plan("peer-lost")
    plan = replace(plan, argv=[*plan.argv, *extra])
    assert plan.leads_other_nodes
    launch = launcher.start(plan)
    launcher.wait_ready([launch], timeout=30)
    with pytest.raises(EndpointError, match="a rank on another node is gone") as lost:
        launcher.supervise([launch], stop_flag=lambda: False, poll_s=0.2, grace=2)
    assert "not recognised" not in lost.value.message  # it names the cause; no denial after it
    assert group_gone(launch.record.pgid)
    assert runs.get_run(plan.run_id).state is RunState.DIED
    launcher.stop_run(runs.get_run(plan.run_id), process=launch.process, grace=1)


def _detached(mode: str, env: dict[str, str] | None = None) -> RunRecord:
    plan = fake_plan(mode, env=env)
    prepared = workflow.Prepared(profile="fake", runtime="gpu", plans=[plan], checks=[])
    (record,) = workflow.run_serve(prepared, detach=True)
    return record


def _kimictl_json(*args: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "kimictl", *args, "--json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _wait(predicate, timeout: float) -> float:  # type: ignore[no-untyped-def]
    began = time.monotonic()
    while not predicate() and time.monotonic() - began < timeout:
        time.sleep(0.05)
    return time.monotonic() - began


@pytest.mark.parametrize("victim", ["API server", "engine core"])
def test_detached_run_with_a_dead_member_is_ended_by_its_watcher(victim: str) -> None:
    """After detach a watcher owns the group: a member killed, the rest (an engine that ignores
    SIGTERM, as vLLM's do once orphaned) is gone within 10 s and the run recorded died."""
    record = _detached("engine-deaf")
    watcher = record.extra["watcher"]["pid"]
    try:
        assert runs.process_start_ticks(watcher) is not None
        made = _bind_socket_files(record)
        assert set(made) <= set(_socket_files(record))
        pids = {m["role"]: m["pid"] for m in record.members}
        os.kill(pids[victim], signal.SIGKILL)
        took = _wait(lambda: group_gone(record.pgid), 10)
        assert group_gone(record.pgid) and took < 10, f"still running after {took:.1f} s"
        assert _wait(lambda: runs.process_start_ticks(watcher) is None, 3) < 3  # it exits
        seen = runs.read_record(record.id)
        assert seen is not None and seen.state is RunState.DIED
        assert f"{victim} (pid {pids[victim]}) died after ready" in (seen.reason or "")
        assert "kimictl ended the 1 process(es) left of its group" in (seen.reason or "")
        # what the dead processes left is removed without waiting for `stop`; the log stays
        assert _socket_files(record) == [] and Path(record.log_path).exists()
        (shown,) = _kimictl_json("ps", "--all")
        assert shown["state"] == "died" and shown["alive"] is False
    finally:
        launcher.stop_records([runs.get_run(record.id)], grace=2)


def _socket_places(record: RunRecord) -> list[Path]:
    """Where vLLM leaves socket files: the run folder and the run's temp folder."""
    run_dir = Path(record.run_dir)
    return [run_dir, Path(record.extra.get("tmp_dir") or run_dir / "tmp")]


def _bind_socket_files(record: RunRecord) -> list[Path]:
    made = []
    for place in _socket_places(record):
        place.mkdir(parents=True, exist_ok=True)
        # bound at a short path and moved in: a run folder under pytest's tmp can be longer
        # than a socket address allows
        short = Path(tempfile.mkdtemp(dir="/tmp")) / "s"
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(short))
        os.replace(short, place / "left.sock")
        short.parent.rmdir()
        made.append(place / "left.sock")
    return made


def _socket_files(record: RunRecord) -> list[Path]:
    return [p for place in _socket_places(record) if place.exists() for p in place.rglob("*.sock")]


def test_without_its_watcher_ps_ends_a_died_run_and_counts_what_is_left() -> None:
    record = _detached("engine-deaf")
    try:
        os.kill(record.extra["watcher"]["pid"], signal.SIGKILL)  # no watcher: `ps` is the net
        engine = next(m["pid"] for m in record.members if m["role"] == "engine core")
        os.kill(engine, signal.SIGKILL)
        began = time.monotonic()
        (shown,) = _kimictl_json("ps")
        assert time.monotonic() - began < 10
        assert shown["state"] == "died" and shown["health"] is None
        assert shown["reason"] == (
            f"its engine core (pid {engine}) died after ready; kimictl ended the 1 process(es) "
            "left of its group"
        )
        assert group_gone(record.pgid)
        assert _kimictl_json("ps") == []  # nothing left: no longer listed as live
        (again,) = _kimictl_json("ps", "--all")
        assert again["reason"] == shown["reason"]
    finally:
        launcher.stop_records([runs.get_run(record.id)], grace=2)


def test_stop_of_a_died_run_returns_in_seconds() -> None:
    """The API server killed, its engine orphaned and deaf to SIGTERM, no watcher: `stop` with
    the default 20 s grace still returns in a few seconds (SIGKILL after ORPHAN_GRACE_S)."""
    record = _detached("engine-deaf")
    os.kill(record.extra["watcher"]["pid"], signal.SIGKILL)
    os.kill(record.members[0]["pid"], signal.SIGKILL)
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "kimictl", "stop", record.id], capture_output=True, text=True
    )
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    assert took < runs.ORPHAN_GRACE_S + 5, f"stop took {took:.1f} s"
    assert group_gone(record.pgid)
    seen = runs.read_record(record.id)
    assert seen is not None and seen.state is RunState.DIED  # the stop keeps the cause


def test_stop_marks_the_run_before_its_first_signal(monkeypatch) -> None:
    """The race behind a flaky `stop --all` (states stopped, died): `stop` used to SIGTERM first,
    so the detached run's watcher saw a member go while the record still said ready and wrote
    died. Every signal of a stop is now sent after the record says a stop has begun."""
    record = _detached("engine")
    watcher = record.extra["watcher"]["pid"]
    seen: list[tuple[str, float | None]] = []

    def spy(pgid: int, sig: int) -> None:
        stored = runs.read_record(record.id)
        assert stored is not None
        seen.append((stored.state.value, stored.stop_begun_at))
        with_signal(pgid, sig)

    with_signal = launcher._signal_group
    monkeypatch.setattr(launcher, "_signal_group", spy)
    monkeypatch.setattr(runs, "_signal_group", spy)
    (stopped,) = launcher.stop_records([runs.get_run(record.id)], grace=2)
    assert seen and all(state == "stopping" and begun for state, begun in seen), seen
    assert stopped.state is RunState.STOPPED and group_gone(record.pgid)
    assert _wait(lambda: runs.process_start_ticks(watcher) is None, 3) < 3
    stored = runs.read_record(record.id)
    assert stored is not None and stored.state is RunState.STOPPED


def _stop_begins_when_the_member_goes(record: RunRecord, member: str) -> None:
    """What `kimictl stop` does, with the worst timing for a watcher: the stop is marked, then the
    member goes (the stop's SIGTERM) just after the watcher read the record as ready."""
    stored = runs.read_record(record.id)
    assert stored is not None and stored.state is RunState.READY
    runs.begin_stop(stored)
    pid = next(m["pid"] for m in record.members if m["role"] == member)
    os.kill(pid, signal.SIGKILL)
    assert _wait(lambda: runs.process_start_ticks(pid) is None, 3) < 3


def test_a_watcher_that_sees_a_member_go_after_a_stop_began_writes_no_death(monkeypatch) -> None:
    from kimictl.runtime.serving import watch

    record = _detached("engine-deaf")
    os.kill(record.extra["watcher"]["pid"], signal.SIGKILL)  # its decision is driven here
    observed = runs.observed_state

    def stop_meanwhile(seen: RunRecord) -> tuple[RunState, str | None]:
        monkeypatch.setattr(runs, "observed_state", observed)  # once
        _stop_begins_when_the_member_goes(record, "engine core")
        return observed(seen)  # the member is gone: died, as far as /proc tells

    monkeypatch.setattr(runs, "observed_state", stop_meanwhile)
    try:
        assert watch.watch(record.id, poll_s=0.01) == "a stop began: kimictl stop took over"
        stored = runs.read_record(record.id)
        assert stored is not None and stored.state is RunState.STOPPING
        assert runs.process_start_ticks(record.leader_pid) is not None  # it signalled nothing
        # ps's net (end_dead) with the same stale view: nothing written, nothing signalled
        stale = dataclasses.replace(record, state=RunState.DIED, reason="engine core gone")
        assert runs.end_dead(stale).state is RunState.STOPPING
        assert runs.process_start_ticks(record.leader_pid) is not None
    finally:
        (stopped,) = launcher.stop_records([runs.get_run(record.id)], grace=2)
    assert stopped.state is RunState.STOPPED and group_gone(record.pgid)


def test_a_death_written_before_the_stop_began_is_kept() -> None:
    """The other order: the member died on its own and the watcher wrote it down first; the
    stop that follows ends the rest and keeps died."""
    from kimictl.runtime.serving import watch

    record = _detached("engine-deaf")
    os.kill(record.extra["watcher"]["pid"], signal.SIGKILL)
    engine = next(m["pid"] for m in record.members if m["role"] == "engine core")
    os.kill(engine, signal.SIGKILL)
    _wait(lambda: runs.process_start_ticks(engine) is None, 3)
    assert watch.watch(record.id, poll_s=0.01).startswith("died: its engine core")
    (stopped,) = launcher.stop_records([runs.get_run(record.id)], grace=2)
    assert stopped.state is RunState.DIED and stopped.stop_begun_at is not None
    assert group_gone(record.pgid)


def test_serve_says_how_long_a_start_of_the_profile_took_here(capsys) -> None:
    """`serve` prints an estimate before it launches, from this machine's own recorded starts of
    the profile (none yet: it says so); the load sentence is test_estimate's."""
    from types import SimpleNamespace

    from kimictl.commands.serve import _launch

    said, ids = [], []
    try:
        for _ in range(2):
            plan = dataclasses.replace(fake_plan("ok"), profile="fake")
            prepared = workflow.Prepared(profile="fake", runtime="gpu", plans=[plan], checks=[])
            _launch(prepared, SimpleNamespace(timeout=30), detach=True, json_out=False)  # type: ignore[arg-type]
            ids.append(plan.run_id)
            said.append(
                next(x for x in capsys.readouterr().out.splitlines() if "start to ready" in x)
            )
        assert said[0].startswith(
            "  start to ready: no estimate (no start of fake measured on this"
        )
        first = runs.read_record(ids[0])
        assert first is not None and first.ready_at is not None
        took = first.ready_at - first.started_at
        assert said[1].startswith(
            f"  start to ready: about {took:.0f} s (median of 1 start(s) of fake on this machine)"
        )
    finally:
        launcher.stop_records([r for r in map(runs.read_record, ids) if r is not None], grace=2)


def test_sigterm_ignored_escalates_to_sigkill_for_the_whole_group():
    plan = fake_plan("ignore-term")
    launch = launcher.start(plan)
    launcher.wait_ready([launch], timeout=30)
    begin = time.monotonic()
    record = launcher.stop_run(launch.record, process=launch.process, grace=1.0)
    took = time.monotonic() - begin
    assert group_gone(record.pgid), "the child that ignores SIGTERM must be gone too"
    assert 1.0 <= took < 10
    assert record.exit_code == -signal.SIGKILL


def test_api_key_reaches_the_server_by_environment_only():
    plan = fake_plan("ok", env={"VLLM_API_KEY": "k-123"})
    launch = launcher.start(plan)
    launcher.wait_ready([launch], timeout=30)  # the one-token probe sends the key
    assert "k-123" not in (plan.run_dir / "run.json").read_text()
    assert "k-123" not in " ".join(Path(f"/proc/{launch.record.pgid}/cmdline").read_text())
    launcher.stop_run(launch.record, process=launch.process, grace=2)


def test_stop_from_elsewhere_is_not_reported_as_a_death():
    plan = fake_plan("ok")
    launch = launcher.start(plan)
    launcher.wait_ready([launch], timeout=30)
    other = runs.get_run(plan.run_id)
    launcher.stop_run(other, grace=2)  # what `kimictl stop ID` does from another shell
    launcher.supervise([launch], stop_flag=lambda: False, poll_s=0.2)  # returns, no raise
    launch.process.wait(timeout=5)


def test_foreground_children_die_with_a_killed_kimictl(tmp_path):
    """PR_SET_PDEATHSIG: SIGKILL the supervising process; its server must not outlive it, and the
    record must say what happened."""
    port = free_port()
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from test_launcher import fake_plan
            from kimictl.runtime.serving import launcher, workflow
            launch = launcher.start(fake_plan("ok", port={port}))
            print(launch.record.id, launch.record.pgid, flush=True)
            time.sleep(600)
            """
        )
    )
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    run_id, pgid = parent.stdout.readline().split()
    assert not group_gone(int(pgid))
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while not group_gone(int(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_gone(int(pgid))
    record = runs.get_run(run_id)
    assert record.state is RunState.STOPPED
    assert "exited and the server ended with it" in (record.reason or "")
    tmp = Path(record.extra["tmp_dir"])
    launcher.stop_run(record)  # what `kimictl stop` does: cleans what the killed one left
    assert not tmp.exists()


def test_run_serve_stops_everything_on_signal():
    """The foreground path: ready, then SIGTERM to kimictl -> both servers stopped, exit clean."""
    plans = [fake_plan("ok"), fake_plan("ok")]
    prepared = workflow.Prepared(profile="fake", runtime="gpu", plans=plans, checks=[])
    ready: list[list[runs.RunRecord]] = []

    def on_ready(records):
        ready.append(records)
        os.kill(os.getpid(), signal.SIGTERM)  # as if the user pressed Ctrl-C now

    records = workflow.run_serve(prepared, detach=False, on_ready=on_ready, grace=5)
    assert len(ready) == 1 and {r.state for r in ready[0]} == {RunState.READY}
    assert [r.state for r in records] == [RunState.STOPPED, RunState.STOPPED]
    assert all(group_gone(r.pgid) for r in records)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


def test_run_serve_ab_pair_starts_whole_or_not_at_all():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        plans = [fake_plan("ok"), fake_plan("ok", port=busy.getsockname()[1])]
        prepared = workflow.Prepared(profile="fake", runtime="gpu", plans=plans, checks=[])
        with pytest.raises(InputError, match="already in use"):
            workflow.run_serve(prepared, detach=True)
    assert runs.list_runs(include_finished=True) == []


def test_detached_run_survives_and_is_recorded():
    plan = fake_plan("ok")
    prepared = workflow.Prepared(profile="fake", runtime="gpu", plans=[plan], checks=[])
    (record,) = workflow.run_serve(prepared, detach=True)
    try:
        assert record.state is RunState.READY and record.supervisor_pid is None
        assert runs.resolve_target(record.id).url == plan.url
        assert launcher.health(plan.url) == 200
    finally:
        launcher.stop_records([runs.get_run(record.id)], grace=2)
    assert group_gone(record.pgid)


def test_headless_rank_is_ready_without_http(monkeypatch):
    """Ranks above 0 (`--headless`) serve no API: running past the settle time is ready, and
    supervision watches the process only."""
    monkeypatch.setattr(launcher, "HEADLESS_SETTLE_S", 0.5)
    plan = fake_plan("ok")
    silent_port = free_port()  # nothing answers here: HTTP readiness would never come
    plan = LaunchPlan(**{**plan.__dict__, "port": silent_port, "argv": [*plan.argv, "--headless"]})
    launch = launcher.start(plan)
    launcher.wait_ready([launch], timeout=20)
    assert launch.record.state is RunState.READY
    stop_after = time.monotonic() + 1.0
    launcher.supervise([launch], stop_flag=lambda: time.monotonic() > stop_after, poll_s=0.2)
    launcher.stop_run(launch.record, process=launch.process, grace=2)
    assert group_gone(launch.record.pgid)
