"""`kimictl bench` end to end: bad input (exit 2 and the sentence), fault cases against a real
local server process (killed mid-run; Ctrl-C), and slow tests against the real vLLM CPU server."""

from __future__ import annotations

import csv
import itertools
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_loadgen import EMITTER_SRC, free_port

from kimictl.cli import main
from kimictl.runtime.load.ab import NOT_MEASURED


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
        (["--target", "htp:/127.0.0.1:8100"], "is neither a URL nor a run id"),
        (["--ab"], "no live A/B pair"),
        (["--ab", "--target", "http://x:1"], "exclude each other"),
        (["--target", "http://x:1", "--num-prompts", "0"], "--num-prompts 0 must be >= 1"),
        (["--target", "http://x:1", "--prefix-len", "-1"], "--prefix-len -1 must be >= 0"),
        (["--target", "http://x:1", "--traces-port", "0"], "allowed 1 to 65535"),
        (["--target", "http://x:1", "--timeout", "0"], "--timeout 0.0 must be > 0 seconds"),
        (["--target", "http://x:1", "--burstiness", "0", "--rate", "1"], "must be > 0"),
        (
            ["--target", "http://x:1", "--arrivals", "uniform", "--rate", "2"],
            "--arrivals 'uniform'",
        ),
        # --json is a switch, as in every command; the report file is --output
        (["--target", "http://x:1", "--json", "r.json"], "use --output FILE (-o FILE)"),
        (["--target", "http://x:1", "--json", "-"], "--json takes no value ('-')"),
        (["--target", "http://x:1", "stray"], "unexpected argument(s) stray"),
        (["--target", "http://x:1", "--schedule", "abab"], "--schedule 'abab' is not one of"),
        (
            ["--target", "http://x:1", "--schedule", "turns", "--interleave"],
            "ask for two schedules",
        ),
        (["--target", "http://x:1", "--workers", "0"], "--workers 0 must be >= 1"),
        (["--target", "http://x:1", "--workers", "two"], "'--workers' got 'two'"),
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


# test_loadgen's emitter, run by a wrapper that prints one line for each completion request it
# receives. The bench keeps 2 requests in flight on keep-alive connections, so request 3 arrives
# only after the bench has read a whole response: the tests wait on that, not on the clock.
REQUEST_REPORTER = r"""
import asyncio, sys
emitter = {"__name__": "emitter"}
exec(compile(open(sys.argv[2]).read(), "emitter", "exec"), emitter)

class Reader:
    def __init__(self, reader):
        self.reader = reader
    async def readuntil(self, separator):
        head = await self.reader.readuntil(separator)
        if head.startswith(b"POST "):
            print("request", flush=True)
        return head
    def __getattr__(self, name):
        return getattr(self.reader, name)

async def handle(reader, writer):
    await emitter["handle"](Reader(reader), writer)

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""
CONCURRENCY = 2
REQUEST_TIMEOUT_S = 60  # the bench's --timeout: what a client stuck on a dead server waits


@pytest.fixture
def emitter_proc(tmp_path: Path):
    (tmp_path / "emitter.py").write_text(EMITTER_SRC)
    (tmp_path / "reporter.py").write_text(REQUEST_REPORTER)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "reporter.py"), str(port), str(tmp_path / "emitter.py")],
        stdout=subprocess.PIPE,
    )
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
            str(CONCURRENCY),
            "--num-prompts",
            "1000",
            "--output",
            str(out / "r.json"),
            "--csv",
            str(out / "r.csv"),
            "--timeout",
            str(REQUEST_TIMEOUT_S),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_finished_requests(emitter: subprocess.Popen[bytes], finished: int) -> None:
    """Until the bench has read `finished` whole responses: the emitter has then received
    `finished + CONCURRENCY` requests (one line each on its stdout)."""
    assert emitter.stdout is not None
    fd, seen = emitter.stdout.fileno(), 0
    deadline = time.monotonic() + 120  # a bench that never streams fails here, not in a hang
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while seen < finished + CONCURRENCY:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise AssertionError(f"the emitter saw {seen} requests in 120 s")
            data = os.read(fd, 4096)
            if not data:
                raise AssertionError("the emitter exited")
            seen += data.count(b"\n")


# one event loop, and the streams spread over two worker processes (runtime/load/workers.py)
WORKERS = pytest.mark.parametrize("workers", ["1", "2"])


@WORKERS
def test_server_killed_mid_run_saves_partial_results_and_fails(
    emitter_proc, tmp_path: Path, workers: str
) -> None:
    proc, url = emitter_proc
    bench = _bench_proc(url, tmp_path, "--workers", workers)
    _wait_for_finished_requests(proc, 2)
    proc.kill()  # the server dies under load, 2 requests in flight
    # No hang: the bench ends before one request timeout has passed (a client waiting on the dead
    # server would take that long), and no request ended by timing out (errors_by_kind below).
    try:
        _, err = bench.communicate(timeout=REQUEST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        bench.kill()
        bench.communicate()
        pytest.fail(f"the bench still ran {REQUEST_TIMEOUT_S} s after the server died")
    assert bench.returncode == 1
    assert "stopped early" in err and "stopped answering" in err
    doc = json.loads((tmp_path / "r.json").read_text())
    (run,) = doc["runs"]
    assert run["completed"] >= 1 and run["failed"] >= 3
    assert set(run["kimictl"]["errors_by_kind"]) <= {"connect", "disconnect"}
    assert doc["stop_reason"] and "stopped answering" in doc["stop_reason"]
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert sum(r["ok"] == "1" for r in rows) == run["completed"]


@WORKERS
def test_ctrl_c_stops_quickly_keeps_finished_and_exits_130(
    emitter_proc, tmp_path: Path, workers: str
) -> None:
    proc, url = emitter_proc
    bench = _bench_proc(url, tmp_path, "--workers", workers)
    _wait_for_finished_requests(proc, 2)
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
    assert len(run["kimictl"]["client_workers"]) == int(workers)


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
            "--output",
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
        assert r["p99_ttft_ms"] >= r["median_ttft_ms"]
        # the client's own health is measured; timings it cannot vouch for are flagged
        k = r["kimictl"]
        assert k["client_lag_samples"] > 0 and k["client_lag_ms_p99"] >= 0
        if k["client_warning"] is None:
            assert r["mean_tpot_ms"] > 0 and r["median_ttft_ms"] < r["median_e2el_ms"]
        else:
            assert "client lagged" in out and "unreliable" in out
        assert r["request_goodput"] == pytest.approx(r["request_throughput"])
        sv = r["kimictl"]["server_view"]
        assert sv and sv["requests_finished"] == 4  # the server saw exactly our requests
        assert "spec_decode_acceptance_rate" not in r  # no speculation: vLLM writes no spec keys
        assert r["rtfx"] == 0.0 and len(r["queue_times"]) == 4
    assert r["kimictl"]["max_in_flight"] == 2 <= r["max_concurrent_requests"]
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
            "--output",
            str(tmp_path / "ab.json"),
            "--csv",
            str(tmp_path / "ab.csv"),
        ],
        capsys,
    )
    assert code == 0
    doc = json.loads((tmp_path / "ab.json").read_text())
    a, b = doc["runs"]
    assert a["total_input_tokens"] == b["total_input_tokens"]  # identical request sequence
    # the default schedule: A's first half, B's first, B's second, A's second; no turn overlaps
    # the next, and every request the client sent lies inside its target's turns
    turns = doc["schedule"]["turns"]
    assert doc["schedule"]["design"] == "abba"
    assert [(t["target"], t["part"], t["requests"]) for t in turns] == [
        ("a", 1, 3),
        ("b", 1, 3),
        ("b", 2, 3),
        ("a", 2, 3),
    ]
    assert all(x["end_s"] <= y["start_s"] for x, y in itertools.pairwise(turns))
    sent = list(csv.DictReader((tmp_path / "ab.csv").open()))
    for t in turns:
        lo, hi = t["start_s"] - 1e-6, t["end_s"]  # the CSV rounds to microseconds
        inside = [r for r in sent if r["target"] == t["target"] and lo <= float(r["start_s"]) <= hi]
        assert len(inside) == 3
    for run in (a, b):  # its time is its own two turns, not the other target's in between
        segs = run["kimictl"]["segments_s"]
        assert len(segs) == 2 and run["duration"] == pytest.approx(sum(e - s for s, e in segs))
        assert run["duration"] < run["kimictl"]["window_s"][1] - run["kimictl"]["window_s"][0]
    head = next(r for r in doc["ab"] if r["metric"].startswith("interactivity p50"))
    if head["verdict"] == NOT_MEASURED:  # a loaded box's server flushed every response at once
        assert head["a"] is None and head["b"] is None and head["ratio"] is None
    else:
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
            "--output",
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
            "--output",
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
            "--output",
            str(tmp_path / "p.json"),
        ],
        capsys,
    )
    assert code == 0
    (run,) = json.loads((tmp_path / "p.json").read_text())["runs"]
    assert run["completed"] == 3 and run["total_output_tokens"] == 12


def test_a_point_where_no_request_finished_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real HTTP server that lists a model but answers every completion with 500."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"data": [{"id": "m", "max_model_len": 4096}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = tmp_path / "r.json"
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        args = ["--target", url, "--num-prompts", "3", "--warmup", "0", "--no-metrics"]
        code, _, err = run_cli([*args, "--output", str(out)], capsys)
    finally:
        server.shutdown()
    assert code == 1 and "no request finished" in err and "3 failed" in err, err
    (run,) = json.loads(out.read_text())["runs"]  # the report is still written
    assert run["completed"] == 0 and run["failed"] == 3
