"""The bench client's own health: loop lag, start lag, CPU per token, chunk batching, and the
verdict they give (client lagged / server bunched / ok).

A lagging client is made deterministically: a task blocks the event loop (time.sleep, or a busy
spin that burns the process's CPU, as a busy neighbour on the same core would), while a streaming
server in ANOTHER process keeps writing chunks, so they pile up in the socket and arrive in one
read. A bunching server is the test emitter's "bunch" mode: two events in one write.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_loadgen import EMITTER_SRC, free_port
from test_loadgen import emitter as emitter

from kimictl.runtime.load.bench import BenchOutcome
from kimictl.runtime.load.clientlag import (
    BATCHED_WARN_PCT,
    LAG_WARN_MS,
    ClientTrace,
    LagProbe,
    client_health,
)
from kimictl.runtime.load.loadgen import (
    LoadPoint,
    LoadSettings,
    LoadTarget,
    RequestRecord,
    run_load,
)
from kimictl.runtime.load.summary import summarize_run
from kimictl.runtime.load.workloads import RandomWorkload, parse_length


async def blocked_probe() -> LagProbe:
    """A probe over a loop that can run nothing for 250 ms in the middle of 450."""
    probe = LagProbe(time.perf_counter())
    probe.start()
    await asyncio.sleep(0.1)
    time.sleep(0.25)
    await asyncio.sleep(0.1)
    await probe.stop()
    return probe


async def test_probe_measures_how_long_the_loop_was_blocked() -> None:
    probe = await blocked_probe()
    assert probe.trace.loop == "asyncio"  # pytest-asyncio's loop
    lags = [ms for _, ms in probe.samples]
    assert len(lags) >= 3
    assert max(lags) >= 200  # the ticker woke at least ~250 ms - TICK_S late
    assert sorted(lags)[len(lags) // 2] < max(lags) / 2  # one stall, not a slow loop
    health = client_health([], [probe.trace])
    assert health["client_lag_ms_max"] == max(lags)
    assert health["client_lag_ms_p99"] > LAG_WARN_MS
    assert "event loop ran" in health["client_warning"]
    # samples outside the point's window do not count for it
    first_t = probe.samples[0][0]
    assert client_health([], [probe.trace], window=(0.0, first_t))["client_lag_samples"] == 1
    # the process CPU is sampled beside the lag: time.sleep burns none of it
    assert probe.trace.cpu_in(None) is not None and probe.trace.cpu_in(None) < 0.2


def _record(chunk_times: list[float]) -> RequestRecord:
    return RequestRecord(
        target="t",
        point="c=1",
        repeat=0,
        index=0,
        warmup=False,
        session=0,
        turn=0,
        input_len=8,
        output_len=len(chunk_times),
        ttft=chunk_times[0],
        latency=chunk_times[-1],
        chunk_times=chunk_times,
        chunk_tokens=[1] * len(chunk_times),
        output_tokens=len(chunk_times),
        ok=True,
    )


def test_gaps_of_zero_are_counted_as_batched_chunks() -> None:
    steady = _record([0.1 + 0.02 * i for i in range(10)])
    collapsed = _record([0.5] * 10)  # the whole response in one read: TTFT = latency
    half = _record([0.1, 0.1, 0.1, 0.2, 0.3, 0.3])
    gaps = 9 + 9 + 5
    health = client_health([steady, collapsed, half], [])
    assert health["client_batched_gaps_pct"] == pytest.approx(100 * (9 + 3) / gaps)
    assert health["client_collapsed_requests"] == 1
    assert health["client_lag_ms_p99"] is None
    assert "came in one socket read (1 of 3 responses entirely)" in health["client_warning"]
    fine = client_health([steady], [ClientTrace(lag=[(0.1, 1.0), (0.2, 2.0)])])
    assert fine["client_batched_gaps_pct"] == 0 and fine["client_warning"] is None
    assert fine["client_verdict"] == "ok"


def test_zero_gaps_are_the_clients_when_its_loop_ran_a_gap_late_else_the_servers() -> None:
    # 20 ms tokens, every other gap 0: the same records, two clients
    bunched = [_record([0.1 + 0.04 * (i // 2) for i in range(20)]) for _ in range(4)]
    on_time = ClientTrace(lag=[(0.1 * i, 0.5) for i in range(100)])
    late = ClientTrace(lag=[(0.1 * i, 0.5 if i % 10 else 45.0) for i in range(100)])
    server = client_health(bunched, [on_time])
    assert server["client_verdict"] == "server bunched" and server["client_warning"] is None
    assert server["client_note"].startswith("server bunched: 53% of token gaps")
    client = client_health(bunched, [late])
    assert client["client_verdict"] == "client lagged" and client["client_note"] is None
    assert client["client_warning"].startswith("client lagged: its event loop ran")
    # no zero gap, but a loop late by half a gap at p90: the gaps are not the server's either
    steady = [_record([0.1 + 0.002 * i for i in range(50)])]
    slow = ClientTrace(lag=[(0.1 * i, 1.0) for i in range(100)])
    assert client_health(steady, [slow])["client_verdict"] == "client lagged"
    a_third = ClientTrace(lag=[(0.1 * i, 0.7) for i in range(100)])  # 0.7 ms of a 2 ms gap
    assert client_health(steady, [a_third])["client_verdict"] == "client lagged"
    assert client_health(steady, [ClientTrace(lag=[(0.1, 0.1)])])["client_verdict"] == "ok"


def test_cpu_and_lags_of_several_workers_are_pooled_and_kept_per_worker() -> None:
    recs = [_record([0.1 + 0.02 * i for i in range(11)]) for _ in range(2)]  # 22 tokens
    a = ClientTrace(0, [(1.0, 1.0), (2.0, 1.0)], [(0.5, 1.0), (1.5, 1.2), (3.0, 1.3)], [(1, 2.0)])
    b = ClientTrace(1, [(1.0, 3.0), (2.0, 3.0)], [(0.5, 0.0), (1.5, 0.1), (3.0, 0.2)], [(1, 4.0)])
    h = client_health(recs, [a, b], window=(1.0, 3.0))
    assert h["client_lag_ms_p50"] == pytest.approx(2.0) and h["client_lag_samples"] == 4
    assert [w["lag_ms_p99"] for w in h["client_workers"]] == [1.0, 3.0]
    assert h["client_cpu_us_per_token"] == pytest.approx(1e6 * (0.1 + 0.1) / 22)
    assert h["client_cpu_cores"] == pytest.approx(0.2 / 2.0)
    assert h["client_start_lag_ms_p99"] == pytest.approx(3.98)


@pytest.fixture
def emitter_process(tmp_path: Path) -> Iterator[str]:
    """The loadgen tests' streaming server, in its own process: a blocked client cannot stall it."""
    (tmp_path / "emitter.py").write_text(EMITTER_SRC)
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(tmp_path / "emitter.py"), str(port)])
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the emitter did not start"
            time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


async def _bench(url: str, *, hog: bool, spin: bool = False, model: str = "ok") -> BenchOutcome:
    async def block_the_loop() -> None:
        while True:
            if spin:  # burn the process's own CPU, 30 ms at a time (over LAG_WARN_MS)
                end = time.perf_counter() + 0.03
                while time.perf_counter() < end:
                    pass
                await asyncio.sleep(0.002)
            else:
                time.sleep(0.08)  # a CPU-bound neighbour on the client's only core
                await asyncio.sleep(0.02)

    hog_task = asyncio.create_task(block_the_loop()) if hog else None
    try:
        point = LoadPoint(concurrency=2)
        records = await run_load(
            [LoadTarget("t", url, model)],
            RandomWorkload(parse_length(16), parse_length(64)),
            LoadSettings(points=(point,), num_prompts=6),
        )
    finally:
        if hog_task is not None:
            hog_task.cancel()
    summaries = summarize_run(
        records, targets={"t": LoadTarget("t", url, "ok")}, points={point.label: point}, gpus={}
    )
    return BenchOutcome(records, summaries, None, records.stop_reason)


async def test_a_starved_client_says_so_instead_of_timing_figures(
    emitter_process: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = await _bench(emitter_process, hog=True)
    (run,) = outcome.summaries
    k = run["kimictl"]
    assert k["client_lag_ms_p99"] >= 50  # blocked 80 ms at a time
    assert k["client_lag_samples"] > 0 and k["client_lag_ms_max"] >= k["client_lag_ms_p99"]
    assert k["client_batched_gaps_pct"] > BATCHED_WARN_PCT  # 2 ms chunks, 80 ms stalls
    assert k["client_verdict"] == "client lagged"
    assert k["client_warning"].startswith("client lagged: its event loop ran")
    assert outcome.to_json()["warnings"] == [k["client_warning"]]
    from kimictl.commands._render import render_bench

    render_bench(outcome)
    out = capsys.readouterr().out
    assert "unreliable" in out and "client lagged" in out
    tpot_line = next(line for line in out.splitlines() if "TPOT median ms" in line)
    assert "unreliable" in tpot_line  # not a made-up 0.00
    # the same run with the loop free batches fewer chunks
    calm = (await _bench(emitter_process, hog=False)).summaries[0]["kimictl"]
    assert calm["client_batched_gaps_pct"] < k["client_batched_gaps_pct"]
    assert calm["client_lag_ms_p99"] < k["client_lag_ms_p99"]


async def test_a_busy_loop_in_the_client_reads_client_lagged_with_its_cost(
    emitter_process: str,
) -> None:
    busy = (await _bench(emitter_process, hog=True, spin=True)).summaries[0]["kimictl"]
    calm = (await _bench(emitter_process, hog=False)).summaries[0]["kimictl"]
    assert busy["client_verdict"] == "client lagged" and busy["client_lag_ms_p99"] > 5
    # (no lag comparison with the calm run: a loaded CI box lags that one too)
    # the spin is the client's own CPU: it shows in CPU per token and cores, and late starts
    assert busy["client_cpu_us_per_token"] > 3 * calm["client_cpu_us_per_token"]
    assert busy["client_cpu_cores"] > 2 * calm["client_cpu_cores"]


async def test_arrivals_sent_late_by_a_blocked_loop_show_as_start_lag(emitter: str) -> None:
    point = LoadPoint(rate=100.0, arrivals="constant")
    outs = []

    async def run(block: bool) -> list[float]:
        async def blocker() -> None:
            while True:
                await asyncio.sleep(0.03)
                time.sleep(0.06)  # six arrivals' worth

        task = asyncio.create_task(blocker()) if block else None
        try:
            out = await run_load(
                [LoadTarget("t", emitter, "ok")],
                RandomWorkload(parse_length(4), parse_length(2)),
                LoadSettings(points=(point,), num_prompts=30),
            )
        finally:
            if task is not None:
                task.cancel()
        outs.append(out)
        (trace,) = out.client
        return sorted(ms for _, ms in trace.start_lag)

    late, calm = await run(True), await run(False)
    assert len(late) == len(calm) == 30  # every arrival has a due time
    assert late[-1] > 30 and calm[len(calm) // 2] < 5
    target = {"t": LoadTarget("t", emitter, "ok")}
    (late_run,) = summarize_run(outs[0], targets=target, points={point.label: point}, gpus={})
    k = late_run["kimictl"]
    assert k["client_verdict"] == "client lagged" and k["client_start_lag_ms_p99"] > 30
    assert "ms after they were due (p99)" in k["client_warning"]


async def test_a_bunching_server_beside_a_calm_client_reads_server_bunched(
    emitter_process: str,
) -> None:
    # the premise is a calm client: on a loaded box (CI's other worker) the client may lag for
    # real, and then says so with its measured lag; up to three runs find a calm one
    for _ in range(3):
        outcome = await _bench(emitter_process, hog=False, model="bunch")
        k = outcome.summaries[0]["kimictl"]
        if k["client_verdict"] != "client lagged":
            break
        assert k["client_warning"].startswith("client lagged: ")  # said, with its lag
    else:
        pytest.skip("the client lagged in 3 runs (a loaded machine): no calm client here")
    assert k["client_batched_gaps_pct"] > 40  # every other gap came in the same read
    assert k["client_verdict"] == "server bunched" and k["client_warning"] is None
    assert "the gaps are the server's" in k["client_note"] and outcome.warnings == []
