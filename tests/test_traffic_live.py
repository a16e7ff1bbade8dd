"""Capture what a real traced vLLM CPU server served, then replay it paired (slow; run under the
vLLM lock). One traced server for the module: `kimictl monitor --capture` records a real agentic
bench run; the capture must hold exactly the client's requests (its own CSV is the truth: row
count and the multiset of (input, output) lengths exactly, arrival offsets within ARRIVAL_MS),
none of kimictl's own requests (a real readiness probe sent during the capture), and the
session id of a request that carried a `traceparent`. Then `kimictl bench --paired` replays the
capture to two arms (both on this server: an A/A through one server, which is what this test can
afford) and every request must join its span on both arms.

Tolerance of arrival offsets: the client stamps its send before the request crosses the socket,
vLLM stamps arrival after parsing it; on this shared 2-core box that gap moves by a few ms to a
few tens of ms between requests, so offsets (each from its side's first request) must agree within
ARRIVAL_MS = 60 ms.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Server, free_port, start_cpu_server_retrying, stop_cpu_server

from kimictl.deployment.traces import kimictl_endpoint, tracing_env

pytestmark = pytest.mark.slow

ARRIVAL_MS = 60.0
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int]]:
    port, traces_port = free_port(), free_port()
    endpoint = kimictl_endpoint(traces_port)
    server = start_cpu_server_retrying(
        tmp_path_factory.mktemp("traced"),
        port=port,
        extra=["--otlp-traces-endpoint", endpoint],
        env=tracing_env(endpoint, host="127.0.0.1", port=port),
    )
    try:
        yield server, traces_port
    finally:
        stop_cpu_server(server)


def kimictl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kimictl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_capture_holds_the_clients_requests_and_replays_paired(
    traced: tuple[Server, int], tmp_path: Path
) -> None:
    from kimictl.core.http1 import BlockingClient
    from kimictl.runtime.serving.launcher import _complete_one

    server, traces_port = traced
    capture = tmp_path / "capture.jsonl"
    monitor = subprocess.Popen(
        [sys.executable, "-m", "kimictl", "monitor", f"srv={server.url}", "--no-tui",
         "--interval", "1", "--traces-port", str(traces_port), "--capture", str(capture)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(4)  # the receiver is up
        with BlockingClient() as client:  # a real readiness probe: kimictl's own, left out
            ok, why = _complete_one(server.url, server.model, None, 60, client)
        assert ok, why
        reply = httpx.post(  # a client's session: its traceparent's trace id is the session id
            f"{server.url}/v1/completions",
            json={"model": server.model, "prompt": [300] * 9, "max_tokens": 3, "ignore_eos": True},
            headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
            timeout=60,
        )
        assert reply.status_code == 200
        client_csv = tmp_path / "client.csv"
        bench = kimictl("bench", "--target", server.url, "--workload", "agentic",
                        "--agentic-config", "small", "--concurrency", "2", "--num-prompts", "16",
                        "--no-metrics", "--csv", str(client_csv), "--json")  # fmt: skip
        assert bench.returncode == 0, bench.stderr[-3000:]
        time.sleep(2.5)  # the exporter's 0.5 s batches
    finally:
        monitor.send_signal(signal.SIGTERM)  # as systemd or kill would stop a capture
        _, err = monitor.communicate(timeout=60)
    assert "capture:" in err, err[-2000:]
    rows = [json.loads(line) for line in capture.read_text().splitlines()]
    with client_csv.open() as fh:
        sent = [r for r in csv.DictReader(fh) if r["ok"] == "1"]
    assert not any(r["request_id"].startswith(("cmpl-kimictl-own-",)) for r in rows)
    session = [r for r in rows if r.get("session_id")]
    assert [r["session_id"] for r in session] == [TRACE_ID]
    assert (session[0]["input_length"], session[0]["output_length"]) == (9, 3)
    mine = [r for r in rows if not r.get("session_id")]
    assert len(mine) == len(sent)
    assert sorted((r["input_length"], r["output_length"]) for r in mine) == sorted(
        (int(r["input_len"]), int(r["output_tokens"])) for r in sent
    )
    assert all(r["arm"] == "srv" for r in rows)
    ts = [r["timestamp"] for r in rows]
    assert ts == sorted(ts)
    starts = sorted(float(r["start_s"]) for r in sent)
    offsets = [r["timestamp"] - mine[0]["timestamp"] for r in mine]
    gaps = [abs(o - (s - starts[0]) * 1000.0) for o, s in zip(offsets, starts, strict=True)]
    assert max(gaps) <= ARRIVAL_MS, gaps

    # the capture, replayed paired to two arms; every request joins its span on both
    report = tmp_path / "paired.json"
    replay = kimictl("bench", "--paired", "--trace", str(capture), "--target", f"a={server.url}",
                     "--target", f"b={server.url}", "--traces-port", str(traces_port),
                     "--max-lag-ms", "1000", "-o", str(report), "--csv",
                     str(tmp_path / "rows.csv"))  # fmt: skip
    assert replay.returncode == 0, replay.stderr[-3000:] + replay.stdout[-3000:]
    doc = json.loads(report.read_text())
    joins = doc["span_joins"]
    assert joins["rows"] == len(rows)
    assert joins["a_ok"] == joins["b_ok"] == joins["a_joined"] == joins["b_joined"] == len(rows)
    assert doc["verdict"]["rows"] == sum(1 for r in rows if r["output_length"] >= 2)
    assert doc["fidelity"]["late_p99_ms"] is not None
    with (tmp_path / "rows.csv").open() as fh:
        firsts = [r["first"] for r in csv.DictReader(fh)]
    assert firsts[:4] == ["a", "b", "a", "b"]
    # the real report holds what its verdict reads: judged again, nothing sent, the same verdict
    again = kimictl("bench", "--paired", "--judge", str(report), "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["verdict"] == doc["verdict"]
    if os.environ.get("KIMICTL_TRAFFIC_REPORT"):  # docs/bench.md quotes a run
        Path(os.environ["KIMICTL_TRAFFIC_REPORT"]).write_text(replay.stdout)
