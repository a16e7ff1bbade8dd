"""A capture: what a traced server served, written as a Mooncake JSONL trace (no text).

`kimictl monitor --capture FILE` hangs a `CaptureWriter` on its `otlp.TraceStore` (the store's
`listeners`): every finished request's span becomes one row

    {"timestamp": MS, "input_length": N, "output_length": M, "request_id": ..., "server": ...,
     "arm": ..., "session_id": ...}

`timestamp` is vLLM's arrival time (the span's start) in whole milliseconds from the capture's
first row; `input_length` / `output_length` are the span's prompt and completion tokens;
`request_id` is vLLM's (`cmpl-<X-Request-Id>-0`, `chatcmpl-<X-Request-Id>`); `server` the span's
`service.instance.id`; `arm` the monitor's name of that server; `session_id` the W3C trace id of
the client's `traceparent` header (SESSION_HEADER), present only where the client sent one
(vLLM's span continues the client's trace; there is no other way a span carries a session). No
`hash_ids`: a span has token counts, not tokens, so prefix sharing is not in a capture.

kimictl's own requests (readiness probe, heartbeat, validate, bench's warm-up: `http1.
is_own_request`) are never written. Spans arrive in finish order, a trace is in arrival order:
rows wait `hold_s` seconds (longer than any request lasts) before they are written in arrival
order; a span that arrives later than that for a row already written is counted as `late`, not
written out of order. Files roll at `max_rows` rows (`FILE`, `FILE.001.jsonl`, ...; every file
is a whole trace on the one clock), at most `max_files`, then the capture stops and says so.
No file that exists is ever opened: the next name is taken only if it is free.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from kimictl.core.http1 import is_own_request
from kimictl.runtime.observe.otlp import TracedRequest

__all__ = [
    "SESSION_HEADER",
    "CaptureWriter",
    "capture_row",
    "check_capture_target",
    "rolled_name",
]

SESSION_HEADER = "traceparent"
DEFAULT_HOLD_S = 330.0  # bench's request timeout (300 s) and the exporter's delay, with room
DEFAULT_MAX_ROWS = 1_000_000  # per file: about 130 MB of rows
DEFAULT_MAX_FILES = 100


def check_capture_target(path: Path) -> Path:
    """A capture writes new files only: FILE must end in .jsonl, its folder exist, and neither
    it nor its first rolled name exist (one `error:` sentence, exit 2, otherwise)."""
    from kimictl.core.outputs import check_new_file

    target = check_new_file(path, flag="--capture", suffix=".jsonl", forceable=False)
    check_new_file(rolled_name(target, 1), flag="--capture", forceable=False)
    return target


def rolled_name(path: Path, n: int) -> Path:
    """The n-th file of a capture: FILE itself, then FILE.001.jsonl, FILE.002.jsonl, ..."""
    return path if n == 0 else path.with_name(f"{path.stem}.{n:03d}{path.suffix}")


def capture_row(r: TracedRequest, *, t0: float, arm: str | None) -> dict[str, Any] | None:
    """One span as a trace row (None for a span without arrival time or token counts)."""
    if r.arrived_at is None or r.prompt_tokens is None or r.output_tokens is None:
        return None
    row: dict[str, Any] = {
        "timestamp": int(round((r.arrived_at - t0) * 1000.0)),
        "input_length": r.prompt_tokens,
        "output_length": r.output_tokens,
        "request_id": r.request_id,
        "server": r.server,
    }
    if arm:
        row["arm"] = arm
    if r.session_id:
        row["session_id"] = r.session_id
    return row


@dataclass
class CaptureWriter:
    """Rows from a TraceStore's listener thread to rolling JSONL files, in arrival order."""

    path: Path
    arm_of: Callable[[str], str | None] = lambda server: None
    hold_s: float = DEFAULT_HOLD_S
    max_rows: int = DEFAULT_MAX_ROWS
    max_files: int = DEFAULT_MAX_FILES
    clock: Callable[[], float] = time.time  # wall clock, as the spans' times
    rows: int = 0  # written, all files
    own: int = 0  # kimictl's own requests left out
    late: int = 0  # arrived after later rows were written: left out
    skipped: int = 0  # spans without arrival or token counts
    files: list[Path] = field(default_factory=list)
    stopped: str | None = None  # why the capture no longer writes
    _held: list[tuple[float, int, TracedRequest]] = field(default_factory=list)
    _seq: int = 0
    _t0: float | None = None
    _written_to: float = float("-inf")  # arrival time of the newest row written
    _handle: IO[bytes] | None = None
    _in_file: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, requests: Sequence[TracedRequest]) -> None:
        """A TraceStore listener: hold the batch, write what is old enough."""
        with self._lock:
            for r in requests:
                if is_own_request(r.request_id):
                    self.own += 1
                elif r.arrived_at is None or r.prompt_tokens is None or r.output_tokens is None:
                    self.skipped += 1
                elif r.arrived_at < self._written_to:
                    self.late += 1
                else:
                    self._seq += 1
                    heapq.heappush(self._held, (r.arrived_at, self._seq, r))
            self._flush(self.clock() - self.hold_s)

    def flush(self, now: float | None = None) -> None:
        """Write every held row that arrived more than hold_s before `now`."""
        with self._lock:
            self._flush((self.clock() if now is None else now) - self.hold_s)

    def close(self) -> None:
        """Write every held row (the capture ends: nothing can arrive before them now)."""
        with self._lock:
            self._flush(float("inf"))
            if self._handle is not None:
                self._handle.close()
                self._handle = None

    def status(self) -> dict[str, Any]:
        return {
            "files": [str(p) for p in self.files],
            "rows": self.rows,
            "held": len(self._held),
            "own_left_out": self.own,
            "late_left_out": self.late,
            "skipped": self.skipped,
            "stopped": self.stopped,
            "hash_ids": False,
            "session_header": SESSION_HEADER,
        }

    def _flush(self, upto: float) -> None:
        while self._held and self._held[0][0] <= upto:
            _, _, r = heapq.heappop(self._held)
            if self.stopped:
                continue
            if self._t0 is None:
                self._t0 = r.arrived_at
            assert self._t0 is not None and r.arrived_at is not None
            row = capture_row(r, t0=self._t0, arm=self.arm_of(r.server))
            if row is None:
                continue
            handle = self._file()
            if handle is None:
                continue
            handle.write(orjson.dumps(row) + b"\n")
            self._written_to = r.arrived_at
            self._in_file += 1
            self.rows += 1
        if self._handle is not None:
            self._handle.flush()

    def _file(self) -> IO[bytes] | None:
        if self._handle is not None and self._in_file < self.max_rows:
            return self._handle
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if len(self.files) >= self.max_files:
            self.stopped = f"{self.max_files} files of {self.max_rows} rows written"
            return None
        target = rolled_name(self.path, len(self.files))
        try:
            self._handle = target.open("xb")  # never an existing file
        except OSError as exc:
            self.stopped = f"cannot create {target}: {exc.strerror or exc}"
            return None
        self.files.append(target)
        self._in_file = 0
        return self._handle
