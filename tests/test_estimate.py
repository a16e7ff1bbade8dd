"""Estimates of a start and of a whole demo come from what this machine measured (the run
records' start-to-ready times, the demos' wall times), and say when the machine is loaded."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kimictl.runtime.serving import estimate, runs
from kimictl.runtime.serving.runs import RunRecord, RunState


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KIMICTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    return tmp_path / "state"


def _finished(profile: str, took: float | None) -> None:
    run_id = runs.new_run_id(profile)
    started = time.time() - 1000
    runs.write_record(
        RunRecord(
            id=run_id,
            name=profile,
            role=None,
            ab_group=None,
            url="http://127.0.0.1:1",
            model="tiny",
            profile=profile,
            pids=[2**22 + 7],  # no such process: a finished run
            pgid=2**22 + 7,
            port=1,
            host="127.0.0.1",
            log_path="",
            run_dir=str(runs.run_dir_for(run_id)),
            argv_redacted=[],
            started_at=started,
            gpus=0,
            state=RunState.STOPPED if took is not None else RunState.FAILED,
            ready_at=None if took is None else started + took,
        )
    )


def test_start_estimate_is_the_median_of_this_machines_starts() -> None:
    assert estimate.start_estimate("cpu-demo").line("ready in") == (
        "ready in: no estimate (no start of cpu-demo measured on this machine yet)."
    )
    for took in (30.0, 41.0, 28.0, None):  # a failed start has no time to ready
        _finished("cpu-demo", took)
    _finished("other", 500.0)
    got = estimate.start_estimate("cpu-demo")
    assert got.seconds == 30.0 and not got.loaded
    assert got.line("ready in") == (
        "ready in: about 30 s (median of 3 start(s) of cpu-demo on this machine, 28-41 s)."
    )


def test_a_loaded_machine_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    _finished("cpu-demo", 30.0)
    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0 * cores, 0.0, 0.0))
    line = estimate.start_estimate("cpu-demo").line("ready in")
    assert line.endswith(
        f"this machine is loaded now (load average {3.0 * cores:.1f} on {cores} cores): "
        "expect longer."
    )


def test_demo_estimate_from_past_demos_else_a_floor_from_starts() -> None:
    assert estimate.demo_estimate(4, "cpu-demo").seconds is None
    _finished("cpu-demo", 40.0)
    floor = estimate.demo_estimate(4, "cpu-demo")
    assert floor.at_least and floor.seconds == 160.0
    assert "at least 3 min (no demo measured here yet: 4 server starts" in floor.line("demo")
    for wall in (400.0, 2835.0, 500.0):
        estimate.record_demo(4, wall, {"vllm-defaults.ready": 40.0})
    estimate.record_demo(2, 100.0, {})  # another candidate count: not this demo's
    got = estimate.demo_estimate(4, "cpu-demo")
    assert got.seconds == 500.0 and not got.at_least
    assert got.line("the whole demo") == (
        "the whole demo: about 8 min (median of 3 demo(s) on this machine, 400-2835 s)."
    )
