"""Async streaming load generator for OpenAI-compatible servers (/v1/completions, chat completions).

The HTTP client is in client.py.

Metric conventions follow `vllm bench serve` (see shared notes): a chunk is any SSE event carrying
`choices`; TTFT = first chunk - send; latency = last chunk - send; ITL = gaps between chunks; output
tokens from the usage chunk (`stream_options.include_usage`), per-chunk tokens from
`continuous_usage_stats` when the server sends them, else one per chunk.

Modes: closed loop (N workers, each running one session at a time: a sweep is a list of N) and open
loop (sessions arrive at `rate` per second, Poisson/gamma with a burstiness factor or constant,
optionally capped by a concurrency). Stop after `num_prompts` measured requests or `duration`
seconds, whichever comes first. A stop event (Ctrl-C) or a dead server ends the run early: requests
in flight are cancelled (recorded as such), every finished record is kept, and the result says why.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from kimictl.core.errors import InputError
from kimictl.core.http1 import MAX_ERROR_BODY, Endpoint, own_request_headers
from kimictl.core.http1 import fetch_text as fetch_text
from kimictl.core.loops import sleep_until
from kimictl.runtime.load.clientlag import LagProbe
from kimictl.runtime.load.records import ERROR_KINDS as ERROR_KINDS
from kimictl.runtime.load.records import SCHEDULES
from kimictl.runtime.load.records import LoadPoint as LoadPoint
from kimictl.runtime.load.records import LoadSettings as LoadSettings
from kimictl.runtime.load.records import LoadTarget as LoadTarget
from kimictl.runtime.load.records import RecordList as RecordList
from kimictl.runtime.load.records import RequestRecord as RequestRecord
from kimictl.runtime.load.workloads import FanOut, RequestSpec, Session, Workload, prompt_text
from kimictl.runtime.observe.window import join_windows

if TYPE_CHECKING:
    from kimictl.runtime.observe.scrape import MetricsScraper
    from kimictl.runtime.observe.snapshot import MetricsSnapshot

__all__ = [
    "STREAMS_PER_WORKER",
    "Shard",
    "default_workers",
    "run_load",
    "default_warmup",
]


# ---------------------------------------------------------------------------------------------
# Running a workload


def _payload(target: LoadTarget, spec: RequestSpec, chat: bool, ignore_eos: bool) -> bytes:
    body: dict[str, Any] = {
        "model": target.model,
        "max_tokens": spec.output_len,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = [{"role": "user", "content": prompt_text(spec)}]
    else:
        body["prompt"] = spec.prompt if spec.prompt is not None else prompt_text(spec)
    return orjson.dumps(body)


@dataclass(frozen=True)
class Shard:
    """This process's part of a run spread over `count` worker processes (workers.py): it runs
    every `count`-th stream. `sync` waits until every worker reaches the same turn boundary (False:
    another worker ended the run); `on_point` reports a point's start to the parent."""

    index: int
    count: int
    t_run: float
    sync: Callable[[], Awaitable[bool]]

    def owns(self, k: int, concurrency: int | None, closed: bool) -> bool:
        """Is the run's k-th session this worker's? Closed loop: its streams' sessions (stream
        j = k mod concurrency belongs to worker j mod count); open loop: every count-th arrival."""
        if closed:
            return (k % max(concurrency or 1, 1)) % self.count == self.index
        return k % self.count == self.index

    def streams(self, concurrency: int) -> int:
        return concurrency // self.count + (1 if self.index < concurrency % self.count else 0)


@dataclass
class _Run:
    """What every point run of one run_load shares."""

    settings: LoadSettings
    t_run: float
    out: RecordList
    stop: asyncio.Event
    on_record: Callable[[RequestRecord], None] | None
    start_lag: list[tuple[float, float]]  # (t, ms): requests sent after they were due
    shard: Shard | None = None


class _PointRun:
    """Runs one (target, point, repeat): issues sessions until the request budget or time is up.
    `run` may be called again to continue with the same session sequence (a schedule's next part);
    the budget is cumulative over the parts."""

    def __init__(
        self,
        run: _Run,
        *,
        target: LoadTarget,
        endpoint: Endpoint,
        point: LoadPoint,
        repeat: int,
        warmup: bool,
        sessions: Callable[[], Iterator[Session]],
        rng: random.Random,
    ) -> None:
        self.target = target
        self.ep = endpoint
        self.point = point
        self.repeat = repeat
        self.warmup = warmup
        self.source = sessions
        self.sessions = enumerate(sessions())
        self.shard = run.shard
        self.closed = point.rate is None
        self.budget: int | None = None
        self.deadline: float | None = None
        self.timeout = run.settings.timeout
        self.chat = run.settings.chat
        self.ignore_eos = run.settings.ignore_eos
        self.t_run = run.t_run
        self.out = run.out
        self.stop = run.stop
        self.on_record = run.on_record
        self.start_lag = run.start_lag
        self.rng = rng
        self._skip = False  # the session _next_session returned is another worker's arrival
        self.issued = 0
        self.reserved = 0
        self.inflight = 0
        self.max_inflight = 0
        self.connect_failures = 0  # in a row
        self.last_connect_error = ""
        self.any_success = False
        self.abort: str | None = None
        self.first: float | None = None
        self.last: float = 0.0
        self.part_first: float | None = None  # the running part's first send
        self.part = 0  # the running part's number in an A/B schedule's turns (0: not in turns)
        self.parts: list[tuple[float, float]] = []
        self.scrapes: list[tuple[MetricsSnapshot, MetricsSnapshot]] = []

    def _give_up(self) -> None:
        if not self.abort:
            self.abort = (
                f"{self.target.name} ({self.target.url}) stopped answering: "
                f"{self.connect_failures} connection failures in a row ({self.last_connect_error})"
            )

    def _exhausted(self) -> bool:
        """No further request, even inside a running session: stopped, aborted or out of time."""
        if self.stop.is_set() or self.abort:
            return True
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def _can_start(self) -> bool:
        """No new session once the started ones account for the request budget. Started sessions
        run to their end (a multi-turn run may issue up to one session more than the budget),
        so new sessions cannot eat the budget with first turns."""
        if self.budget is not None and self.reserved >= self.budget:
            return False
        return not self._exhausted()

    def _next_session(self) -> Session | None:
        """The next session of this worker. In an open loop a worker counts every arrival (its
        budget and clock are the whole run's) and returns the others' as skipped (`_skip`)."""
        shard = self.shard
        for k, sess in self.sessions:
            if shard is not None and self.closed:
                if not shard.owns(k, self.point.concurrency, True):
                    continue
            self.reserved += sess.num_requests
            self._skip = shard is not None and not shard.owns(k, None, False)
            return sess
        return None

    def _own_budget(self, budget: int | None) -> int | None:
        """A closed-loop worker's share of a request budget: the requests of its sessions among
        those the whole run starts (a session starts while fewer than `budget` are reserved)."""
        shard = self.shard
        if budget is None or shard is None or not self.closed:
            return budget
        total = own = 0
        for k, sess in enumerate(self.source()):
            if total >= budget:
                break
            total += sess.num_requests
            if shard.owns(k, self.point.concurrency, True):
                own += sess.num_requests
        return own

    async def _request(
        self, spec: RequestSpec, session: int, turn: int, due: float | None
    ) -> float | None:
        """Send one request (`due`: when it should have left, for the start lag); returns the
        time of its response's last read, or None when it failed."""
        rec = RequestRecord(
            target=self.target.name,
            point="warmup" if self.warmup else self.point.label,
            repeat=self.repeat,
            index=self.issued,
            warmup=self.warmup,
            session=session,
            turn=turn,
            input_len=spec.input_len,
            output_len=spec.output_len,
            part=self.part,
        )
        self.issued += 1
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        data = self.ep.build(
            "POST",
            "/v1/chat/completions" if self.chat else "/v1/completions",
            _payload(self.target, spec, self.chat, self.ignore_eos),
            own_request_headers("warmup") if self.warmup else None,
        )
        t0 = time.perf_counter()
        rec.start = t0 - self.t_run
        if due is not None:
            self.start_lag.append((rec.start, max(0.0, (t0 - due) * 1000)))
        if self.first is None:
            self.first = rec.start
        if self.part_first is None:
            self.part_first = rec.start
        try:
            resp = await self.ep.request(data, rec, self.timeout, t0)
            rec.status = resp.status
            if rec.error_kind is None:
                if resp.status == 429:
                    rec.error_kind = "http_429"
                elif resp.status >= 500:
                    rec.error_kind = "http_5xx"
                elif resp.status != 200:
                    rec.error_kind = "http_4xx"
                elif not resp.seen_done:
                    rec.error_kind = "malformed_sse"
                    rec.error = "the stream ended without data: [DONE]"
                if resp.status != 200 and rec.error_kind:
                    rec.error = f"HTTP {resp.status}: " + bytes(resp.body[:MAX_ERROR_BODY]).decode(
                        "utf-8", "replace"
                    )
            if rec.error_kind is None and rec.output_tokens == 0:
                rec.output_tokens = sum(rec.chunk_tokens)
            rec.ok = rec.error_kind is None and rec.ttft is not None
            if rec.error_kind is None and not rec.ok:
                rec.error_kind = "malformed_sse"
                rec.error = "the stream carried no choices"
        except asyncio.CancelledError:
            rec.error_kind = "cancelled"
            rec.error = "cancelled before the response finished"
            rec.ok = False
            raise
        finally:
            rec.end = time.perf_counter() - self.t_run
            self.last = max(self.last, rec.end)
            self.inflight -= 1
            self.out.append(rec)
            if rec.ok:
                self.any_success = True
                self.connect_failures = 0
            elif rec.error_kind in ("connect", "disconnect"):
                self.connect_failures += 1
                self.last_connect_error = rec.error or rec.error_kind
                if self.connect_failures >= 3:
                    self._give_up()
            if self.on_record is not None:
                self.on_record(rec)
        return resp.t_last if rec.ok else None

    async def _session(self, sess: Session, due: float | None) -> float | None:
        """Run a session's turns; `due` is when its first request should leave. Returns when the
        next request of its worker is due (the last response's last read), None if unknown."""
        for turn, step in enumerate(sess.steps):
            if step.think_time > 0:
                await asyncio.sleep(step.think_time)
                due = None if due is None else due + step.think_time
            if self._exhausted():
                return None
            if isinstance(step, FanOut):
                await asyncio.gather(*(self._session(s, due) for s in step.sessions))
                due = None
            else:
                due = await self._request(step, sess.id, turn, due)
        return due

    async def _closed(self, workers: int) -> None:
        async def worker() -> None:
            due: float | None = time.perf_counter()
            while self._can_start():
                sess = self._next_session()
                if sess is None:
                    return
                due = await self._session(sess, due)

        await asyncio.gather(*(worker() for _ in range(workers)))

    async def _open(self) -> None:
        point = self.point
        assert point.rate is not None
        limit = point.concurrency
        if limit and self.shard is not None:
            limit = max(1, self.shard.streams(limit))
        cap = asyncio.Semaphore(limit) if limit else None
        tasks: set[asyncio.Task[None]] = set()

        async def run_one(sess: Session, due: float) -> None:
            if cap is None:
                await self._session(sess, due)
                return
            waits = cap.locked()  # a full cap holds it back on purpose: no lag to count
            async with cap:
                await self._session(sess, None if waits else due)

        t_start = time.perf_counter()
        due = 0.0
        t0_trace = None if self.parts else 0.0  # a later part's clock starts at its first session
        while self._can_start():
            sess = self._next_session()
            if sess is None:
                break
            if sess.at is not None:  # replay: the trace's own clock
                if t0_trace is None:
                    t0_trace = sess.at
                due = sess.at - t0_trace
            else:
                due += _gap(point, self.rng)
            if self._skip:  # another worker's arrival
                continue
            await sleep_until(t_start + due, self.stop)
            if self._exhausted():
                break
            task = asyncio.create_task(run_one(sess, t_start + due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def run(self, budget: int | None, duration: float | None, part: int = 0) -> None:
        """Issue sessions until `budget` requests in all (this part and the earlier ones) or
        `duration` seconds of this part; `part` numbers the turn (0: the targets run at once)."""
        self.part = part
        self.budget = self._own_budget(budget)
        self.deadline = None if duration is None else time.perf_counter() + duration
        self.part_first = None
        try:
            if self.point.rate is None:
                streams = self.point.concurrency or 1
                await self._closed(streams if self.shard is None else self.shard.streams(streams))
            else:
                await self._open()
        finally:
            if self.part_first is not None:
                self.parts.append((self.part_first, self.last))
        # a point too short for 3 failures in a row must not pass as done when no request of it
        # ever got an answer and the last ones could not connect
        if not self.any_success and self.connect_failures:
            self._give_up()


# A B B A cycles per point: turns of about one wave of `concurrency` requests (or ABBA_TURN_S
# seconds), so load that comes and goes on the machine within a point hits both sides alike;
# at most ABBA_MAX_CYCLES (each turn boundary drains the point and scrapes /metrics twice).
ABBA_MAX_CYCLES = 8
ABBA_TURN_S = 5.0


def _abba_cycles(point: LoadPoint, num_prompts: int | None, duration: float | None) -> int:
    """How many A B B A cycles a point of the "abba" schedule runs; 0 = too short to split."""
    if num_prompts is not None:
        wave = max(point.concurrency or 1, 1)
        return max(1, min(ABBA_MAX_CYCLES, num_prompts // (2 * wave))) if num_prompts >= 2 else 0
    assert duration is not None
    return max(1, min(ABBA_MAX_CYCLES, int(duration // (2 * ABBA_TURN_S))))


def _gap(point: LoadPoint, rng: random.Random) -> float:
    rate = point.rate or 0.0
    if rate <= 0 or rate == float("inf"):
        return 0.0
    if point.arrivals == "constant":
        return 1.0 / rate
    # Gamma with shape k=burstiness and mean 1/rate; k=1 is Poisson (exponential gaps).
    k = point.burstiness
    return rng.gammavariate(k, 1.0 / (rate * k))


# Streams per worker at fast-path rates: one loop reads 64 x 1.2 ms true on 16 cores, but with
# no margin (at 256 streams, 4 workers lagged in one run of two; 8 read true; docs/bench.md).
STREAMS_PER_WORKER = 32


def default_workers(points: Sequence[LoadPoint]) -> int:
    """Worker processes for a run: one per STREAMS_PER_WORKER streams of its largest point, at
    most half the cores this process may use (the rest for a server beside it) and no more than
    the cores the load average leaves idle; 1 for an uncapped open loop."""
    import math
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    idle = cores - os.getloadavg()[0] if hasattr(os, "getloadavg") else cores
    streams = max((p.concurrency or 0 for p in points), default=0)
    want = math.ceil(streams / STREAMS_PER_WORKER)
    return max(1, min(want, cores // 2, int(idle)))


def default_warmup(n_targets: int, points: Sequence[LoadPoint]) -> int:
    """Warm-up requests per target when none is asked for: two waves of the largest concurrency
    per side of an A/B, none for one target. In the A/A study on two identical CPU servers the side
    that opened the point cold read 0.91x the other [0.84, 0.99]; two waves of warm-up brought it
    to 0.97x [0.85, 1.12] (docs/results.md)."""
    if n_targets < 2:
        return 0
    return 2 * max((p.concurrency or 1 for p in points), default=1)


async def run_load(
    targets: Sequence[LoadTarget],
    workload: Workload,
    settings: LoadSettings,
    *,
    stop: asyncio.Event | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    on_point: Callable[[LoadTarget, LoadPoint, int], None] | None = None,
    shard: Shard | None = None,
) -> RecordList:
    """Run `workload` against every target at every point, `settings.repeat` times, and return
    every record.

    `settings.workers` > 1 (None: `default_workers`) spreads the streams over that many worker
    processes, one event loop each (workers.py), and returns one merged result; `shard` is a
    worker's own part of such a run.

    Each (target, point, repeat) gets the identical session sequence (the workload seeded with
    `settings.seed`), so an A/B compares the same requests. How several targets share a point is
    `settings.schedule` (records.SCHEDULES): "abba" (the default) splits each target's requests
    into turns of about one wave (`_abba_cycles`) run A B B A A B B A ... (each sequence continues
    where it stopped, so both sides still get the same requests): neither side always has the
    first, colder turn, and load that comes and goes on the machine hits both sides alike;
    "turns" runs each target's whole point in turn;
    "interleave" runs them at the same time (both see the same drift; use it when the servers do
    not share hardware, and note the client's CPU is shared). The first order alternates between
    points and repeats. `RecordList.schedule` lists the turns as they ran.
    """
    points, num_prompts, duration = settings.points, settings.num_prompts, settings.duration
    warmup, seed = settings.warmup, settings.seed
    if not targets:
        raise InputError("no target to benchmark", hint="pass --target URL (or --ab)")
    if num_prompts is None and duration is None:
        raise InputError("give --num-prompts or --duration so the run has an end")
    if not points:
        raise InputError("no load point: give --concurrency or --rate")
    if settings.schedule not in SCHEDULES:
        raise InputError(f"schedule {settings.schedule!r} is not one of: {', '.join(SCHEDULES)}")
    for p in points:
        if p.rate is None and (p.concurrency is None or p.concurrency < 1):
            raise InputError(f"concurrency {p.concurrency!r} must be a whole number >= 1")
        if p.rate is not None and p.rate <= 0:
            raise InputError(f"request rate {p.rate!r} must be > 0 requests/s")
        if p.burstiness <= 0:
            raise InputError(f"burstiness {p.burstiness!r} must be > 0 (1 = Poisson)")
        if p.arrivals not in ("poisson", "constant"):
            raise InputError(f"arrivals {p.arrivals!r} is not one of: poisson, constant")
    stop = stop or asyncio.Event()
    if shard is None:
        n = settings.workers or default_workers(points)
        if n > 1:
            from kimictl.runtime.load.workers import run_workers

            return await run_workers(
                targets, workload, settings, n, stop=stop, on_record=on_record, on_point=on_point
            )
    out = RecordList()
    endpoints = {t.name: Endpoint(t.url, t.api_key) for t in targets}
    scrapers = _scrapers(targets) if settings.scrape_metrics else {}
    t_run = time.perf_counter() if shard is None else shard.t_run
    probe = LagProbe(t_run, 0 if shard is None else shard.index)  # (clientlag.py)
    run = _Run(settings, t_run, out, stop, on_record, probe.trace.start_lag, shard)
    probe.start()

    async def sync() -> None:
        """A turn boundary: every worker of a sharded run starts and ends each part together."""
        if shard is not None and not await shard.sync():
            stop.set()

    def point_run(
        t: LoadTarget,
        point: LoadPoint,
        *,
        repeat: int,
        warmup: bool,
        sessions_seed: int,
        rng_seed: int,
    ) -> _PointRun:
        return _PointRun(
            run,
            target=t,
            endpoint=endpoints[t.name],
            point=point,
            repeat=repeat,
            warmup=warmup,
            sessions=lambda: workload.sessions(sessions_seed),
            rng=random.Random(rng_seed),
        )

    try:
        if warmup > 0:
            for t in targets:
                if stop.is_set() or out.stop_reason:
                    break
                pr = point_run(
                    t,
                    LoadPoint(concurrency=min(warmup, max(p.concurrency or 1 for p in points))),
                    repeat=0,
                    warmup=True,
                    sessions_seed=seed + 7919,
                    rng_seed=seed,
                )
                await sync()
                await _run_point(pr, stop, warmup, None)
                await sync()
                if pr.abort and not pr.any_success:
                    out.stop_reason = pr.abort

        async def turn(
            pr: _PointRun, part: int, budget: int | None, seconds: float | None, *, in_turns: bool
        ) -> None:
            """One part of one target's point: scraped before and after, logged in the schedule.
            Its records carry `part` when the targets take turns (A/B tests then shuffle whole
            turns, ab._turns), else 0."""
            scraper = scrapers.get(pr.target.name)
            before = await _scrape(scraper) if scraper is not None else None
            done = len(pr.parts)
            issued = pr.issued
            await sync()
            await _run_point(pr, stop, budget, seconds, part if in_turns else 0)
            await sync()
            if before is not None and scraper is not None:
                after = await _scrape(scraper)
                if after is not None:
                    pr.scrapes.append((before, after))
            start, end = pr.parts[-1] if len(pr.parts) > done else (None, None)
            out.schedule.append(
                {
                    "target": pr.target.name,
                    "point": pr.point.label,
                    "repeat": pr.repeat,
                    "part": part,
                    "requests": pr.issued - issued,
                    "start_s": start,
                    "end_s": end,
                }
            )
            if pr.abort and not out.stop_reason:
                out.stop_reason = pr.abort

        def ended() -> bool:
            return stop.is_set() or bool(out.stop_reason)

        for r in range(settings.repeat):
            for i, point in enumerate(points):
                if ended():
                    break
                order = list(targets) if (r + i) % 2 == 0 else list(reversed(targets))
                prs = {}
                for t in order:
                    if on_point is not None:
                        on_point(t, point, r)
                    prs[t.name] = point_run(
                        t,
                        point,
                        repeat=r,
                        warmup=False,
                        sessions_seed=seed,
                        rng_seed=seed * 1000003 + i,
                    )
                runs = [prs[t.name] for t in order]
                cycles = _abba_cycles(point, num_prompts, duration)
                in_turns = len(runs) > 1  # one target takes no turns
                if settings.schedule == "interleave":
                    await asyncio.gather(
                        *(turn(pr, 1, num_prompts, duration, in_turns=False) for pr in runs)
                    )
                elif settings.schedule == "abba" and len(runs) > 1 and cycles:
                    parts = 2 * cycles  # A B | B A, `cycles` times
                    for j in range(parts):
                        budget = None if num_prompts is None else num_prompts * (j + 1) // parts
                        seconds = None if duration is None else duration / parts
                        for pr in runs if j % 2 == 0 else runs[::-1]:
                            if ended():
                                break
                            await turn(pr, j + 1, budget, seconds, in_turns=True)
                else:
                    for pr in runs:
                        if ended():
                            break
                        await turn(pr, 1, num_prompts, duration, in_turns=in_turns)
                for pr in runs:
                    key = (pr.target.name, point.label, r)
                    if pr.first is not None:
                        out.windows[key] = (pr.first, pr.last)
                        out.segments[key] = list(pr.parts)
                    out.max_concurrent[key] = pr.max_inflight
                    if pr.scrapes:
                        out.metrics[key] = join_windows(pr.scrapes)
        if stop.is_set() and out.stop_reason is None:
            out.stop_reason = "interrupted"
    except asyncio.CancelledError:
        out.stop_reason = out.stop_reason or "interrupted"
    finally:
        for ep in endpoints.values():
            ep.close()
        for scraper in scrapers.values():
            scraper.close()
        await probe.stop()
        out.client = [probe.trace]
    return out


async def _run_point(
    pr: _PointRun, stop: asyncio.Event, budget: int | None, duration: float | None, part: int = 0
) -> None:
    """Run (a part of) one point; on the stop event, cancel what is in flight (it is recorded as
    cancelled)."""
    task = asyncio.ensure_future(pr.run(budget, duration, part))
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not task.done():
            task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass


def _scrapers(targets: Sequence[LoadTarget]) -> dict[str, MetricsScraper]:
    """One /metrics scraper per target (the monitor's: filtered to what a snapshot reads)."""
    from kimictl.runtime.observe.scrape import MetricsScraper

    return {
        t.name: MetricsScraper(t.url, name=f"target {t.name}", api_key=t.api_key or "")
        for t in targets
    }


async def _scrape(scraper: MetricsScraper) -> MetricsSnapshot | None:
    """A snapshot of the server's counters and histograms; None when /metrics cannot be read."""
    from kimictl.core.errors import EndpointError

    try:
        return await scraper.scrape(timeout=10.0)
    except EndpointError:
        return None
