"""`kimictl bench` end to end: bad input (exit 2 and the sentence), fault cases against a real
local server process (killed mid-run; Ctrl-C), and slow tests against the real vLLM CPU server."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_loadgen import EMITTER_SRC, free_port

from kimictl.cli import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["bench", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "no target"),
        (["--target", "http://x:1", "--workload", "bogus"], "--workload 'bogus' is not one of"),
        (["--target", "http://x:1", "--concurrency", "1,x"], "'x' is not a whole number"),
        (["--target", "http://x:1", "--concurrency", "0"], "must be > 0"),
        (["--target", "http://x:1", "--input-len", "5:2"], "--input-len '5:2'"),
        (["--target", "http://x:1", "--slo", "ttft<=3"], "needs a statistic"),
        (["--target", "http://x:1", "--workload", "replay"], "needs --trace"),
        (["--target", "http://x:1", "--rate", "1", "--concurrency", "1,2"], "one cap"),
        (["--target", "http://x:1", "--endpoint", "grpc"], "--endpoint 'grpc'"),
        (["--target", "a=http://x:1", "--target", "a=http://y:1"], "two targets are named 'a'"),
        (["--target", "nope-not-a-run"], "no run with id"),
        (["--ab"], "no live A/B pair"),
        (["--ab", "--target", "http://x:1"], "exclude each other"),
        (["--target", "http://x:1", "--num-prompts", "0"], "--num-prompts 0 must be >= 1"),
        (
            ["--target", "http://x:1", "--arrivals", "uniform", "--rate", "2"],
            "--arrivals 'uniform'",
        ),
    ],
)
def test_bad_input_exits_2_with_one_sentence(
    args: list[str],
    needle: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KIMICTL_STATE_DIR", str(tmp_path))
    code, out, err = run_cli(args, capsys)
    assert code == 2
    assert needle in err and err.startswith("error: ")
    assert "Traceback" not in err and out == ""


def test_unreachable_target_is_an_endpoint_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(
        ["--target", f"http://127.0.0.1:{free_port()}", "--num-prompts", "2"], capsys
    )
    assert code == 1 and "cannot read the model list" in err


@pytest.fixture
def emitter_proc(tmp_path: Path):
    src = tmp_path / "emitter.py"
    src.write_text(EMITTER_SRC)
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(src), str(port)])
    deadline = time.monotonic() + 10
    import socket

    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    yield proc, f"http://127.0.0.1:{port}"
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _bench_proc(url: str, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kimictl",
            "bench",
            "--target",
            f"e={url}",
            "--model",
            "ok",
            "--input-len",
            "8",
            "--output-len",
            "150",
            "--concurrency",
            "2",
            "--num-prompts",
            "1000",
            "--json",
            str(out / "r.json"),
            "--csv",
            str(out / "r.csv"),
            "--timeout",
            "60",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_load(url: str) -> None:
    """Until the bench streams requests (the emitter counts connections; our polls count too)."""
    import httpx

    polls = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        polls += 1
        if (
            httpx.get(f"{url}/stats").json()["connections"] - polls >= 4
        ):  # models, metrics, 2 streams
            time.sleep(1.0)  # let a few requests finish
            return
        time.sleep(0.2)
    raise AssertionError("the bench never started streaming")


def test_server_killed_mid_run_saves_partial_results_and_fails(
    emitter_proc, tmp_path: Path
) -> None:
    proc, url = emitter_proc
    bench = _bench_proc(url, tmp_path)
    _wait_for_load(url)
    proc.kill()  # the server dies under load
    t0 = time.monotonic()
    _, err = bench.communicate(timeout=30)
    assert time.monotonic() - t0 < 10  # no hang: far below the 60 s request timeout
    assert bench.returncode == 1
    assert "stopped early" in err and "stopped answering" in err
    doc = json.loads((tmp_path / "r.json").read_text())
    (run,) = doc["runs"]
    assert run["completed"] >= 1 and run["failed"] >= 3
    assert set(run["kimictl"]["errors_by_kind"]) <= {"connect", "disconnect"}
    assert doc["stop_reason"] and "stopped answering" in doc["stop_reason"]
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert sum(r["ok"] == "1" for r in rows) == run["completed"]


def test_ctrl_c_stops_quickly_keeps_finished_and_exits_130(emitter_proc, tmp_path: Path) -> None:
    _, url = emitter_proc
    bench = _bench_proc(url, tmp_path)
    _wait_for_load(url)
    t0 = time.monotonic()
    bench.send_signal(signal.SIGINT)
    _, err = bench.communicate(timeout=30)
    assert time.monotonic() - t0 < 5
    assert bench.returncode == 130 and "interrupted" in err
    doc = json.loads((tmp_path / "r.json").read_text())
    (run,) = doc["runs"]
    assert run["completed"] >= 1 and run["failed"] == 0
    assert 1 <= run["kimictl"]["cancelled"] <= 2  # the two in flight
    assert doc["stop_reason"] == "interrupted"


# ---------------------------------------------------------------------------------------------
# the real vLLM CPU server


@pytest.mark.slow
def test_random_sweep_against_vllm(
    cpu_server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(
        [
            "--target",
            f"cpu={cpu_server.url}",
            "--input-len",
            "32",
            "--output-len",
            "8",
            "--concurrency",
            "1,2",
            "--num-prompts",
            "4",
            "--warmup",
            "1",
            "--gpus",
            "1",
            "--slo",
            "ttft_p99<=60s",
            "--json",
            str(tmp_path / "r.json"),
            "--csv",
            str(tmp_path / "r.csv"),
        ],
        capsys,
    )
    assert code == 0
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [r["kimictl"]["point"] for r in doc["runs"]] == ["c=1", "c=2"]
    for r in doc["runs"]:
        assert r["model_id"] == cpu_server.model and r["completed"] == 4 and r["failed"] == 0
        assert r["total_input_tokens"] == 4 * 32  # token-id prompts: exact lengths
        assert r["total_output_tokens"] == 4 * 8  # ignore_eos: exact output lengths
        assert r["mean_tpot_ms"] > 0 and r["p99_ttft_ms"] >= r["median_ttft_ms"]
        assert r["request_goodput"] == pytest.approx(r["request_throughput"])
        sv = r["kimictl"]["server_view"]
        assert sv and sv["requests_finished"] == 4  # the server saw exactly our requests
        assert r["spec_decode_acceptance_length"] is None  # no speculation on this server
    assert r["max_concurrent_requests"] == 2
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert len(rows) == 1 + 8 and sum(x["warmup"] == "1" for x in rows) == 1
    assert "tok/s/user p10 (slow tail)" in out


@pytest.mark.slow
def test_ab_same_requests_to_both(
    cpu_server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(
        [
            "--target",
            f"a={cpu_server.url}",
            "--target",
            f"b={cpu_server.url}",
            "--input-len",
            "16:48",
            "--output-len",
            "8",
            "--concurrency",
            "2",
            "--num-prompts",
            "6",
            "--seed",
            "3",
            "--json",
            str(tmp_path / "ab.json"),
        ],
        capsys,
    )
    assert code == 0
    doc = json.loads((tmp_path / "ab.json").read_text())
    a, b = doc["runs"]
    assert a["total_input_tokens"] == b["total_input_tokens"]  # identical request sequence
    head = next(r for r in doc["ab"] if r["metric"].startswith("interactivity p50"))
    assert head["verdict"] in ("faster", "slower", "no significant difference")
    assert head["ratio"] == pytest.approx(head["a"] / head["b"])
    assert "A/B at c=2: a vs b" in out and "verdict at c=2" in out


@pytest.mark.slow
def test_agentic_chat_open_loop_against_vllm(cpu_server, tmp_path: Path, capsys) -> None:
    code, _, _ = run_cli(
        [
            "--target",
            cpu_server.url,
            "--workload",
            "agentic",
            "--agentic-config",
            "small",
            "--endpoint",
            "chat",
            "--rate",
            "4",
            "--num-prompts",
            "8",
            "--json",
            str(tmp_path / "g.json"),
            "--csv",
            str(tmp_path / "g.csv"),
        ],
        capsys,
    )
    assert code == 0
    (run,) = json.loads((tmp_path / "g.json").read_text())["runs"]
    assert run["endpoint_type"] == "openai-chat" and run["request_rate"] == 4
    assert run["failed"] == 0 and run["completed"] >= 8  # whole sessions: may overshoot
    rows = list(csv.DictReader((tmp_path / "g.csv").open()))
    assert any(int(r["turn"]) > 0 for r in rows)  # multi-turn sessions really ran
    by_session: dict[str, list[int]] = {}
    for r in rows:
        by_session.setdefault(r["session"], []).append(int(r["prompt_tokens"]))
    assert any(len(v) > 1 and max(v) > min(v) for v in by_session.values())  # growing context


@pytest.mark.slow
def test_replay_and_prompts_against_vllm(cpu_server, tmp_path: Path, capsys) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps({"timestamp": ts, "input_length": 40, "output_length": 4})
            for ts in (0, 300, 600, 900)
        )
    )
    t0 = time.monotonic()
    code, _, _ = run_cli(
        [
            "--target",
            cpu_server.url,
            "--workload",
            "replay",
            "--trace",
            str(trace),
            "--num-prompts",
            "4",
            "--json",
            str(tmp_path / "r.json"),
            "--csv",
            str(tmp_path / "r.csv"),
        ],
        capsys,
    )
    assert code == 0 and time.monotonic() - t0 >= 0.9
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    starts = sorted(float(r["start_s"]) for r in rows)
    assert [round(s - starts[0], 1) for s in starts] == pytest.approx([0, 0.3, 0.6, 0.9], abs=0.1)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n"import os"\n')
    code, _, _ = run_cli(
        [
            "--target",
            cpu_server.url,
            "--workload",
            "prompts",
            "--prompts",
            str(prompts),
            "--output-len",
            "4",
            "--num-prompts",
            "3",
            "--json",
            str(tmp_path / "p.json"),
        ],
        capsys,
    )
    assert code == 0
    (run,) = json.loads((tmp_path / "p.json").read_text())["runs"]
    assert run["completed"] == 3 and run["total_output_tokens"] == 12
