"""One load run spread over several worker processes: one event loop each, one merged result.

At fast-path rates (64 streams x 1.2 ms is 53k chunks/s) one Python event loop is the limit: a
read waits behind the others, two chunks of a stream land in one read and a gap reads 0. The
parent starts `n` fresh interpreters (not multiprocessing's spawn, which would import the
caller's main module again) that talk over a socket pair with pickled messages; each runs
`run_load` over its shard of the streams (loadgen.Shard: closed loop, streams j with j mod n = its
index; open loop, every n-th arrival of the one arrival schedule), on the parent's time origin
(perf_counter is the machine's monotonic clock, one for all processes). Every turn of the run
(warm-up, each target's part of each point) starts and ends at a barrier the parent holds, so
the workers load the same target at the same time and worker 0's /metrics scrapes bracket all of
them. Finished records stream to the parent (progress, `on_record`); at the end each worker sends
its windows, turns and its own lag trace, and the parent merges them into one RecordList, the
same as one loop returns.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from multiprocessing.connection import Connection
from typing import Any

from kimictl.core.errors import KimictlError
from kimictl.runtime.load.records import (
    LoadPoint,
    LoadSettings,
    LoadTarget,
    RecordList,
    RequestRecord,
)
from kimictl.runtime.load.workloads import Workload

__all__ = [
    "merge_results",
    "run_workers",
    "worker_main",
]


def _watch(loop: asyncio.AbstractEventLoop, conn: Connection, callback: Callable[..., None],
           *args: Any) -> None:  # fmt: skip
    """Call `callback(*args)` when `conn` has a message. uvloop (libuv's poll) makes a watched
    descriptor non-blocking, but Connection's send and recv expect a blocking one: a full
    socket buffer raised EAGAIN in a worker's send (256 streams x 1.2 ms, 2 workers), and a
    message not yet whole would read as a lost peer. So the descriptor is made blocking again:
    the loop only polls it."""
    loop.add_reader(conn.fileno(), callback, *args)
    os.set_blocking(conn.fileno(), True)


# ---------------------------------------------------------------------------------------------
# In each worker process


# A worker's first lines: the parent's import path first, so the pickled arguments can be read.
_BOOT = """
import sys
from multiprocessing.connection import Connection
conn = Connection(int(sys.argv[1]))
sys.path[:] = conn.recv()
from kimictl.runtime.load.workers import worker_main
worker_main(conn)
"""


def worker_main(conn: Connection) -> None:
    """A worker process's body (started by run_workers): its arguments come on `conn`."""
    from kimictl.core.loops import run

    try:
        args = conn.recv()
        run(_worker(conn, *args), args[-1].loop)
    finally:
        conn.close()


async def _worker(
    conn: Connection,
    index: int,
    count: int,
    t_run: float,
    targets: list[LoadTarget],
    workload: Workload,
    settings: LoadSettings,
) -> None:
    from kimictl.runtime.load.loadgen import Shard, run_load

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    released: asyncio.Future[bool] | None = None

    def on_message() -> None:
        nonlocal released
        try:
            word = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            loop.remove_reader(conn.fileno())
            word = "stop"
        if word == "stop":
            stop.set()
        if released is not None and not released.done():
            released.set_result(word == "go")

    _watch(loop, conn, on_message)

    async def sync() -> bool:
        nonlocal released
        if stop.is_set():
            return False
        released = loop.create_future()
        conn.send(("sync",))
        return await released

    def on_point(t: LoadTarget, p: LoadPoint, repeat: int) -> None:
        conn.send(("point", t.name, p.label, repeat))

    out = await run_load(
        targets,
        workload,
        settings,
        stop=stop,
        on_record=lambda rec: conn.send(("record", rec)),
        on_point=on_point if index == 0 else None,
        shard=Shard(index, count, t_run, sync),
    )
    loop.remove_reader(conn.fileno())
    conn.send(("done", _meta(out)))


def _meta(out: RecordList) -> dict[str, Any]:
    """What a worker's RecordList holds beside its records (those went one by one)."""
    return {
        "stop_reason": out.stop_reason,
        "windows": out.windows,
        "schedule": out.schedule,
        "metrics": out.metrics,
        "max_concurrent": out.max_concurrent,
        "client": out.client,
    }


# ---------------------------------------------------------------------------------------------
# In the parent


def merge_results(records: Sequence[RequestRecord], metas: Sequence[dict[str, Any]]) -> RecordList:
    """One RecordList from the workers' records and metas (index order: worker 0 first).

    Records are numbered again in send order per (target, point, repeat, warm-up); a window spans
    every worker's; a turn's requests add up and its start and end are the earliest and latest;
    a point's segments are its merged turns; in-flight maxima add up; the /metrics deltas are
    worker 0's (the only one that scrapes); the stop reason is the first that is not a plain
    "interrupted" (a worker stopped by another's end), else "interrupted" if any said so."""
    out = RecordList()
    groups: dict[tuple[str, str, int, bool], list[RequestRecord]] = {}
    for r in records:
        groups.setdefault((r.target, r.point, r.repeat, r.warmup), []).append(r)
    for group in groups.values():
        group.sort(key=lambda r: r.start)
        for i, r in enumerate(group):
            r.index = i
    out.extend(sorted(records, key=lambda r: r.end))
    reasons = [m["stop_reason"] for m in metas if m["stop_reason"]]
    real = [r for r in reasons if r != "interrupted"]
    out.stop_reason = real[0] if real else (reasons[0] if reasons else None)
    for m in metas:
        for key, (a, b) in m["windows"].items():
            old = out.windows.get(key)
            out.windows[key] = (a, b) if old is None else (min(old[0], a), max(old[1], b))
        for key, n in m["max_concurrent"].items():
            out.max_concurrent[key] = out.max_concurrent.get(key, 0) + n
        for key, pair in m["metrics"].items():
            out.metrics.setdefault(key, pair)
        out.client.extend(m["client"])
    turns: dict[tuple[Any, ...], dict[str, Any]] = {}
    for m in metas:
        for seq, turn in enumerate(m["schedule"]):
            key = (seq, turn["target"], turn["point"], turn["repeat"], turn["part"])
            have = turns.get(key)
            if have is None:
                turns[key] = dict(turn)
                continue
            have["requests"] += turn["requests"]
            for edge, pick in (("start_s", min), ("end_s", max)):
                vals = [v for v in (have[edge], turn[edge]) if v is not None]
                have[edge] = pick(vals) if vals else None
    out.schedule = list(turns.values())
    for turn in turns.values():
        if turn["start_s"] is not None:
            key = (turn["target"], turn["point"], turn["repeat"])
            out.segments.setdefault(key, []).append((turn["start_s"], turn["end_s"]))
    return out


class _Barrier:
    """The parent's side of the workers' turn barrier: each worker's k-th sync is released when
    every worker has sent its k-th; once a worker has ended (or died), waiting ones are told to
    stop instead, since the one that ended will never arrive."""

    def __init__(self, conns: list[Connection]) -> None:
        self.conns = conns
        self.waiting: set[int] = set()
        self.ended: set[int] = set()

    def arrive(self, w: int) -> None:
        self.waiting.add(w)
        self._settle()

    def end(self, w: int) -> None:
        self.ended.add(w)
        self.waiting.discard(w)
        self._settle()

    def stop_all(self) -> None:
        for w, c in enumerate(self.conns):
            if w not in self.ended:
                _send(c, "stop")

    def _settle(self) -> None:
        if not self.waiting or len(self.waiting | self.ended) < len(self.conns):
            return
        word = "stop" if self.ended else "go"
        for w in self.waiting:
            _send(self.conns[w], word)
        self.waiting.clear()


def _send(conn: Connection, word: str) -> None:
    try:
        conn.send(word)
    except (OSError, ValueError):  # that worker is gone already
        pass


async def run_workers(
    targets: Sequence[LoadTarget],
    workload: Workload,
    settings: LoadSettings,
    n: int,
    *,
    stop: asyncio.Event,
    on_record: Callable[[RequestRecord], None] | None = None,
    on_point: Callable[[LoadTarget, LoadPoint, int], None] | None = None,
) -> RecordList:
    """Run the load in `n` worker processes and merge their results (module docstring)."""
    loop = asyncio.get_running_loop()
    plain = LoadSettings(**{f.name: getattr(settings, f.name) for f in fields(LoadSettings)})
    t_run = time.perf_counter()
    by_name = {t.name: t for t in targets}
    by_label = {p.label: p for p in plain.points}
    conns: list[Connection] = []
    procs: list[subprocess.Popen[bytes]] = []
    for w in range(n):
        mine, theirs = socket.socketpair()
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        )
        theirs.close()
        conn = Connection(mine.detach())
        own = replace(plain, workers=1, scrape_metrics=plain.scrape_metrics and w == 0)
        conn.send(list(sys.path))
        conn.send((w, n, t_run, list(targets), workload, own))
        conns.append(conn)
    barrier = _Barrier(conns)
    records: list[RequestRecord] = []
    metas: list[dict[str, Any] | None] = [None] * n
    finished = loop.create_future()

    def on_message(w: int) -> None:
        conn = conns[w]
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # died without its result
            loop.remove_reader(conn.fileno())
            barrier.end(w)
            if metas[w] is None:
                metas[w] = {"died": True}
            _check_done()
            return
        kind = msg[0]
        if kind == "record":
            records.append(msg[1])
            if on_record is not None:
                on_record(msg[1])
        elif kind == "sync":
            barrier.arrive(w)
        elif kind == "point" and on_point is not None:
            on_point(by_name[msg[1]], by_label[msg[2]], msg[3])
        elif kind == "done":
            metas[w] = msg[1]
            loop.remove_reader(conn.fileno())
            barrier.end(w)
            _check_done()

    def _check_done() -> None:
        if all(m is not None for m in metas) and not finished.done():
            finished.set_result(None)

    for w, conn in enumerate(conns):
        _watch(loop, conn, on_message, w)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({finished, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not finished.done():
            barrier.stop_all()
            await finished
    finally:
        stopper.cancel()
        for w, conn in enumerate(conns):
            if metas[w] is None:
                loop.remove_reader(conn.fileno())
                _send(conn, "stop")
        for p in procs:
            try:
                await loop.run_in_executor(None, p.wait, 10.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for conn in conns:
            conn.close()
    dead = [w for w, m in enumerate(metas) if m is not None and m.get("died")]
    if dead:
        raise KimictlError(
            f"bench worker {dead[0]} of {n} ended without its result (exit code "
            f"{procs[dead[0]].returncode})",
            hint="run again with --workers 1 to see the error in this process",
        )
    out = merge_results(records, [m for m in metas if m is not None])
    if stop.is_set() and out.stop_reason is None:
        out.stop_reason = "interrupted"
    return out
