"""What a load run is about and what it returns: targets, sweep points, per-request records."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kimictl.runtime.load.clientlag import ClientTrace
    from kimictl.runtime.observe.snapshot import MetricsSnapshot

__all__ = [
    "ERROR_KINDS",
    "LoadPoint",
    "LoadSettings",
    "LoadTarget",
    "RecordList",
    "RequestRecord",
    "SCHEDULES",
    "Schedule",
]

# Error kinds, counted separately in summaries.
ERROR_KINDS = (
    "http_429",  # rate limited
    "http_5xx",  # server error
    "http_4xx",  # bad request (prompt too long, unknown model, ...)
    "malformed_sse",  # a data: line that is not JSON, or a stream without [DONE]
    "connect",  # connection refused / unreachable
    "disconnect",  # the server closed the connection mid-response
    "timeout",  # no complete response within the request timeout
    "cancelled",  # stopped by Ctrl-C or an aborted run (not a server failure)
)


@dataclass(frozen=True)
class LoadTarget:
    """One endpoint under load. `url` is the server root (`http://host:port`, `/v1` allowed)."""

    name: str
    url: str
    model: str
    api_key: str | None = None
    gpus: int | None = None

    def __repr__(self) -> str:  # never print the key
        return f"LoadTarget(name={self.name!r}, url={self.url!r}, model={self.model!r})"


@dataclass(frozen=True)
class LoadPoint:
    """One point of a sweep: closed loop at `concurrency`, or open loop at `rate` req/s (capped by
    `concurrency` when both are set)."""

    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    arrivals: str = "poisson"  # poisson (gamma with shape=burstiness) | constant

    @property
    def label(self) -> str:
        if self.rate is None:
            return f"c={self.concurrency}"
        cap = f",c<={self.concurrency}" if self.concurrency else ""
        return f"rate={self.rate:g}{cap}"


@dataclass(frozen=True, kw_only=True)
class LoadSettings:
    """How a run loads its targets: one frozen object from the command down to each point run."""

    points: tuple[LoadPoint, ...]
    num_prompts: int | None = None
    duration: float | None = None
    warmup: int = 0
    seed: int = 0
    repeat: int = 1
    timeout: float = 300.0
    chat: bool = False
    ignore_eos: bool = True
    scrape_metrics: bool = False
    schedule: str = "abba"  # how several targets share a point: one of SCHEDULES
    # worker processes (one event loop each) the streams are spread over; None: loadgen's
    # default_workers (from the cores, their load and the largest concurrency)
    workers: int | None = 1
    loop: str = "auto"  # the event loop of each worker process: core.loops.EventLoop


# How several targets take a point (run_load): "abba" splits each target's requests into turns of
# about one wave, run A B B A A B B A ... (loadgen._abba_cycles: at most 8 cycles), so a drift or a
# warmer later turn hits both alike; "turns" runs each target's whole point in turn; "interleave"
# loads all at once.
class Schedule(StrEnum):
    abba = "abba"
    turns = "turns"
    interleave = "interleave"


SCHEDULES = tuple(s.value for s in Schedule)


@dataclass
class RequestRecord:
    """What happened to one request. Times are seconds; `start`/`end` count from the run's start,
    `ttft`, `latency` and `chunk_times` from the request's own send time."""

    target: str
    point: str
    repeat: int
    index: int
    warmup: bool
    session: int
    turn: int
    input_len: int
    output_len: int
    part: int = 0  # the turn of an A/B schedule it ran in (1, 2, ...); 0 = not taken in turns
    start: float = 0.0
    end: float = 0.0
    ttft: float | None = None
    latency: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    status: int = 0
    ok: bool = False
    error_kind: str | None = None
    error: str | None = None
    text_len: int = 0

    @property
    def prompt_len(self) -> int:
        return self.prompt_tokens if self.prompt_tokens is not None else self.input_len

    @property
    def tpot(self) -> float | None:
        """(latency - TTFT) / (output_tokens - 1), vllm bench's definition; None below 2 tokens."""
        if not self.ok or self.ttft is None or self.latency is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        t = self.chunk_times
        return [t[i] - t[i - 1] for i in range(1, len(t))]


class RecordList(list[RequestRecord]):
    """`run_load`'s result: the records, plus how the run ended and each point's time window."""

    def __init__(self) -> None:
        super().__init__()
        self.stop_reason: str | None = None  # None = ran to completion
        # (target, point, repeat) -> (start, end) seconds from the run's start, measured part only
        self.windows: dict[tuple[str, str, int], tuple[float, float]] = {}
        # (target, point, repeat) -> the (start, end) of each of its turns; throughputs divide by
        # their summed length (another target's turn in between is not this one's time)
        self.segments: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
        # the run's order of turns: target, point, repeat, part (1-based), requests, start, end
        self.schedule: list[dict[str, object]] = []
        # (target, point, repeat) -> /metrics snapshots (before, after); absent when not scraped
        # or the server has no readable /metrics
        self.metrics: dict[tuple[str, str, int], tuple[MetricsSnapshot, MetricsSnapshot]] = {}
        self.max_concurrent: dict[tuple[str, str, int], int] = {}
        # the client's own lag and CPU during the run, one trace per worker process (clientlag.py)
        self.client: list[ClientTrace] = []
