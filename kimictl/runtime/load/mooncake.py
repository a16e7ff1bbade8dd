"""A Mooncake JSONL trace read for a paired replay: checked whole before anything is sent, then
streamed row by row (a million-row trace is never held in memory).

Each line is one request: `timestamp` (ms from the trace's start, non-decreasing: a trace is in
arrival order), `input_length` and `output_length` (whole numbers >= 1), optional `session_id`
(and `request_id`, `server`, `arm`, as a kimictl capture writes them). `hash_ids` are accepted and
not used (the replay sends seeded random tokens). Text fields (`text_input`, `prompt`,
`messages`, `payload`) are ignored, said once: a replay sends lengths, never text.
Every refusal is one sentence naming FILE:LINE (InputError, exit 2).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from kimictl.core.errors import InputError

__all__ = ["TEXT_FIELDS", "TraceRow", "TraceScan", "check_context", "iter_trace", "scan_trace"]

TEXT_FIELDS = ("text_input", "prompt", "messages", "payload", "text")


@dataclass(frozen=True, slots=True)
class TraceRow:
    index: int  # 0-based row number (blank lines not counted)
    line: int  # 1-based line in the file
    at_s: float  # seconds from the first row
    input_length: int
    output_length: int
    session: str | None


@dataclass
class TraceScan:
    """What the checking pass learnt: rows, span of time, the longest request, notes to say."""

    path: Path
    rows: int = 0
    duration_s: float = 0.0
    longest: int = 0  # input + output tokens of the longest row
    longest_line: int = 0  # its line
    sessions: int = 0
    notes: list[str] = field(default_factory=list)


def _whole(row: dict[str, Any], key: str, where: str) -> int:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        else:
            shown = "missing" if v is None else repr(v)
            raise InputError(f"{where}: `{key}` must be a whole number >= 1, got {shown}.")
    if v < 1:
        raise InputError(f"{where}: `{key}` must be a whole number >= 1, got {v}.")
    return v


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    if not path.is_file():
        raise InputError(f"trace {str(path)!r} does not exist (or is not a file).")
    with path.open("rb") as handle:
        for n, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                raise InputError(
                    f"{path}:{n}: not a JSON object (a trace has one per line)."
                ) from None
            if not isinstance(row, dict):
                raise InputError(f"{path}:{n}: not a JSON object (a trace has one per line).")
            yield n, row


def _parse(path: Path, n: int, index: int, row: dict[str, Any], t0: float | None) -> TraceRow:
    where = f"{path}:{n}"
    ts = row.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        shown = "missing" if ts is None else repr(ts)
        raise InputError(
            f"{where}: `timestamp` (ms from the trace's start) must be a number, got {shown}."
        )
    if "input_length" not in row and any(k in row for k in TEXT_FIELDS):
        raise InputError(f"{where}: no `input_length`; kimictl replays lengths, not text.")
    n_in = _whole(row, "input_length", where)
    n_out = _whole(row, "output_length", where)
    session = row.get("session_id")
    at = float(ts) / 1000.0 - (float(ts) / 1000.0 if t0 is None else t0)
    return TraceRow(index, n, at, n_in, n_out, None if session is None else str(session))


def scan_trace(path: str | Path, *, max_context: int | None = None) -> TraceScan:
    """Check every row (streamed): JSON objects, numbers where numbers go, timestamps in order,
    lengths >= 1 and, with `max_context`, input + output within the model's context."""
    p = Path(path)
    scan = TraceScan(p)
    t0: float | None = None
    prev: float | None = None
    sessions: set[str] = set()
    text_seen = False
    for n, row in _rows(p):
        r = _parse(p, n, scan.rows, row, t0)
        ts = float(row["timestamp"])
        if t0 is None:
            t0 = ts / 1000.0
        if prev is not None and ts < prev:
            raise InputError(
                f"{p}:{n}: timestamp {ts:g} ms is before the previous row's {prev:g} ms; a trace "
                "is in arrival order (sort it by timestamp)."
            )
        prev = ts
        total = r.input_length + r.output_length
        if not text_seen and any(k in row for k in TEXT_FIELDS):
            text_seen = True
            scan.notes.append(
                f"{p}: text fields ({', '.join(k for k in TEXT_FIELDS if k in row)}) are ignored: "
                "the replay sends lengths, never text."
            )
        if r.session is not None and len(sessions) < 100_000:
            sessions.add(r.session)
        scan.rows += 1
        scan.duration_s = r.at_s
        if total > scan.longest:
            scan.longest, scan.longest_line = total, n
    if not scan.rows:
        raise InputError(f"{p}: the trace has no rows.")
    check_context(scan, max_context)
    scan.sessions = len(sessions)
    return scan


def check_context(scan: TraceScan, max_context: int | None) -> None:
    """InputError at the first longest row when it does not fit the model's context."""
    if max_context is not None and scan.longest > max_context:
        raise InputError(
            f"{scan.path}:{scan.longest_line}: input_length + output_length = {scan.longest} "
            f"tokens is over the model's context of {max_context} tokens."
        )


def iter_trace(path: str | Path, *, limit: int | None = None) -> Iterator[TraceRow]:
    """The rows of a trace `scan_trace` accepted, one at a time (the first `limit` only)."""
    p = Path(path)
    t0: float | None = None
    index = 0
    for n, row in _rows(p):
        if limit is not None and index >= limit:
            return
        r = _parse(p, n, index, row, t0)
        if t0 is None:
            t0 = float(row["timestamp"]) / 1000.0
        yield r
        index += 1
