"""The load engine's event loop (core/loops.py): uvloop when it is importable, else asyncio's own;
the loop that ran is in the client's self-measurement. Against test_loadgen's streaming server,
in its own process (test_clientlag's fixture): each run here starts its own loop."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pytest
from test_clientlag import blocked_probe
from test_clientlag import emitter_process as emitter_process

from kimictl.core.errors import InputError
from kimictl.core.loops import loop_factory, run, running_loop, sleep_until
from kimictl.runtime.load.loadgen import LoadPoint, LoadSettings, LoadTarget, run_load
from kimictl.runtime.load.summary import summarize_run
from kimictl.runtime.load.workloads import RandomWorkload, parse_length

# A Python in which `import uvloop` fails, as where it is not installed.
NO_UVLOOP = "import sys; sys.modules['uvloop'] = None\n"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_run_reads_every_chunk_on_either_loop_and_records_which_ran(
    emitter_process: str, loop: str
) -> None:
    point = LoadPoint(concurrency=4)
    target = LoadTarget("t", emitter_process, "ok")
    workload = RandomWorkload(parse_length(8), parse_length("20:40"))
    settings = LoadSettings(points=(point,), num_prompts=8, workers=2, loop=loop)
    out = run(run_load([target], workload, settings), loop)
    assert len(out) == 8 and all(r.ok and len(r.chunk_times) == r.output_tokens for r in out)
    assert [(tr.worker, tr.loop) for tr in out.client] == [(0, loop), (1, loop)]
    (summary,) = summarize_run(out, targets={"t": target}, points={point.label: point}, gpus={})
    k = summary["kimictl"]
    assert k["client_loop"] == loop
    assert [w["loop"] for w in k["client_workers"]] == [loop, loop]
    assert k["client_lag_samples"] > 0 and k["client_cpu_us_per_token"] > 0


def test_the_lag_probe_still_measures_a_blocked_uvloop() -> None:
    probe = run(blocked_probe(), "uvloop")
    lags = [ms for _, ms in probe.samples]
    assert probe.trace.loop == "uvloop" and len(lags) >= 3
    assert max(lags) >= 200 and sorted(lags)[len(lags) // 2] < max(lags) / 2


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_arrivals_never_leave_before_they_are_due(loop: str) -> None:
    async def body() -> tuple[list[float], list[float], float]:
        plain, waited = [], []
        for i in range(40):
            delay = 0.0002 + 0.0003 * (i % 5)
            when = time.perf_counter() + delay
            await asyncio.sleep(delay)
            plain.append(time.perf_counter() - when)
            when = time.perf_counter() + delay
            await sleep_until(when)
            waited.append(time.perf_counter() - when)
        stop = asyncio.Event()
        stop.set()
        t = time.perf_counter()
        await sleep_until(t + 5.0, stop)  # a stop ends the wait at once
        return plain, waited, time.perf_counter() - t

    plain, waited, stopped = run(body(), loop)
    assert min(waited) >= 0 and stopped < 1.0
    if loop == "uvloop":  # its own timers end early (whole ms): why arrivals use sleep_until
        assert min(plain) < 0


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_run_leaves_the_process_signal_handlers_as_it_found_them(loop: str) -> None:
    # bench sets SIGINT/SIGTERM handlers on its loop; the demo and tune go on after it, and a
    # handler bound to a closed loop would swallow the user's SIGTERM
    async def body() -> None:
        running = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            running.add_signal_handler(sig, lambda: None)  # and never removed

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    run(body(), loop)
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_auto_takes_uvloop_when_importable_and_asyncio_when_not() -> None:
    async def which() -> str:
        return running_loop()

    assert run(which()) == "uvloop"
    assert run(which(), "asyncio") == "asyncio"
    with pytest.raises(InputError, match="'trio' is not one of"):
        loop_factory("trio")
    code = NO_UVLOOP + (
        "import asyncio\n"
        "from kimictl.core.errors import InputError\n"
        "from kimictl.core.loops import run, running_loop\n"
        "async def which():\n"
        "    return running_loop()\n"
        "print(run(which()))\n"
        "try:\n"
        "    run(which(), 'uvloop')\n"
        "except InputError as e:\n"
        "    print(e.message)\n"
    )
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                         text=True, check=True, timeout=60)  # fmt: skip
    assert out.stdout.splitlines() == [
        "asyncio",
        "--loop uvloop: uvloop is not installed in this Python",
    ]


def test_bench_loop_uvloop_without_uvloop_is_a_clear_input_error() -> None:
    code = NO_UVLOOP + "from kimictl.cli import main\nsys.exit(main())\n"
    args = ["bench", "--loop", "uvloop", "--target", "http://127.0.0.1:9", "--num-prompts", "1"]
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "error: --loop uvloop: uvloop is not installed" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_watched_worker_connection_sends_more_than_its_socket_buffer(loop: str) -> None:
    """uvloop makes a polled descriptor non-blocking; a worker's records then met a full socket
    buffer with EAGAIN (256 streams x 1.2 ms, 2 workers, on 16 cores). A watched connection
    must still send a message larger than the buffer while the other end reads it slowly."""
    import socket
    import threading
    from multiprocessing.connection import Connection

    from kimictl.runtime.load.workers import _watch

    mine, theirs = socket.socketpair()
    here, there = Connection(mine.detach()), Connection(theirs.detach())
    got: list[bytes] = []

    def slow_reader() -> None:
        time.sleep(0.3)  # the message has filled the buffer by now
        got.append(there.recv())

    payload = b"x" * (8 << 20)

    async def main() -> None:
        _watch(asyncio.get_running_loop(), here, lambda: None)
        reader = threading.Thread(target=slow_reader)
        reader.start()
        here.send(payload)
        reader.join()
        asyncio.get_running_loop().remove_reader(here.fileno())

    try:
        run(main(), loop)
    finally:
        here.close()
        there.close()
    assert got == [payload]
