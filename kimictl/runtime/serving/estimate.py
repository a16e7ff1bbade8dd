"""How long a start (serve) or a whole demo will take on this machine: from what this machine
measured before (the run records' start-to-ready times, the demos' recorded wall times), never a
figure from elsewhere, and whether the machine is loaded now (then it will take longer)."""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from kimictl.core.paths import state_dir
from kimictl.runtime.serving import runs

__all__ = ["Estimate", "demo_estimate", "record_demo", "start_estimate"]

_DEMO_HISTORY = "demo-timings.jsonl"
_KEEP = 20  # the latest measurements a median is taken over


@dataclass(frozen=True)
class Estimate:
    """A duration measured here before (None: never measured), what it rests on, and the load."""

    seconds: float | None
    basis: str
    load: float  # 1-minute load average now
    cores: int
    at_least: bool = False  # a floor (part of the work measured), not a whole estimate

    @property
    def loaded(self) -> bool:
        return self.load > self.cores

    def line(self, what: str) -> str:
        if self.seconds is None:
            head = f"{what}: no estimate ({self.basis})"
        else:
            about = "at least" if self.at_least else "about"
            head = f"{what}: {about} {_duration(self.seconds)} ({self.basis})"
        if self.loaded:
            head += (
                f"; this machine is loaded now (load average {self.load:.1f} on {self.cores} "
                "cores): expect longer"
            )
        return head + "."


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _now() -> tuple[float, int]:
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return load, os.cpu_count() or 1


def _median(values: list[float]) -> tuple[float, str]:
    """The median and the range shown beside it."""
    spread = f", {min(values):.0f}-{max(values):.0f} s" if len(values) > 1 else ""
    return statistics.median(values), spread


def start_estimate(profile: str) -> Estimate:
    """Start-to-ready of `profile` from the runs this machine recorded (the latest 20)."""
    load, cores = _now()
    took = [
        r.ready_at - r.started_at
        for r in runs.list_runs(include_finished=True)
        if r.profile == profile and r.ready_at is not None and r.ready_at > r.started_at
    ][-_KEEP:]
    if not took:
        return Estimate(None, f"no start of {profile} measured on this machine yet", load, cores)
    mid, spread = _median(took)
    basis = f"median of {len(took)} start(s) of {profile} on this machine{spread}"
    return Estimate(mid, basis, load, cores)


def _history() -> Path:
    return state_dir() / _DEMO_HISTORY


def record_demo(candidates: int, wall_s: float, timings: dict[str, float]) -> None:
    """Append a finished demo's wall time and phase times to this machine's history."""
    path = _history()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            entry = {"candidates": candidates, "wall_s": wall_s, "timings": timings}
            out.write(json.dumps(entry) + "\n")
    except OSError:
        pass  # an estimate is a convenience: never fail a finished demo over it


def demo_estimate(candidates: int, profile: str) -> Estimate:
    """The whole demo: the median wall time of the demos this machine ran with as many
    candidates; else, as a floor, that many server starts of `profile`."""
    load, cores = _now()
    walls: list[float] = []
    try:
        for line in _history().read_text().splitlines():
            try:
                entry = json.loads(line)
                if entry.get("candidates") == candidates and entry.get("wall_s"):
                    walls.append(float(entry["wall_s"]))
            except (ValueError, TypeError, AttributeError):
                continue
    except OSError:
        pass
    if walls:
        mid, spread = _median(walls[-_KEEP:])
        basis = f"median of {len(walls[-_KEEP:])} demo(s) on this machine{spread}"
        return Estimate(mid, basis, load, cores)
    start = start_estimate(profile)
    if start.seconds is None:
        none = f"no demo or {profile} start measured on this machine yet"
        return Estimate(None, none, load, cores)
    basis = (
        f"no demo measured here yet: {candidates} server starts at this machine's "
        f"{start.seconds:.0f} s each, plus the benches"
    )
    return Estimate(start.seconds * candidates, basis, load, cores, at_least=True)
