"""Run records: atomic writes, liveness from real processes, target resolution, A/B pairs."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kimictl.core.errors import InputError
from kimictl.runtime.serving import launcher, runs
from kimictl.runtime.serving.runs import RunRecord, RunState


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KIMICTL_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def sleeper():
    """A real process in its own process group, like a launched vLLM."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _record(name: str, pid: int, *, role=None, ab_group=None, state=RunState.READY, port=8000):
    run_id = runs.new_run_id(name)
    return RunRecord(
        id=run_id,
        name=name,
        role=role,
        ab_group=ab_group,
        url=f"http://127.0.0.1:{port}",
        model="tiny",
        profile=name,
        pids=[pid],
        pgid=pid,
        port=port,
        host="127.0.0.1",
        log_path=str(runs.run_dir_for(run_id) / "vllm.log"),
        run_dir=str(runs.run_dir_for(run_id)),
        argv_redacted=["vllm", "serve", "x"],
        started_at=time.time(),
        gpus=0,
        state=state,
        start_ticks=runs.process_start_ticks(pid),
    )


def test_record_round_trips_through_disk(sleeper):
    record = _record("cpu-demo", sleeper.pid)
    path = runs.write_record(record)
    assert json.loads(path.read_text())["state"] == "ready"
    assert runs.get_run(record.id) == record
    # no temp files left beside the record
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.json"]


def test_ids_are_unique_and_path_safe():
    ids = set()
    for _ in range(50):  # unique among existing run folders (4 hex digits alone collide ~2%)
        run_id = runs.new_run_id("My Profile/../x")
        runs.run_dir_for(run_id).mkdir(parents=True)
        ids.add(run_id)
    assert len(ids) == 50
    assert all("/" not in i and " " not in i and i.startswith("my-profile-x-") for i in ids)


def test_dead_ready_run_is_reported_died(sleeper):
    record = _record("cpu-demo", sleeper.pid)
    runs.write_record(record)
    os.killpg(sleeper.pid, signal.SIGKILL)
    sleeper.wait()
    # a death nobody saw stays listed (marked) until `kimictl stop` acknowledges it
    (seen,) = runs.list_runs()
    assert seen.state is RunState.DIED
    assert "engine died after ready" in (seen.reason or "")
    with pytest.raises(InputError, match="has no live endpoint"):
        runs.resolve_target(record.id)
    (stopped,) = launcher.stop_records([seen], grace=0)
    assert stopped.state is RunState.DIED
    assert runs.list_runs() == []
    assert [r.id for r in runs.list_runs(include_finished=True)] == [record.id]


def test_recycled_pid_is_not_taken_for_the_server(sleeper):
    record = _record("cpu-demo", sleeper.pid)
    # Same pid, but a start time that is not the live process's: a recycled pid in another group.
    runs.write_record(
        RunRecord.from_json({**record.to_json(), "start_ticks": 1, "pgid": 2**22 + 7})
    )
    (seen,) = runs.list_runs(include_finished=True)
    assert seen.state is RunState.DIED


def test_resolve_target_forms(sleeper):
    record = _record("cpu-demo", sleeper.pid, port=18123)
    runs.write_record(record)
    by_id = runs.resolve_target(record.id)
    assert (by_id.url, by_id.model, by_id.run_id) == ("http://127.0.0.1:18123", "tiny", record.id)
    by_prefix = runs.resolve_target(record.id[:-2])
    assert by_prefix.run_id == record.id
    named = runs.resolve_target(f"mine={record.id}")
    assert named.name == "mine" and named.url == record.url
    plain = runs.resolve_target("http://10.0.0.5:8000/v1/")
    assert (plain.url, plain.model, plain.gpus) == ("http://10.0.0.5:8000", None, None)
    named_url = runs.resolve_target("stock=http://h:1")
    assert (named_url.name, named_url.url) == ("stock", "http://h:1")


@pytest.mark.parametrize("text", ["", "nope-1234", "x=", "ftp://host:1", "=http://h:1"])
def test_resolve_target_rejects_unknown(text):
    with pytest.raises(InputError):
        runs.resolve_target(text)


@pytest.mark.parametrize(
    ("text", "guess"),
    [
        ("htp:/127.0.0.1:8100", "; did you mean http://127.0.0.1:8100?"),
        ("name=localhost:8000", "; did you mean http://localhost:8000?"),
        ("My_Server", "."),
    ],
)
def test_a_target_that_is_neither_url_nor_run_id_says_so(text, guess):
    with pytest.raises(InputError) as caught:
        runs.resolve_target(text)
    value = text.split("=", 1)[-1]
    assert caught.value.message == (
        f"'{value}' is neither a URL nor a run id: a URL looks like http://127.0.0.1:8000 "
        f"(http or https), a run id like cpu-demo-3f9a{guess}"
    )
    assert "kimictl ps" in (caught.value.hint or "")


def test_latest_ab_pair_needs_both_alive(sleeper):
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        tuned = _record("cpu-demo", sleeper.pid, role="tuned", ab_group="ab-1", port=1)
        stock = _record("cpu-demo-stock", other.pid, role="stock", ab_group="ab-1", port=2)
        runs.write_record(tuned)
        runs.write_record(stock)
        pair = runs.latest_ab_pair()
        assert pair is not None and (pair[0].id, pair[1].id) == (tuned.id, stock.id)
        assert runs.resolve_target("stock").run_id == stock.id
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()
        assert runs.latest_ab_pair() is None
    finally:
        if other.poll() is None:
            os.killpg(other.pid, signal.SIGKILL)
            other.wait()


def test_zombie_leader_counts_as_gone():
    # A child that exits but is not reaped stays a zombie: the group must read as dead.
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    ticks = runs.process_start_ticks(proc.pid)
    deadline = time.monotonic() + 10
    while runs.process_start_ticks(proc.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    record = _record("z", proc.pid)
    record = RunRecord.from_json({**record.to_json(), "start_ticks": ticks})
    assert not runs.is_alive(record)
    proc.wait()


@pytest.mark.parametrize("columns", ["80", "60"])
def test_ps_prints_whole_run_ids_when_piped_and_narrow(sleeper, _state_dir, columns):
    """The ID is what `logs`/`stop` take: piped (not a terminal) at 80 or fewer columns it must
    come out whole, the other columns give way (real `kimictl ps` in a subprocess)."""
    ids = []
    for name in ("k3-tp16-latency-stock", "k3-tp8-long-context-stock"):
        record = _record(name, sleeper.pid, role="stock", port=18000 + len(ids))
        record = dataclasses.replace(
            record, model="/models/moonshotai/Kimi-K3-Instruct-0905-fp8-with-a-long-path"
        )
        runs.write_record(record)
        ids.append(record.id)
    env = {**os.environ, "KIMICTL_STATE_DIR": str(_state_dir), "COLUMNS": columns}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    done = subprocess.run(
        [sys.executable, "-m", "kimictl", "ps"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    for run_id in ids:
        assert run_id in words, done.stdout


def test_ps_probes_health_a_ready_run_without_an_answer_is_unhealthy(sleeper, _state_dir):
    """`ps --json` asks each live run's /health now: a real server answering 200 stays ready,
    a ready run whose port answers nothing is unhealthy; a multi-node rank 0 whose /health says
    200 but whose completions fail (its peer rank is gone) is unhealthy too, with the reason,
    while a one-node run on the same server is not sent a completion (real `kimictl ps`)."""
    import http.server
    import threading

    completions = []

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:
            completions.append(self.path)
            body = b'{"error": "EngineCore encountered an issue"}'
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        answering = _record("answers", sleeper.pid, port=port)
        rank0 = dataclasses.replace(
            _record("rank0", sleeper.pid, port=port),
            argv_redacted=["vllm", "serve", "x", "--nnodes", "2", "--master-addr", "10.0.0.1"],
        )
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            silent = _record("silent", sleeper.pid, port=s.getsockname()[1])
        for record in (answering, rank0, silent):
            runs.write_record(record)
        env = {**os.environ, "KIMICTL_STATE_DIR": str(_state_dir)}
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
        done = subprocess.run(
            [sys.executable, "-m", "kimictl", "ps", "--json"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    shown = {r["name"]: (r["state"], r["health"]) for r in json.loads(done.stdout)}
    assert shown == {
        "answers": ("ready", 200),
        "rank0": ("unhealthy", 200),
        "silent": ("unhealthy", None),
    }
    (lost,) = [r["peer_lost"] for r in json.loads(done.stdout) if r["name"] == "rank0"]
    assert "HTTP 500" in lost and "another node" in lost
    assert completions == ["/v1/completions"]  # the rank 0 only


def test_ps_piped_never_wraps_a_url(sleeper):
    """Piped (no TTY, rich's 80 columns), each run is one line and its URL stays whole."""
    from dataclasses import replace

    record = _record("a-profile-with-a-long-name-for-its-runs", sleeper.pid, port=18731)
    url = "http://very-long-host-name.inference.cluster.example.internal:18731"
    record = replace(record, url=url, model="moonshotai/Kimi-K3-with-a-long-served-name")
    runs.write_record(record)
    done = subprocess.run(
        [sys.executable, "-m", "kimictl", "ps"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},
    )
    assert done.returncode == 0, done.stderr
    (row,) = [line for line in done.stdout.splitlines() if line.startswith(f"{record.id} ")]
    assert url in row and "moonshotai/Kimi-K3-with-a-long-served-name" in row
    assert len(row) > 80  # wider than rich's default: nothing was folded to fit
