"""A run spread over worker processes (runtime/load/workers.py): the same requests as one loop,
one merged result, and the default worker count. Against test_loadgen's streaming server."""

from __future__ import annotations

import os

import pytest
from test_loadgen import emitter as emitter

from kimictl.runtime.load import loadgen
from kimictl.runtime.load.clientlag import ClientTrace
from kimictl.runtime.load.loadgen import LoadPoint, LoadSettings, LoadTarget, run_load
from kimictl.runtime.load.records import RequestRecord
from kimictl.runtime.load.summary import summarize_run
from kimictl.runtime.load.workers import merge_results
from kimictl.runtime.load.workloads import RandomWorkload, parse_length


def _rec(target: str, start: float, end: float, *, warmup: bool = False) -> RequestRecord:
    return RequestRecord(
        target=target,
        point="c=2",
        repeat=0,
        index=99,
        warmup=warmup,
        session=0,
        turn=0,
        input_len=1,
        output_len=1,
        start=start,
        end=end,
    )


def _meta(windows, schedule, *, stop=None, worker=0):  # type: ignore[no-untyped-def]
    return {
        "stop_reason": stop,
        "windows": windows,
        "schedule": schedule,
        "metrics": {},
        "max_concurrent": {k: 1 for k in windows},
        "client": [ClientTrace(worker=worker)],
    }


def _turn(part: int, n: int, start: float | None, end: float | None) -> dict[str, object]:
    return {"target": "a", "point": "c=2", "repeat": 0, "part": part, "requests": n,
            "start_s": start, "end_s": end}  # fmt: skip


def test_merge_joins_windows_turns_and_numbers_records_in_send_order() -> None:
    key = ("a", "c=2", 0)
    w0 = _meta({key: (1.0, 5.0)}, [_turn(1, 2, 1.0, 2.0), _turn(2, 1, 3.0, 5.0)])
    w1 = _meta(
        {key: (1.1, 5.5)},
        [_turn(1, 1, 1.1, 2.5), _turn(2, 0, None, None)],
        stop="interrupted",
        worker=1,
    )
    recs = [
        _rec("a", 1.1, 2.5),
        _rec("a", 1.0, 2.0),
        _rec("a", 3.0, 5.0),
        _rec("a", 0.1, 0.5, warmup=True),
    ]
    out = merge_results(recs, [w0, w1])
    assert out.windows[key] == (1.0, 5.5)
    assert [(t["part"], t["requests"], t["start_s"], t["end_s"]) for t in out.schedule] == [
        (1, 3, 1.0, 2.5),
        (2, 1, 3.0, 5.0),
    ]
    assert out.segments[key] == [(1.0, 2.5), (3.0, 5.0)]
    assert out.max_concurrent[key] == 2
    assert [tr.worker for tr in out.client] == [0, 1]
    measured = sorted((r.start, r.index) for r in out if not r.warmup)
    assert measured == [(1.0, 0), (1.1, 1), (3.0, 2)]
    assert [r.index for r in out if r.warmup] == [0]
    assert out.stop_reason == "interrupted"
    # a worker's own reason (the server died) wins over the others' "interrupted"
    dead = _meta({}, [], stop="a stopped answering", worker=2)
    assert merge_results([], [w1, dead]).stop_reason == "a stopped answering"


def test_default_workers_follow_streams_cores_and_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    pts = (LoadPoint(concurrency=64), LoadPoint(concurrency=128))
    assert loadgen.default_workers(pts) == 4  # one per 32 streams
    assert loadgen.default_workers((LoadPoint(concurrency=1024),)) == 8  # half of 16 cores
    assert loadgen.default_workers((LoadPoint(rate=5.0),)) == 1  # uncapped open loop
    monkeypatch.setattr(os, "getloadavg", lambda: (14.0, 1.0, 1.0))
    assert loadgen.default_workers(pts) == 2  # two cores idle
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert loadgen.default_workers(pts) == 1  # a 2-core box keeps a core for the server


def _sent(records, target: str) -> list[tuple[int, int, int]]:  # type: ignore[no-untyped-def]
    return sorted(
        (r.session, r.input_len, r.output_len)
        for r in records
        if r.target == target and not r.warmup
    )


@pytest.mark.parametrize(
    "point", [LoadPoint(concurrency=3), LoadPoint(rate=200.0, arrivals="constant")]
)
async def test_two_workers_send_the_same_requests_as_one_loop(
    emitter: str, point: LoadPoint
) -> None:
    targets = [LoadTarget("a", emitter, "ok"), LoadTarget("b", emitter, "ok")]
    workload = RandomWorkload(parse_length("4:40"), parse_length("2:9"))
    runs = {}
    for workers in (1, 2):
        seen: list[RequestRecord] = []
        settings = LoadSettings(points=(point,), num_prompts=13, warmup=2, workers=workers)
        runs[workers] = await run_load(targets, workload, settings, on_record=seen.append)
        assert len(seen) == len(runs[workers]) and runs[workers].stop_reason is None
    one, two = runs[1], runs[2]
    for t in ("a", "b"):
        assert _sent(two, t) == _sent(one, t) and len(_sent(one, t)) == 13
    assert all(r.ok and len(r.chunk_times) == r.output_tokens for r in two)
    assert [tr.worker for tr in two.client] == [0, 1] and all(tr.lag for tr in two.client)
    # the A B B A turns are the same in number and size: the workers take each turn together
    assert [(t["target"], t["requests"]) for t in two.schedule] == [
        (t["target"], t["requests"]) for t in one.schedule
    ]
    for a, b in zip(two.schedule, two.schedule[1:], strict=False):
        assert a["end_s"] <= b["start_s"]  # no worker still in the last turn when the next starts
    (first, *_) = summarize_run(
        two, targets={t.name: t for t in targets}, points={point.label: point}, gpus={}
    )
    k = first["kimictl"]
    assert first["completed"] == 13 and len(k["client_workers"]) == 2
    assert k["client_cpu_us_per_token"] > 0 and k["client_lag_samples"] > 0
