"""A paired replay: every row of a trace sent to both arms on the trace's own clock, one verdict.

Row i is due at its `timestamp` (divided by `speed`) from the replay's start; at that moment it is
sent to both arms, A first on even rows and B first on odd rows (neither arm always goes first),
with the same seeded prompt tokens, the recorded output length forced (`max_tokens` =
`min_tokens` = output_length, `ignore_eos`), and `X-Request-Id: <i>-<arm>`. vLLM makes that id
the base of its request id, so each request joins its own `llm_request` span (received on
`traces_port`, observe.otlp) on both sides: `cmpl-<i>-<arm>-0` (completions), `chatcmpl-<i>-<arm>`
(chat).

Per row and arm the client times TTFT and TPOT, the span gives TTFT, TPOT (decode time / (tokens
- 1)), queue and end-to-end times. Schedule fidelity is the send time minus the due time (p50,
p99): a client that could not keep the schedule (p99 late by more than `max_lag_ms`) gets no
verdict, only that sentence. The verdict (runtime.verdict.paired) is on the spans' per-request
interactivity (1/TPOT), paired per row (or per session where the trace has session ids), beside
B/A of interactivity p10/p50/p90 and TTFT p50/p90.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from kimictl.core.errors import InputError
from kimictl.core.http1 import MAX_ERROR_BODY, Endpoint, fetch_text
from kimictl.core.loops import sleep_until
from kimictl.runtime.load.mooncake import (
    TraceRow,
    TraceScan,
    check_context,
    iter_trace,
    scan_trace,
)
from kimictl.runtime.load.records import LoadTarget, RequestRecord
from kimictl.runtime.load.workloads import TOKEN_HI, TOKEN_LO, RequestSpec, prompt_text
from kimictl.runtime.observe.otlp import OtlpReceiver, TracedRequest, TraceStore
from kimictl.runtime.observe.window import percentile
from kimictl.runtime.verdict.paired import (
    BETTER,
    DEFAULT_FLOOR,
    MIN_AA_PASSES,
    WORSE,
    AaCalibration,
    BootstrapEstimate,
    Verdict,
    paired_verdict,
    quantile_ratio,
)

__all__ = [
    "ArmResult",
    "PairedConfig",
    "PairedOutcome",
    "PairedRow",
    "PerRow",
    "bracket_note",
    "calibration_notes",
    "judge_again",
    "judge_rows",
    "report_ran",
    "run_paired",
    "span_key",
    "write_ratio_plot",
    "write_rows_csv",
]

MAX_LAG_MS = 100.0  # p99 of (send - due) above this: the replay was not on the trace's clock
SPAN_WAIT_S = 10.0  # after the last answer, the longest wait for the last spans
_ARM_NAME = re.compile(r"^[A-Za-z0-9_.]+$")


def span_key(request_id: str | None) -> str | None:
    """`<row>-<arm>` from vLLM's request id (`cmpl-<X>-0`, `chatcmpl-<X>`), else None."""
    if not request_id:
        return None
    if request_id.startswith("chatcmpl-"):
        return request_id[len("chatcmpl-") :]
    if request_id.startswith("cmpl-") and request_id.endswith("-0"):
        return request_id[len("cmpl-") : -2]
    return None


@dataclass(frozen=True, kw_only=True)
class PairedConfig:
    trace: Path
    targets: tuple[LoadTarget, LoadTarget]
    traces_port: int
    speed: float = 1.0
    limit: int | None = None  # replay the first N rows only
    timeout: float = 300.0
    chat: bool = False
    floor: float = DEFAULT_FLOOR
    aa: bool = False
    calibration: AaCalibration | None = None  # judged net of these A/A passes (--aa-report)
    aa_times: tuple[tuple[float, float], ...] = ()  # when each of those passes ran (unix s)
    max_lag_ms: float = MAX_LAG_MS
    seed: int = 0


@dataclass
class ArmResult:
    due_s: float
    sent_s: float = math.nan
    ok: bool = False
    error: str | None = None
    client_ttft_s: float | None = None
    client_tpot_s: float | None = None
    output_tokens: int = 0
    span: TracedRequest | None = None

    @property
    def lag_ms(self) -> float:
        return (self.sent_s - self.due_s) * 1000.0


@dataclass
class PairedRow:
    index: int
    session: str | None
    input_length: int
    output_length: int
    first: str  # the arm sent first
    arms: dict[str, ArmResult] = field(default_factory=dict)


@dataclass
class PairedOutcome:
    arms: tuple[str, str]
    rows: list[PairedRow]
    fidelity: dict[str, Any]
    joins: dict[str, int]
    verdict: Verdict | None
    withheld: str | None  # why there is no verdict
    notes: list[str]
    stop_reason: str | None = None
    seed: int = 0
    ran: tuple[float, float] = (math.nan, math.nan)  # when the replay began and ended (unix s)
    calibration_notes: list[str] = field(default_factory=list)  # on the A/A calibration used

    def to_json(self) -> dict[str, Any]:
        a, b = self.arms
        return {
            "kimictl_paired_replay": 1,
            "arms": {"A": a, "B": b},
            "rows": len(self.rows),
            "seed": self.seed,
            "ran": {"start_unix": self.ran[0], "end_unix": self.ran[1]},
            "stop_reason": self.stop_reason,
            "fidelity": self.fidelity,
            "span_joins": self.joins,
            "verdict": None if self.verdict is None else self.verdict.to_json(),
            "withheld": self.withheld,
            "notes": self.notes,
            "calibration_notes": self.calibration_notes,
            "per_arm": {arm: _arm_summary(self.rows, arm) for arm in self.arms},
            "per_row": _per_row(self.rows, a, b).to_json(),
        }


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def _arm_summary(rows: Sequence[PairedRow], arm: str) -> dict[str, Any]:
    res = [r.arms[arm] for r in rows if arm in r.arms]
    spans = [x.span for x in res if x.span is not None]
    out: dict[str, Any] = {"requests": len(res), "ok": sum(x.ok for x in res)}
    figures = {
        "client_ttft_ms": [x.client_ttft_s for x in res if x.client_ttft_s is not None],
        "client_tpot_ms": [x.client_tpot_s for x in res if x.client_tpot_s is not None],
        "span_ttft_ms": [s.ttft_s for s in spans if s.ttft_s is not None],
        "span_tpot_ms": [t for t in (s.tpot_s for s in spans) if t is not None],
        "span_queue_ms": [s.queue_s for s in spans if s.queue_s is not None],
    }
    for key, values in figures.items():
        for p in (50, 90):
            out[f"{key[:-3]}_p{p}_ms"] = _ms(percentile(values, p))
    inter = [1.0 / t for t in figures["span_tpot_ms"]]
    for p in (10, 50, 90):
        out[f"span_interactivity_p{p}"] = percentile(inter, p)
    return out


async def _max_context(t: LoadTarget) -> int | None:
    """The served model's max_model_len from /v1/models (None where the server gives none)."""
    try:
        text = await fetch_text(t.url, "/v1/models", api_key=t.api_key, timeout=10.0)
        for card in orjson.loads(text).get("data", []):
            if card.get("id") == t.model and isinstance(card.get("max_model_len"), int):
                return int(card["max_model_len"])
    except (OSError, TimeoutError, orjson.JSONDecodeError, AttributeError):
        return None
    return None


def _payload(t: LoadTarget, row: TraceRow, prompt: list[int], chat: bool) -> bytes:
    body: dict[str, Any] = {
        "model": t.model,
        "max_tokens": row.output_length,
        "min_tokens": row.output_length,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if chat:
        spec = RequestSpec(prompt, row.input_length, row.output_length)
        body["messages"] = [{"role": "user", "content": prompt_text(spec)}]
    else:
        body["prompt"] = prompt
    return orjson.dumps(body)


async def _send(
    ep: Endpoint,
    t: LoadTarget,
    row: TraceRow,
    prompt: list[int],
    res: ArmResult,
    cfg: PairedConfig,
    t_run: float,
) -> None:
    rec = RequestRecord(
        t.name, "replay", 0, row.index, False, 0, 0, row.input_length, row.output_length
    )
    path = "/v1/chat/completions" if cfg.chat else "/v1/completions"
    data = ep.build(
        "POST", path, _payload(t, row, prompt, cfg.chat), {"X-Request-Id": f"{row.index}-{t.name}"}
    )
    t0 = time.perf_counter()
    res.sent_s = t0 - t_run
    resp = await ep.request(data, rec, cfg.timeout, t0)
    if rec.error_kind is None and resp.status != 200:
        rec.error = f"HTTP {resp.status}: " + bytes(resp.body[:MAX_ERROR_BODY]).decode(
            "utf-8", "replace"
        )
    elif rec.error_kind is None and not resp.seen_done:
        rec.error = "the stream ended without data: [DONE]"
    res.ok = rec.error is None and rec.error_kind is None and rec.ttft is not None
    res.error = None if res.ok else (rec.error or rec.error_kind or "no answer")
    rec.ok = res.ok
    res.client_ttft_s = rec.ttft
    res.output_tokens = rec.output_tokens or sum(rec.chunk_tokens)
    rec.output_tokens = res.output_tokens
    res.client_tpot_s = rec.tpot


class _Spans:
    """A TraceStore listener keeping this replay's spans by `<row>-<arm>`."""

    def __init__(self, since: float) -> None:
        self.since = since
        self.by_key: dict[str, TracedRequest] = {}

    def take(self, requests: Sequence[TracedRequest]) -> None:
        for r in requests:
            key = span_key(r.request_id)
            if key is not None and (r.arrived_at or r.finished_at) >= self.since:
                self.by_key[key] = r


def _prompt(seed: int, row: TraceRow) -> list[int]:
    rng = random.Random(f"paired/{seed}/{row.index}")
    return [rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(row.input_length)]


async def run_paired(
    cfg: PairedConfig,
    *,
    stop: asyncio.Event | None = None,
    on_row: Callable[[int, int], None] | None = None,
    scan: TraceScan | None = None,
    store: TraceStore | None = None,
) -> PairedOutcome:
    """Check the trace (whole, before sending; `scan` when the caller checked it already),
    replay it to both arms, join the spans, judge. The spans come from a receiver on
    `cfg.traces_port` for this replay, or from `store` (a receiver the caller keeps running,
    e.g. across many replays: an exporter keeps its connection to the receiver it first met)."""
    a, b = cfg.targets
    for t in cfg.targets:
        if not _ARM_NAME.match(t.name):
            raise InputError(
                f"target name {t.name!r}: a paired replay's arm names are letters, digits, "
                "_ and . only."
            )
    if a.name == b.name:
        raise InputError(
            "a paired replay needs two targets named apart, e.g. --target a=URL --target b=URL."
        )
    if cfg.speed <= 0 or not math.isfinite(cfg.speed):
        raise InputError(f"--replay-speed {cfg.speed!r} must be a number > 0.")
    contexts = [c for c in await asyncio.gather(*(_max_context(t) for t in cfg.targets)) if c]
    if scan is None:
        scan = scan_trace(cfg.trace)
    check_context(scan, min(contexts) if contexts else None)
    total = scan.rows if cfg.limit is None else min(scan.rows, cfg.limit)
    notes = list(scan.notes)
    stop = stop or asyncio.Event()
    receiver = OtlpReceiver(port=cfg.traces_port).start() if store is None else None
    store = receiver.store if receiver is not None else store
    assert store is not None
    spans = _Spans(time.time())
    store.listeners.append(spans.take)
    endpoints = {t.name: Endpoint(t.url, t.api_key) for t in cfg.targets}
    rows: list[PairedRow] = []
    tasks: set[asyncio.Task[None]] = set()
    stop_reason = None
    done = 0
    started = time.time()
    try:
        t_run = time.perf_counter()
        for row in iter_trace(cfg.trace, limit=total):
            due = row.at_s / cfg.speed
            await sleep_until(t_run + due, stop)
            if stop.is_set():
                stop_reason = "interrupted"
                break
            order = (a, b) if row.index % 2 == 0 else (b, a)
            pr = PairedRow(
                row.index, row.session, row.input_length, row.output_length, order[0].name
            )
            rows.append(pr)
            prompt = _prompt(cfg.seed, row)
            for t in order:
                res = pr.arms[t.name] = ArmResult(due)
                task = asyncio.create_task(
                    _send(endpoints[t.name], t, row, prompt, res, cfg, t_run)
                )
                tasks.add(task)

                def finished(task: asyncio.Task[None]) -> None:
                    nonlocal done
                    tasks.discard(task)
                    done += 1
                    if on_row is not None:
                        on_row(done, 2 * total)

                task.add_done_callback(finished)
        if tasks:
            waiter: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*tasks))
            stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
            await asyncio.wait((waiter, stopper), return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if not waiter.done():
                stop_reason = "interrupted"
                waiter.cancel()
                try:
                    await waiter
                except asyncio.CancelledError:
                    pass
        wanted = {f"{r.index}-{arm}" for r in rows for arm, x in r.arms.items() if x.ok}
        deadline = time.monotonic() + SPAN_WAIT_S
        while not wanted <= spans.by_key.keys() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        store.listeners.remove(spans.take)
        if receiver is not None:
            receiver.close()
        for ep in endpoints.values():
            ep.close()
    for r in rows:
        for arm, x in r.arms.items():
            x.span = spans.by_key.get(f"{r.index}-{arm}")
    if not spans.by_key:
        notes.append(
            f"no span of this replay arrived on 127.0.0.1:{cfg.traces_port}: are both servers "
            "started with --otlp-traces-endpoint pointing there ([metrics] traces)?"
        )
    return _judge(cfg, rows, notes, stop_reason, (started, time.time()))


# A row bootstrap sees only the noise inside one replay; twin servers differ from replay to replay
# by more than that (docs/results.md, paired A/A rows: 13 of 25 twin replays were called better or
# worse on the 2-core test box). A decision with no A/A calibration says so.
UNCALIBRATED = (
    "one replay judged without an A/A calibration: twin servers differ between replays by more "
    "than a row bootstrap sees (on a 2-core test box, 13 of 25 A/A replays were called better or "
    "worse this way); make A/A passes (`bench --paired --aa -o aaN.json`) through the same path "
    f"before and after this replay, {MIN_AA_PASSES} or more, and judge it with them: "
    "`bench --paired --judge THIS.json --aa-report aa1.json ...`"
)


def _judge(
    cfg: PairedConfig,
    rows: list[PairedRow],
    notes: list[str],
    stop_reason: str | None,
    ran: tuple[float, float] = (math.nan, math.nan),
) -> PairedOutcome:
    a, b = (t.name for t in cfg.targets)
    lags = [x.lag_ms for r in rows for x in r.arms.values() if not math.isnan(x.sent_s)]
    p50, p99 = percentile(lags, 50), percentile(lags, 99)
    on_time = p99 is not None and p99 <= cfg.max_lag_ms
    fidelity = {
        "late_p50_ms": p50,
        "late_p99_ms": p99,
        "late_max_ms": max(lags) if lags else None,
        "limit_p99_ms": cfg.max_lag_ms,
        "on_schedule": on_time,
    }
    ok = {arm: sum(1 for r in rows if r.arms[arm].ok) for arm in (a, b)}
    joined = {arm: sum(1 for r in rows if r.arms[arm].span is not None) for arm in (a, b)}
    joins = {"rows": len(rows)} | {f"{arm}_ok": ok[arm] for arm in (a, b)}
    joins |= {f"{arm}_joined": joined[arm] for arm in (a, b)}
    for arm in (a, b):
        failed = [r.arms[arm] for r in rows if not r.arms[arm].ok]
        if failed:
            notes.append(f"{arm}: {len(failed)} requests failed (first: {failed[0].error})")
    withheld = None
    if not rows:
        withheld = "no row was sent."
    elif not on_time:
        withheld = (
            f"the client could not keep the trace's schedule: sends were late by {p99:.0f} ms at "
            f"p99 (limit {cfg.max_lag_ms:g} ms); no figures are reported. Replay slower "
            "(--replay-speed below 1) or from a less loaded client."
        )
    elif not any(joined.values()):
        withheld = "no request joined its server span: the verdict reads the spans."
    verdict = None
    if not withheld:
        verdict = judge_rows(
            _per_row(rows, a, b),
            floor=cfg.floor,
            aa=cfg.aa,
            seed=cfg.seed,
            calibration=cfg.calibration,
        )
    said = [] if verdict is None else calibration_notes(verdict, ran, cfg.aa_times)
    return PairedOutcome(
        (a, b), rows, fidelity, joins, verdict, withheld, notes, stop_reason, cfg.seed, ran, said
    )


def calibration_notes(
    v: Verdict, ran: tuple[float, float], aa_times: Sequence[tuple[float, float]]
) -> list[str]:
    """What a decision on an A/B says about its A/A calibration: that it has none, or where
    its passes ran (measured: docs/results.md, paired A/A rows)."""
    if v.aa:
        return []
    if v.calibration is None:
        return [UNCALIBRATED] if v.decision in (BETTER, WORSE) else []
    note = bracket_note(ran, aa_times)
    return [] if note is None else [note]


def judge_again(
    doc: Any,
    *,
    floor: float,
    calibration: AaCalibration | None,
    aa_times: Sequence[tuple[float, float]] = (),
) -> tuple[Verdict, dict[str, Any]]:
    """A saved replay's report (`bench --paired -o`) judged again from its per-row figures,
    with this floor and calibration (e.g. A/A passes made before and after it); nothing is
    sent. The new verdict, and the report with it and its calibration notes in place of the old
    ones. ValueError names what the report lacks."""
    if not isinstance(doc, dict) or doc.get("kimictl_paired_replay") != 1:
        raise ValueError("it is not the JSON report of `kimictl bench --paired`")
    if doc.get("verdict") is None:
        raise ValueError(f"its replay has no verdict to judge again ({doc.get('withheld')})")
    rows = PerRow.from_json(doc.get("per_row"))
    v = judge_rows(
        rows,
        floor=floor,
        aa=bool(doc["verdict"].get("aa")),
        seed=int(doc.get("seed", 0)),
        calibration=calibration,
    )
    said = calibration_notes(v, report_ran(doc), aa_times)
    return v, doc | {"verdict": v.to_json(), "calibration_notes": said}


def report_ran(doc: dict[str, Any]) -> tuple[float, float]:
    """When a paired report's replay began and ended (unix s; nan where it does not say)."""
    ran = doc.get("ran") or {}
    start, end = (ran.get(k) for k in ("start_unix", "end_unix"))
    return (math.nan if start is None else float(start), math.nan if end is None else float(end))


def bracket_note(ran: tuple[float, float], passes: Sequence[tuple[float, float]]) -> str | None:
    """Where the A/A passes ran against the judged replay (`ran`, unix s): a calibration whose
    passes all lie on one side of it cannot see a drift between them and it; passes on both
    sides (a bracket) can. None when the times are unknown (reports without them)."""
    known = [p for p in passes if all(math.isfinite(t) for t in p)]
    if not known or not all(math.isfinite(t) for t in ran):
        return None
    before = sum(1 for _, end in known if end <= ran[0])
    after = sum(1 for start, _ in known if start >= ran[1])
    if before and after:
        return f"A/A calibration brackets this replay: {before} passes before it, {after} after"
    side = "before" if before else "after" if after else "during"
    return (
        f"all {len(known)} A/A passes ran {side} this replay: a drift of the two instances "
        f"since then is not in the calibration (docs/bench.md); make passes on its other side "
        "and judge again: `bench --paired --judge THIS.json --aa-report ...`"
    )


@dataclass(frozen=True)
class PerRow:
    """What the verdict reads of each row, per role (A, B): the span's interactivity (1 / TPOT)
    and TTFT (s), nan where the span is missing; the session where the trace had one. Kept in
    the report so that `judge_rows` gives the same verdict again later, or with a calibration
    made after the replay."""

    session: list[str | None]
    inter: tuple[list[float], list[float]]
    ttft: tuple[list[float], list[float]]

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "A": {"interactivity": self.inter[0], "ttft_s": self.ttft[0]},
            "B": {"interactivity": self.inter[1], "ttft_s": self.ttft[1]},
        }

    @classmethod
    def from_json(cls, doc: Any) -> PerRow:
        """From a report's `per_row` (orjson wrote nan as null); ValueError if malformed."""

        def col(v: Any) -> list[float]:
            return [math.nan if x is None else float(x) for x in v]

        try:
            n = len(doc["session"])
            got = cls(
                [None if s is None else str(s) for s in doc["session"]],
                (col(doc["A"]["interactivity"]), col(doc["B"]["interactivity"])),
                (col(doc["A"]["ttft_s"]), col(doc["B"]["ttft_s"])),
            )
        except (KeyError, TypeError, ValueError):
            raise ValueError("its per_row figures are missing or malformed") from None
        if any(len(c) != n for c in (*got.inter, *got.ttft)):
            raise ValueError("its per_row columns differ in length")
        return got


def _per_row(rows: Sequence[PairedRow], a: str, b: str) -> PerRow:
    def fig(r: PairedRow, arm: str, what: str) -> float:
        span = r.arms[arm].span
        if span is None:
            return math.nan
        if what == "inter":
            return 1.0 / span.tpot_s if span.tpot_s else math.nan
        return span.ttft_s if span.ttft_s else math.nan

    return PerRow(
        [r.session for r in rows],
        ([fig(r, a, "inter") for r in rows], [fig(r, b, "inter") for r in rows]),
        ([fig(r, a, "ttft") for r in rows], [fig(r, b, "ttft") for r in rows]),
    )


def judge_rows(
    rows: PerRow, *, floor: float, aa: bool, seed: int, calibration: AaCalibration | None
) -> Verdict:
    """The verdict on per-row figures: interactivity's paired log ratios, beside B/A of its
    p10/p50/p90 and of TTFT p50/p90, resampled by row or by session where the trace had any."""
    sessions = any(rows.session)
    clusters = [s or f"row-{i}" for i, s in enumerate(rows.session)] if sessions else None
    (inter_a, inter_b), (ttft_a, ttft_b) = rows.inter, rows.ttft
    figures: dict[str, BootstrapEstimate] = {}
    for p in (10, 50, 90):
        figures[f"interactivity_p{p}"] = quantile_ratio(
            inter_a, inter_b, p, clusters=clusters, seed=seed
        )
    for p in (50, 90):
        figures[f"ttft_p{p}"] = quantile_ratio(ttft_a, ttft_b, p, clusters=clusters, seed=seed)
    logs = [
        math.log(y / x) if x > 0 and y > 0 else math.nan
        for x, y in zip(inter_a, inter_b, strict=True)
    ]
    return paired_verdict(
        logs,
        floor=floor,
        clusters=clusters,
        metric="interactivity (per-request, spans)",
        aa=aa,
        seed=seed,
        figures=figures,
        calibration=calibration,
    )


def write_rows_csv(outcome: PairedOutcome, path: Path) -> Path:
    """One line per row: its lengths and session, then per arm the lateness, client and span
    figures (ms) and whether the span joined; last, the row's interactivity ratio B/A."""
    import csv
    import io

    from kimictl.core.outputs import save_or_keep

    a, b = outcome.arms
    cols = ["row", "session", "input_length", "output_length", "first"]
    per = ["late_ms", "ok", "client_ttft_ms", "client_tpot_ms", "span_ttft_ms", "span_tpot_ms",
           "span_queue_ms", "span_e2e_ms", "joined"]  # fmt: skip
    cols += [f"{arm}_{c}" for arm in (a, b) for c in per] + ["interactivity_ratio_b_a"]
    fh = io.StringIO()
    w = csv.writer(fh)
    w.writerow(cols)
    for r in outcome.rows:
        line: list[Any] = [r.index, r.session or "", r.input_length, r.output_length, r.first]
        tpots = []
        for arm in (a, b):
            x = r.arms[arm]
            s = x.span
            tpots.append(s.tpot_s if s is not None else None)
            line += [
                f"{x.lag_ms:.3f}",
                int(x.ok),
                _fmt(_ms(x.client_ttft_s)),
                _fmt(_ms(x.client_tpot_s)),
                _fmt(_ms(s.ttft_s if s else None)),
                _fmt(_ms(s.tpot_s if s else None)),
                _fmt(_ms(s.queue_s if s else None)),
                _fmt(_ms(s.e2e_s if s else None)),
                int(s is not None),
            ]
        ta, tb = tpots
        line.append(_fmt(ta / tb if ta and tb else None))
        w.writerow(line)
    return save_or_keep(path, fh.getvalue(), flag="--csv")


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"


def write_ratio_plot(outcome: PairedOutcome, path: Path) -> Path:
    """A histogram of the per-request interactivity ratios B/A (log scale), with the floor band
    and the verdict's interval."""
    import io

    from kimictl.core.errors import InputError as _InputError
    from kimictl.core.outputs import save_or_keep

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise _InputError(
            "--plot needs matplotlib, which is not installed", hint="pip install matplotlib"
        ) from None
    a, b = outcome.arms
    ratios = []
    for r in outcome.rows:
        sa, sb = r.arms[a].span, r.arms[b].span
        ta, tb = (sa.tpot_s if sa else None), (sb.tpot_s if sb else None)
        if ta and tb:
            ratios.append(ta / tb)
    fig, ax = plt.subplots(figsize=(7, 4))
    if ratios:
        lo, hi = min(ratios), max(ratios)
        edges = [lo * (hi / lo) ** (i / 40) for i in range(41)] if hi > lo else 20
        ax.hist(ratios, bins=edges, color="#4477aa")
        ax.set_xscale("log")
    v = outcome.verdict
    if v is not None:
        ax.axvspan(
            1 / (1 + v.floor),
            1 + v.floor,
            color="#dddddd",
            alpha=0.5,
            label=f"floor ±{v.floor:.0%}",
        )
        ax.axvline(v.ratio, color="black", label=f"B/A {v.ratio:.3f}")
        ax.axvline(v.lo, color="black", ls="--")
        ax.axvline(v.hi, color="black", ls="--", label="95% interval")
        ax.set_title(v.decision)
    ax.set_xlabel(f"per-request interactivity ratio {b}/{a} (spans)")
    ax.set_ylabel("requests")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return save_or_keep(path, buffer.getvalue(), flag="--plot")
