"""Is the bench client itself keeping up? Its own lag, CPU and chunk batching, measured every run.

A client short of CPU reads the socket late: several SSE chunks of one stream arrive in one read
and get one timestamp, so a gap reads 0, the next one twice its length, and TTFT/TPOT/ITL are no
longer the server's. A server that writes several chunks at once looks the same in the gaps. What
tells them apart is the client's own lag, measured while the load runs, in every worker process:
- loop lag: a ticker process stamps the time and writes it to a pipe every TICK_S; the loop reads
  it as it reads any socket, so now - stamp is what a socket read waits (the loop busy, the process
  off its CPU). A timer in the loop would not do: epoll rounds its timeout up to whole ms;
- start lag: how late each request was sent after it was due (its arrival time in an open loop,
  the previous response's last read in a closed loop): past LAG_WARN_MS the load asked for was
  not the load sent;
- CPU: the worker's process CPU time, so CPU per received token (one core carries ~1/that);
- the event loop that ran (uvloop or asyncio, core/loops.py), per worker and as `client_loop`.
`client_health` turns them, with the point's zero gaps, into one verdict: "client lagged" (the
loop ran late against the token gaps: the timings are not the server's), "server bunched" (zero
gaps while the loop was on time: the server sent chunks together) or "ok".
"""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kimictl.runtime.observe.window import percentile

if TYPE_CHECKING:
    from kimictl.runtime.load.records import RequestRecord

__all__ = [
    "BATCHED_WARN_PCT",
    "LAG_GAP_FRACTION",
    "LAG_WARN_MS",
    "TICK_S",
    "ClientTrace",
    "LagProbe",
    "client_health",
]

TICK_S = 0.01
# Loop lag p99 above this makes TTFT/TPOT untrustworthy at any token rate: a lag near a decode
# step (tens of ms) moves chunk timestamps by a whole step.
LAG_WARN_MS = 20.0
# Per-gap ITL needs a read stamped within a fraction of one token gap: a loop lag p90 above this
# share of the median gap (or a p99 above one whole gap while gaps read 0) is the client's doing.
LAG_GAP_FRACTION = 0.25
BATCHED_WARN_PCT = 10.0


@dataclass
class ClientTrace:
    """One worker process's self-measurement; times are seconds from the run's start."""

    worker: int = 0
    lag: list[tuple[float, float]] = field(default_factory=list)  # (t, loop lag ms)
    cpu: list[tuple[float, float]] = field(default_factory=list)  # (t, process CPU s)
    start_lag: list[tuple[float, float]] = field(default_factory=list)  # (t, ms late)
    loop: str = "asyncio"  # the event loop that ran: core.loops.running_loop

    def cpu_in(self, window: tuple[float, float] | None) -> float | None:
        """CPU seconds this worker spent inside `window` (between the samples bounding it)."""
        xs = [c for t, c in self.cpu if window is None or window[0] <= t <= window[1]]
        return xs[-1] - xs[0] if len(xs) >= 2 else None


# The ticker: its own process, so neither the GIL nor the loop can hold its stamps back. The
# monotonic clock (perf_counter) is one clock for every process of the machine.
_TICKER = """
import os, struct, sys, time
tick = float(sys.argv[1])
while True:
    time.sleep(tick)
    try:
        os.write(1, struct.pack("d", time.perf_counter()))
    except OSError:
        break
"""


class LagProbe:
    """Samples the running loop's lag (stamps of a ticker process, read like a socket) and the
    process CPU every TICK_S, into `trace`."""

    def __init__(self, t0: float, worker: int = 0) -> None:
        self.t0 = t0
        self.trace = ClientTrace(worker=worker)
        self._proc: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._buf = b""

    @property
    def samples(self) -> list[tuple[float, float]]:
        return self.trace.lag

    def _on_stamps(self) -> None:
        now = time.perf_counter()
        assert self._proc is not None and self._proc.stdout is not None
        try:
            data = os.read(self._proc.stdout.fileno(), 4096)
        except BlockingIOError:
            return
        if not data:  # the ticker is gone
            self._detach()
            return
        buf = self._buf + data
        whole = len(buf) - len(buf) % 8
        self._buf = buf[whole:]
        rel = now - self.t0
        for (stamp,) in struct.iter_unpack("d", buf[:whole]):
            self.trace.lag.append((rel, max(0.0, (now - stamp) * 1000)))
        self.trace.cpu.append((rel, time.process_time()))

    def start(self) -> None:
        from kimictl.core.loops import running_loop

        self._loop = asyncio.get_running_loop()
        self.trace.loop = running_loop()
        self.trace.cpu.append((time.perf_counter() - self.t0, time.process_time()))
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _TICKER, str(TICK_S)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        assert self._proc.stdout is not None
        os.set_blocking(self._proc.stdout.fileno(), False)
        self._loop.add_reader(self._proc.stdout.fileno(), self._on_stamps)

    def _detach(self) -> None:
        if self._proc is None:
            return
        assert self._loop is not None and self._proc.stdout is not None
        self._loop.remove_reader(self._proc.stdout.fileno())
        self._proc.kill()
        self._proc.wait()
        self._proc.stdout.close()
        self._proc = None

    async def stop(self) -> None:
        self._detach()
        self.trace.cpu.append((time.perf_counter() - self.t0, time.process_time()))


def _inside(samples: Sequence[tuple[float, float]], window: tuple[float, float] | None) -> list:
    return [v for t, v in samples if window is None or window[0] <= t <= window[1]]


def client_health(
    records: Sequence[RequestRecord],
    traces: Sequence[ClientTrace],
    *,
    window: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The client's own figures for the records of one point (samples inside `window`) and the
    verdict they give: client lagged / server bunched / ok."""
    ok = [r for r in records if r.ok and len(r.chunk_times) >= 2]
    gaps = [g for r in ok for g in r.itls]
    zero = sum(1 for g in gaps if g == 0.0)
    collapsed = sum(1 for r in ok if r.chunk_times[0] == r.chunk_times[-1])
    batched_pct = 100.0 * zero / len(gaps) if gaps else None
    gap_ms = percentile([g * 1000 for g in gaps if g > 0], 50)
    lags = [ms for tr in traces for ms in _inside(tr.lag, window)]
    starts = [ms for tr in traces for ms in _inside(tr.start_lag, window)]
    p50, p90, p99 = (percentile(lags, p) for p in (50, 90, 99))
    cpus = [c for c in (tr.cpu_in(window) for tr in traces) if c is not None]
    tokens = sum(r.output_tokens for r in records if r.ok)
    span = window[1] - window[0] if window is not None else None
    workers = [
        {
            "worker": tr.worker,
            "loop": tr.loop,
            "lag_ms_p50": percentile(_inside(tr.lag, window), 50),
            "lag_ms_p99": percentile(_inside(tr.lag, window), 99),
            "start_lag_ms_p99": percentile(_inside(tr.start_lag, window), 99),
            "cpu_s": tr.cpu_in(window),
        }
        for tr in traces
    ]
    reasons = []
    if p99 is not None and p99 > LAG_WARN_MS:
        reasons.append(f"its event loop ran {p99:.1f} ms late (p99; limit {LAG_WARN_MS:g} ms)")
    elif p90 is not None and gap_ms and p90 > LAG_GAP_FRACTION * gap_ms:
        reasons.append(
            f"its event loop ran {p90:.2f} ms late (p90), over {LAG_GAP_FRACTION:.0%} of the "
            f"{gap_ms:.2f} ms token gap"
        )
    bunched = batched_pct is not None and batched_pct > BATCHED_WARN_PCT
    share = (
        f"{batched_pct:.0f}% of token gaps came in one socket read "
        f"({collapsed} of {len(ok)} responses entirely)"
        if bunched and batched_pct is not None
        else ""
    )
    late = p99 is not None and gap_ms is not None and p99 >= gap_ms
    if bunched and (reasons or late or p99 is None):
        reasons.append(share + (f" while its loop ran {p99:.2f} ms late (p99)" if late else ""))
    start_p99 = percentile(starts, 99)
    if start_p99 is not None and start_p99 > LAG_WARN_MS:
        reasons.append(f"requests left {start_p99:.1f} ms after they were due (p99)")
    warning = note = None
    verdict = "ok"
    if reasons:
        verdict = "client lagged"
        warning = (
            "client lagged: "
            + " and ".join(reasons)
            + "; TTFT, TPOT, ITL and interactivity are the client's, not the server's (give the "
            "client idle cores, or more --workers)"
        )
    elif bunched:
        verdict = "server bunched"
        note = (
            f"server bunched: {share} while the client's loop was on time ({p99:.2f} ms p99 "
            f"against a {gap_ms:.2f} ms gap); the gaps are the server's"
            if p99 is not None and gap_ms is not None
            else f"server bunched: {share}"
        )
    return {
        "client_verdict": verdict,
        "client_lag_ms_p50": p50,
        "client_lag_ms_p99": p99,
        "client_lag_ms_max": max(lags) if lags else None,
        "client_lag_samples": len(lags),
        "client_start_lag_ms_p50": percentile(starts, 50),
        "client_start_lag_ms_p99": start_p99,
        "client_cpu_us_per_token": 1e6 * sum(cpus) / tokens if cpus and tokens else None,
        "client_cpu_cores": sum(cpus) / span if cpus and span else None,
        "client_workers": workers,
        "client_loop": "+".join(sorted({tr.loop for tr in traces})) or None,
        "client_batched_gaps_pct": batched_pct,
        "client_collapsed_requests": collapsed,
        "client_warning": warning,
        "client_note": note,
    }
