"""`kimictl serve`, `ps`, `stop`, `logs`: bad input and the gate (fast), and the real vLLM CPU
server end to end (slow): A/B detach, engine death after ready, exit during start-up, and
start/stop cycles that must leave no process and no socket file behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import niceness

from kimictl.cli import main
from kimictl.runtime.serving import cpu_runtime

STARTUP_S = 600  # a loaded 2-core CI machine; an idle one takes 25-35 s per server


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KIMICTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    return tmp_path / "state"


def free_port(pair: bool = False) -> int:
    """A free port (and, with `pair`, a free port + 1 as well)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if not pair:
            return port
        with socket.socket() as other:
            try:
                other.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port pair")


def run_cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- fast: bad input and the gate


def test_unknown_profile_is_bad_input(capsys):
    code, _, err = run_cli("serve", "no-such-profile", "--dry-run", capsys=capsys)
    assert code == 2
    assert "no-such-profile" in err and err.startswith("error:")


def test_missing_model_path_is_bad_input(capsys, tmp_path):
    missing = tmp_path / "nope"
    code, _, err = run_cli("serve", "cpu-demo", "--model", str(missing), capsys=capsys)
    assert code == 2
    assert f"model path '{missing}' does not exist" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_cli("serve", "cpu-demo", "--model", str(empty), capsys=capsys)
    assert code == 2 and "has no config.json" in err


def test_port_in_use_is_refused_with_a_clear_message(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = run_cli("serve", "cpu-demo", "--port", str(port), capsys=capsys)
    assert code == 2
    assert f"port {port} on 127.0.0.1 is already in use" in err
    assert "--port" in err  # the hint names the way out


def test_profile_failing_the_rules_is_refused_with_every_reason(capsys, tmp_path):
    from kimictl.deployment.profiles import load_profile
    from kimictl.runtime.checks import hardware
    from kimictl.runtime.checks.rules import evaluate
    from kimictl.runtime.checks.stack import probe_stack

    bad = tmp_path / "bad-k3.toml"
    text = (Path(load_profile("k3-tp8-latency").path)).read_text()
    text = text.replace("tensor_parallel_size = 8", "tensor_parallel_size = 4")
    text = text.replace("[compile]", "[compile]\nenforce_eager = true", 1)
    bad.write_text(text)
    spec = load_profile(str(bad)).spec
    expected = [c for c in evaluate(spec, hardware.probe_local(), probe_stack()) if c.blocking]
    assert {"k3.tp", "k3.full_cudagraphs"} <= {c.id for c in expected}
    code, out, err = run_cli("serve", str(bad), capsys=capsys)
    assert code == 1
    assert f"fails {len(expected)} blocking check(s); not launching" in err
    for check in expected:
        assert f"[{check.id}]" in err
    assert "--force" in err  # the way past the gate is named
    # --force passes the gate and reaches the launch itself (no vLLM here: a launch error).
    code, out, err = run_cli("serve", str(bad), "--force", "--dry-run", "--json", capsys=capsys)
    assert code == 0
    assert json.loads(out)["forced"] is True


def test_cpu_profile_skips_the_k3_rules_and_says_so(capsys):
    code, out, _ = run_cli("serve", "cpu-demo", "--dry-run", "--json", capsys=capsys)
    assert code == 0
    doc = json.loads(out)
    assert any("K3 fast-path rules do not apply" in n for n in doc["notes"])
    assert {c["id"] for c in doc["checks"]} <= {"cpu.runtime", "cpu.model", "cpu.port"}
    (run,) = doc["runs"]
    assert "--enforce-eager" in run["argv"] and run["env"]["VLLM_TARGET_DEVICE"] == "cpu"
    assert run["nice"] == cpu_runtime.SERVER_NICE > 0  # clients on the box keep their CPU
    assert run["env"]["TMPDIR"].endswith("/tmp") or "kimictl-" in run["env"]["TMPDIR"]


def test_no_profile_without_gpu_serves_cpu_demo_and_ab_uses_two_ports(capsys):
    code, out, _ = run_cli("serve", "--ab", "--port", "18777", "--dry-run", "--json", capsys=capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["profile"] == "cpu-demo"
    assert any("no GPU found" in n and "cpu-demo" in n for n in doc["notes"])
    tuned, stock = doc["runs"]
    assert (tuned["role"], stock["role"]) == ("tuned", "stock")
    assert tuned["ab_group"] == stock["ab_group"] is not None
    assert (tuned["url"], stock["url"]) == ("http://127.0.0.1:18777", "http://127.0.0.1:18778")
    assert stock["profile"] == "cpu-demo-stock"


def test_api_key_rules(capsys, tmp_path):
    code, _, err = run_cli("serve", "cpu-demo", "--host", "0.0.0.0", "--dry-run", capsys=capsys)
    assert code == 2 and "without an API key" in err and "--insecure" in err
    key = tmp_path / "key"
    key.write_text("sk-very-secret\n")
    code, out, _ = run_cli(
        "serve",
        "cpu-demo",
        "--host",
        "0.0.0.0",
        "--api-key-file",
        str(key),
        "--dry-run",
        capsys=capsys,
    )
    assert code == 0
    assert "sk-very-secret" not in out and "VLLM_API_KEY='***'" in out
    code, out, _ = run_cli(
        "serve", "cpu-demo", "--host", "0.0.0.0", "--insecure", "--dry-run", capsys=capsys
    )
    assert code == 0 and "--host 0.0.0.0" in out


def test_plan_lines_summarise_the_bucket_list(capsys):
    """A plan line shows one word per histogram family, not the 60-value JSON; the exact argv
    (what is run) is `--dry-run --json`'s, and the summary is computed from it."""
    _, out, _ = run_cli("serve", "k3-tp8-latency", "--dry-run", "--json", capsys=capsys)
    (run,) = json.loads(out)["runs"]
    exact = json.loads(run["argv"][run["argv"].index("--custom-histogram-buckets") + 1])
    _, out, _ = run_cli("serve", "k3-tp8-latency", "--dry-run", capsys=capsys)  # 1: no GPU
    (line,) = [x for x in out.splitlines() if "--custom-histogram-buckets" in x]
    for family, bounds in exact.items():
        assert f"{family}: {len(bounds)} bounds, {min(bounds):g}-{max(bounds):g} s" in line
    assert "[" not in line.split("--custom-histogram-buckets", 1)[1]  # no list of values
    assert "(bucket list summarised; `--dry-run --json` has the exact argv)" in out


def test_multinode_flags(capsys):
    code, _, err = run_cli("serve", "k3-tp16-latency", "--nnodes", "4", "--dry-run", capsys=capsys)
    assert code == 2 and "--master-addr" in err
    code, out, _ = run_cli(
        "serve",
        "k3-tp16-latency",
        "--nnodes",
        "4",
        "--master-addr",
        "10.0.0.1",
        "--dry-run",
        "--json",
        capsys=capsys,
    )
    assert code == 1  # no GPU here: the gate blocks, and the dry run still prints the plan
    (run,) = json.loads(out)["runs"]
    assert run["argv"][-6:] == ["--nnodes", "4", "--master-addr", "10.0.0.1", "--node-rank", "0"]
    assert len(run["other_nodes"]) == 3
    assert all(
        a[-3:-1] == ["--node-rank", str(i + 1)] and a[-1] == "--headless"
        for i, a in enumerate(run["other_nodes"])
    )
    # what a person runs on the other nodes: kimictl itself (the gate, the record, supervision)
    assert run["other_node_commands"] == [
        ["kimictl", "serve", "k3-tp16-latency", "--nnodes", "4"]
        + ["--node-rank", str(rank), "--master-addr", "10.0.0.1"]
        for rank in (1, 2, 3)
    ]
    code, out, _ = run_cli(
        "serve",
        "k3-tp16-latency",
        "--nnodes",
        "2",
        "--master-addr",
        "10.0.0.1",
        "--dry-run",
        capsys=capsys,
    )
    line = "kimictl serve k3-tp16-latency --nnodes 2 --node-rank 1 --master-addr 10.0.0.1"
    assert f"  on node rank 1: {line}" in out.splitlines()
    code, out, _ = run_cli("serve", "k3-tp8-latency", "--ray", "--dry-run", "--json", capsys=capsys)
    (run,) = json.loads(out)["runs"]
    i = run["argv"].index("--distributed-executor-backend")
    assert run["argv"][i + 1] == "ray"
    assert run["nice"] == 0  # a GPU server keeps its priority


def test_dry_run_fails_when_the_gate_would_refuse(capsys):
    # No GPU here, so a GB300 profile's gate blocks: the plan is shown, and the exit code says no.
    code, out, err = run_cli("serve", "k3-tp8-latency", "--dry-run", capsys=capsys)
    assert code == 1
    assert "vllm serve moonshotai/Kimi-K3" in out  # the plan is still printed
    (line, hint) = err.splitlines()
    assert line.startswith("error: profile k3-tp8-latency fails ")
    assert line.endswith("serve would refuse to launch (dry run: nothing started)")
    assert "--force" in hint
    code, out, err = run_cli("serve", "k3-tp8-latency", "--dry-run", "--json", capsys=capsys)
    assert code == 1 and "would refuse" in err
    assert any(c["status"] == "fail" for c in json.loads(out)["checks"])
    code, out, err = run_cli("serve", "k3-tp8-latency", "--dry-run", "--force", capsys=capsys)
    assert code == 0 and err == "" and "vllm serve moonshotai/Kimi-K3" in out


def test_ab_needs_a_stock_twin(capsys):
    code, _, err = run_cli("serve", "cpu-demo-stock", "--ab", "--dry-run", capsys=capsys)
    assert code == 2 and "has no stock twin" in err


def test_ps_stop_logs_bad_input(capsys):
    assert run_cli("ps", capsys=capsys)[0] == 0
    code, out, _ = run_cli("ps", "--json", capsys=capsys)
    assert code == 0 and json.loads(out) == []
    code, _, err = run_cli("stop", capsys=capsys)
    assert code == 2 and "--all" in err
    code, _, err = run_cli("stop", "nope-0000", capsys=capsys)
    assert code == 2 and "no run with id 'nope-0000'" in err
    code, _, err = run_cli("logs", "nope-0000", capsys=capsys)
    assert code == 2
    code, out, _ = run_cli("stop", "--all", capsys=capsys)
    assert code == 0 and "nothing to stop" in out


# ---------------------------------------------------------------- slow: the real CPU server


def _kimictl(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kimictl", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        **kw,
    )


def _require_runtime() -> None:
    from kimictl.runtime.serving import cpu_runtime

    if not cpu_runtime.is_installed():
        pytest.skip("kimictl's CPU vLLM runtime is missing: run `kimictl setup cpu-runtime`")


def _group_gone(pgid: int) -> bool:
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return False
    return True


def _leftover_sockets(state: Path, records: list[dict]) -> list[Path]:
    places = [state] + [Path(r["extra"]["tmp_dir"]) for r in records if r["extra"].get("tmp_dir")]
    found = []
    for place in places:
        if place.exists():
            found += [p for p in place.rglob("*") if stat.S_ISSOCK(p.lstat().st_mode)]
    return found


def _records(state: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(state.glob("runs/*/run.json"))]


@pytest.mark.slow
@pytest.mark.timeout(STARTUP_S * 2 + 120)
def test_ab_detach_ps_bench_stop_end_to_end(_state_dir):
    """The README's main job: serve --ab --detach, bench --ab, stop --all; on the way, the
    detached engine-core SIGKILL on a real server (sharing this pair's start)."""
    _require_runtime()
    port = free_port(pair=True)
    try:
        _ab_flow(_state_dir, port)
    finally:  # a failed assertion must not leave two detached servers behind
        subprocess.run([sys.executable, "-m", "kimictl", "stop", "--all"], capture_output=True)


def _ab_flow(_state_dir: Path, port: int) -> None:
    serve = _kimictl("serve", "--ab", "--detach", "--port", str(port), "--timeout", str(STARTUP_S))
    out, err = serve.communicate(timeout=STARTUP_S + 60)
    assert serve.returncode == 0, err[-3000:]
    assert "no GPU found: serving the embedded CPU demo" in out
    assert out.count("ready ") == 2 and "kimictl bench --ab" in out
    assert "loading weights" in err  # start-up phases were shown

    ps = subprocess.run(
        [sys.executable, "-m", "kimictl", "ps", "--json"], capture_output=True, text=True
    )
    live = json.loads(ps.stdout)
    assert sorted(r["role"] for r in live) == ["stock", "tuned"]
    assert {r["state"] for r in live} == {"ready"} and {r["health"] for r in live} == {200}
    assert live[0]["ab_group"] == live[1]["ab_group"]
    for record in live:  # the whole server tree runs niced (the kernel stops at 19)
        assert niceness(record["pids"][0]) == min(19, os.nice(0) + cpu_runtime.SERVER_NICE)
    for record in live:  # both answer a real completion on their own port
        reply = httpx.post(
            f"{record['url']}/v1/completions",
            json={"model": record["model"], "prompt": "def f(x):", "max_tokens": 4},
            timeout=60,
        )
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4

    bench = subprocess.run(
        [sys.executable, "-m", "kimictl", "bench", "--ab", "--num-prompts", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bench.returncode == 0, bench.stderr[-2000:]
    assert all(str(r["port"]) in bench.stdout for r in live)  # it found the recorded pair

    logs = subprocess.run(
        [sys.executable, "-m", "kimictl", "logs", live[0]["id"], "--tail", "5"],
        capture_output=True,
        text=True,
    )
    assert logs.returncode == 0 and len(logs.stdout.splitlines()) == 5

    # Detached, the engine core SIGKILLed (no start of its own: the stock arm of this pair): its
    # watcher ends the rest within 10 s and records died; the tuned arm is untouched.
    stock = next(r for r in live if r["role"] == "stock")
    engine = next(m["pid"] for m in stock["members"] if m["role"] == "engine core")
    pids = [m["pid"] for m in stock["members"]]
    rss = _rss_kib(pids)
    os.kill(engine, signal.SIGKILL)
    began = time.monotonic()
    while not _group_gone(stock["pgid"]) and time.monotonic() - began < 10:
        time.sleep(0.1)
    took = time.monotonic() - began
    assert _group_gone(stock["pgid"]), "a process of the deployment outlived it by 10 s"
    assert _rss_kib(pids) == 0  # every member's RSS freed
    print(f"detached, engine core killed: group gone in {took:.1f} s, {rss // 1024} MiB freed")
    shown = _ps_all()
    assert shown[stock["id"]]["state"] == "died", shown[stock["id"]]
    assert f"engine core (pid {engine})" in shown[stock["id"]]["reason"]
    tuned = next(r for r in live if r["role"] == "tuned")
    assert shown[tuned["id"]]["state"] == "ready" and shown[tuned["id"]]["health"] == 200

    stop = subprocess.run(
        [sys.executable, "-m", "kimictl", "stop", "--all"], capture_output=True, text=True
    )
    assert stop.returncode == 0 and stop.stdout.count("stopped ") == 1  # the live one
    # the died one is acknowledged by name (ps said so): its folder is cleaned, its cause kept
    ack = subprocess.run(
        [sys.executable, "-m", "kimictl", "stop", stock["id"]], capture_output=True
    )
    assert ack.returncode == 0
    records = _records(_state_dir)
    # a stop is never taken for a death (the watcher), a death never for a stop
    assert {r["role"]: r["state"] for r in records} == {"tuned": "stopped", "stock": "died"}
    assert all(_group_gone(r["pgid"]) for r in records)
    assert _leftover_sockets(_state_dir, records) == []


def _serve_until_ready(port: int, *extra: str) -> subprocess.Popen[str]:
    serve = _kimictl("serve", "cpu-demo", "--port", str(port), "--timeout", str(STARTUP_S), *extra)
    assert serve.stdout is not None
    for line in serve.stdout:  # wait for the ready line
        if line.startswith("ready "):
            return serve
    pytest.fail(f"no ready line: {serve.stderr.read()[-3000:] if serve.stderr else ''}")


def _ps_all() -> dict[str, dict]:
    ps = subprocess.run(
        [sys.executable, "-m", "kimictl", "ps", "--all", "--json"], capture_output=True, text=True
    )
    assert ps.returncode == 0, ps.stderr
    return {r["id"]: r for r in json.loads(ps.stdout)}


@pytest.mark.slow
@pytest.mark.timeout(STARTUP_S + 120)
# Each member is killed once across the three tests that kill one (a start costs 30-60 s of CI
# on 2 cores): the engine core here, under the foreground supervisor; the API server and the
# worker below, under the detached watcher; the stock arm's engine core in the A/B test above.
@pytest.mark.parametrize("victim", ["engine core"])
def test_any_member_killed_takes_the_deployment_down(_state_dir, victim):
    """SIGKILL one process of a real deployment: kimictl must stop the rest of its group, exit 1,
    and record (and `ps` show) it as died, naming the process."""
    _require_runtime()
    serve = _serve_until_ready(free_port())
    (record,) = _records(_state_dir)
    assert record["state"] == "ready" and record["supervisor_pid"] == serve.pid
    roles = {m["role"]: m["pid"] for m in record["members"]}
    assert {"API server", "engine core", "worker"} <= set(roles), record["members"]
    os.kill(roles[victim], signal.SIGKILL)
    began = time.monotonic()
    out, err = serve.communicate(timeout=60)
    assert serve.returncode == 1, err[-3000:]
    assert f"its {victim} (pid {roles[victim]})" in err and "died after it was ready" in err
    # start-up was shown live, phase by phase, in the order vLLM goes through them
    shown = [line.split(": ", 1)[1] for line in err.splitlines() if "s cpu-demo: " in line]
    order = [
        "launching vLLM",
        "starting API server",
        "reading model config",
        "starting engine",
        "starting workers",
        "loading weights",
        "allocating KV cache",
        "API up, warming",
        "first completion",
        "ready",
    ]
    assert [p for p in shown if p in order] == order, shown
    assert _group_gone(record["pgid"]), "a process of the deployment outlived it"
    assert time.monotonic() - began < 10
    assert _rss_kib([m["pid"] for m in record["members"]]) == 0  # every member's RSS freed
    (record,) = _records(_state_dir)
    assert record["state"] == "died" and victim in record["reason"]
    assert record["extra"]["last_log_lines"]
    assert _ps_all()[record["id"]]["state"] == "died"
    assert _leftover_sockets(_state_dir, [record]) == []


def _rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


@pytest.mark.slow
@pytest.mark.timeout(STARTUP_S + 120)
# The API server is the orphaning case (engine and worker left, deaf to SIGTERM); the worker
# holds the model. The engine core detached is killed in the A/B test above, on its stock arm.
@pytest.mark.parametrize("victim", ["API server", "worker"])
def test_detached_deployment_with_a_killed_member_is_ended_within_10s(_state_dir, victim):
    """Once detached the watcher owns the group: SIGKILL one member and nothing of the
    deployment is left 10 s later (its memory freed), the run recorded died, `stop` instant."""
    _require_runtime()
    serve = _serve_until_ready(free_port(), "--detach")
    serve.communicate(timeout=60)
    (record,) = _records(_state_dir)
    try:
        assert record["state"] == "ready" and record["supervisor_pid"] is None
        roles = {m["role"]: m["pid"] for m in record["members"]}
        rss = _rss_kib([m["pid"] for m in record["members"]])
        os.kill(roles[victim], signal.SIGKILL)
        began = time.monotonic()
        while not _group_gone(record["pgid"]) and time.monotonic() - began < 10:
            time.sleep(0.1)
        took = time.monotonic() - began
        assert _group_gone(record["pgid"]), "a process of the deployment outlived it by 10 s"
        assert _rss_kib([m["pid"] for m in record["members"]]) == 0  # every member's RSS freed
        print(f"detached, {victim} killed: group gone in {took:.1f} s, {rss // 1024} MiB freed")
        shown = _ps_all()[record["id"]]
        assert shown["state"] == "died" and shown["alive"] is False, shown
        if victim == "API server":  # its engine and worker are orphaned: the watcher ends them
            assert f"{victim} (pid {roles[victim]}) died after ready" in shown["reason"]
            assert "kimictl ended the" in shown["reason"]
        else:  # vLLM's engine may take the rest down itself before the watcher's next look
            assert "died after ready" in shown["reason"], shown["reason"]
        # the watcher removes the dead run's sockets itself, before any `stop`
        deadline = time.monotonic() + 5
        while _leftover_sockets(_state_dir, [record]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _leftover_sockets(_state_dir, [record]) == []
    finally:
        began = time.monotonic()
        subprocess.run([sys.executable, "-m", "kimictl", "stop", record["id"]])
    assert time.monotonic() - began < 10  # nothing left to wait for
    assert _group_gone(record["pgid"])
    assert _ps_all()[record["id"]]["state"] == "died"  # the stop keeps the cause


def _stat_fields(path: Path) -> list[str]:
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


@pytest.mark.slow
@pytest.mark.timeout(STARTUP_S)
def test_vllm_exiting_during_startup_is_reported(_state_dir, tmp_path):
    _require_runtime()
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    serve = _kimictl("serve", "cpu-demo", "--model", str(broken), "--port", str(free_port()))
    out, err = serve.communicate(timeout=STARTUP_S)
    assert serve.returncode == 1
    assert "exited during start-up with exit code 1" in err
    assert "likely cause:" in err
    assert "last " in err and "lines of" in err and "no-such-architecture" in err
    (record,) = _records(_state_dir)
    assert record["state"] == "failed" and record["exit_code"] == 1
    assert _group_gone(record["pgid"])


CYCLES = 20


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_start_stop_cycles_leave_nothing_behind(_state_dir):
    """20 cycles on one port: 19 stopped during start-up by SIGINT/SIGTERM to kimictl (cheap: no
    model load), 1 by SIGKILL to kimictl (its server must die with it). The full ready->stop path
    is covered by the A/B and engine-death tests above."""
    _require_runtime()
    port = free_port()
    for cycle in range(CYCLES):
        serve = _kimictl("serve", "cpu-demo", "--port", str(port))
        deadline = time.monotonic() + 60
        while len(_records(_state_dir)) <= cycle:
            assert time.monotonic() < deadline, "no run record appeared"
            time.sleep(0.1)
        time.sleep(1.0)  # vLLM is importing: its processes and sockets are appearing
        if cycle == CYCLES - 1:
            serve.kill()
        else:
            serve.send_signal(signal.SIGINT if cycle % 2 else signal.SIGTERM)
        serve.communicate(timeout=60)
        record = _newest(_state_dir)
        deadline = time.monotonic() + 30
        while not _group_gone(record["pgid"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _group_gone(record["pgid"]), f"cycle {cycle}: vLLM outlived kimictl"
        if cycle < CYCLES - 1:
            assert serve.returncode == 0, f"cycle {cycle}"
            assert record["state"] == "stopped"
    records = _records(_state_dir)
    assert len(records) == CYCLES
    ps = subprocess.run(
        [sys.executable, "-m", "kimictl", "ps", "--all", "--json"], capture_output=True, text=True
    )
    states = [r["state"] for r in json.loads(ps.stdout)]
    assert states == ["stopped"] * CYCLES  # the SIGKILLed one too, with its reason
    # SIGKILL left no chance to clean up; `kimictl stop --all` is the user's way, it is a no-op
    # for the processes (gone) but removes what the dead run left.
    subprocess.run([sys.executable, "-m", "kimictl", "stop", _newest(_state_dir)["id"]], check=True)
    assert _leftover_sockets(_state_dir, records) == []
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # the port is free again


def _newest(state: Path) -> dict:
    return max(_records(state), key=lambda r: r["started_at"])


def test_logs_follow_ends_when_the_server_stops(_state_dir):
    from test_launcher import fake_plan

    from kimictl.runtime.serving import launcher, runs, workflow

    plan = fake_plan("ok")
    prepared = workflow.Prepared(profile="fake", runtime="gpu", plans=[plan], checks=[])
    (record,) = workflow.run_serve(prepared, detach=True)
    follow = _kimictl("logs", record.id, "-f", "--tail", "0")
    try:
        time.sleep(1.5)
        assert follow.poll() is None  # still following a live server
    finally:
        launcher.stop_records([runs.get_run(record.id)], grace=2)
    out, _ = follow.communicate(timeout=20)
    assert follow.returncode == 0
    assert "Starting vLLM server on" in out  # the whole log (--tail 0), then it ended by itself


def test_port_out_of_range_is_bad_input(capsys) -> None:
    from kimictl.cli import main

    assert main(["serve", "cpu-demo", "--port", "99999", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --port 99999 is not a TCP port; allowed: 1-65535.")


@pytest.mark.parametrize("argv", [["serve", "cpu-demo"], ["demo"]])
def test_missing_cpu_runtime_hint_names_the_setup_command(tmp_path: Path, argv: list[str]) -> None:
    """With no CPU runtime (empty cache) the gate refuses, and the hint is the command that fixes
    it, not the profile or --force (demo has no --force)."""
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "KIMICTL_STATE_DIR": str(tmp_path / "state"),
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    done = subprocess.run(
        [sys.executable, "-m", "kimictl", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1, done.stderr
    assert "[cpu.runtime]" in done.stderr
    assert done.stderr.splitlines()[-1] == "hint: run `kimictl setup cpu-runtime`, then try again."
    assert "--force" not in done.stderr


def test_a_headless_rank_says_it_serves_no_http_and_gives_no_monitor_hint(capsys):
    """Rank > 0 (`--headless`) has no URL to monitor: no `ready ... http://` line, no hint."""
    import time as _time

    from kimictl.commands.serve import _ready_printer
    from kimictl.runtime.serving.runs import RunRecord, RunState

    now = _time.time()
    record = RunRecord(
        id="k3-tp16-1a2b",
        name="k3-tp16",
        role=None,
        ab_group=None,
        url="http://127.0.0.1:8340",
        model="kimi-k3",
        profile="k3-tp16",
        pids=[1],
        pgid=1,
        port=8340,
        host="127.0.0.1",
        log_path="",
        run_dir="",
        argv_redacted=["vllm", "serve", "m", "--node-rank", "1", "--headless"],
        started_at=now - 10,
        gpus=8,
        state=RunState.READY,
        ready_at=now,
    )
    _ready_printer(detach=True, quiet=False)([record])
    out = capsys.readouterr().out
    assert "started k3-tp16-1a2b: headless rank (no HTTP on this node" in out
    assert "http://" not in out and "monitor" not in out
    assert "stop:    kimictl stop k3-tp16-1a2b" in out
