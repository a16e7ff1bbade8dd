"""Is the bench client itself keeping up? Event-loop lag and chunk batching during a run.

A client starved of CPU reads the socket late: several SSE chunks arrive in one read and get one
timestamp, so TTFT grows to the whole latency and TPOT/ITL drop to 0, figures no server produced.
Two signs, measured while the load runs:
- loop lag: a ticker sleeps TICK_S and records how late it wakes (the delay every read suffers);
- batching: ITLs of exactly 0, i.e. chunks parsed from one read (loadgen stamps a read once).
`client_health` turns them into the JSON keys and, past the thresholds, a warning.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kimictl.runtime.load.records import RequestRecord

__all__ = [
    "BATCHED_WARN_PCT",
    "LAG_WARN_MS",
    "TICK_S",
    "LagProbe",
    "client_health",
]

TICK_S = 0.01
# p99 loop lag above this, or more than this share of zero gaps, makes TPOT/ITL untrustworthy:
# a lag near a decode step (tens of ms) moves chunk timestamps by a whole step.
LAG_WARN_MS = 20.0
BATCHED_WARN_PCT = 10.0


class LagProbe:
    """A task on the running loop that records (seconds since `t0`, lag ms) every TICK_S."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.samples: list[tuple[float, float]] = []
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(TICK_S)
            now = time.perf_counter()
            self.samples.append((now - self.t0, max(0.0, (now - before - TICK_S) * 1000)))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None


def _p99(values: Sequence[float]) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * 0.99
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def client_health(
    records: Sequence[RequestRecord],
    lag_samples: Sequence[tuple[float, float]],
    *,
    window: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The client's own figures for the records of one point (lag samples inside `window`)."""
    lags = [ms for t, ms in lag_samples if window is None or window[0] <= t <= window[1]]
    ok = [r for r in records if r.ok and len(r.chunk_times) >= 2]
    gaps = [g for r in ok for g in r.itls]
    zero = sum(1 for g in gaps if g == 0.0)
    collapsed = sum(1 for r in ok if r.chunk_times[0] == r.chunk_times[-1])
    p99 = _p99(lags)
    batched_pct = 100.0 * zero / len(gaps) if gaps else None
    reasons = []
    if p99 is not None and p99 > LAG_WARN_MS:
        reasons.append(f"its event loop ran {p99:.0f} ms late (p99; limit {LAG_WARN_MS:g} ms)")
    if batched_pct is not None and batched_pct > BATCHED_WARN_PCT:
        reasons.append(
            f"{batched_pct:.0f}% of token gaps came in one socket read "
            f"({collapsed} of {len(ok)} responses entirely)"
        )
    warning = None
    if reasons:
        warning = (
            "the bench client was starved of CPU: "
            + " and ".join(reasons)
            + "; TTFT, TPOT, ITL and interactivity are not the server's (run the client on an "
            "idle machine or core)"
        )
    return {
        "client_lag_ms_p99": p99,
        "client_lag_ms_max": max(lags) if lags else None,
        "client_lag_samples": len(lags),
        "client_batched_gaps_pct": batched_pct,
        "client_collapsed_requests": collapsed,
        "client_warning": warning,
    }
