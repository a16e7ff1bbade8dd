"""Make a running server deliberately slow or dead: SIGSTOP/SIGCONT on its whole process group
(vLLM's API server and its engine core), found by port in kimictl's run records.

    slow = DutyCycle(pgid_of_port(33521), stopped=0.5, period=0.2)  # stopped half the time
    with slow: ...                                                # SIGCONT on exit, always
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

from kimictl.core.paths import runs_dir


def pgid_of_port(port: int) -> int:
    """The process group of the kimictl-started server listening on `port`."""
    for record in runs_dir().glob("*/run.json"):
        try:
            doc = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if doc.get("port") == port and doc.get("pgid"):
            try:
                os.killpg(int(doc["pgid"]), 0)
            except ProcessLookupError:
                continue
            return int(doc["pgid"])
    raise LookupError(f"no running kimictl server on port {port}")


class DutyCycle:
    """Stop the group for `stopped` of every `period` seconds (stopped=1: stopped throughout)."""

    def __init__(self, pgid: int, *, stopped: float, period: float = 0.2) -> None:
        self.pgid, self.stopped, self.period = pgid, stopped, period
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        off, on = self.period * self.stopped, self.period * (1 - self.stopped)
        with contextlib.suppress(ProcessLookupError):  # the group is gone: nothing to slow
            while not self._halt.is_set():
                os.killpg(self.pgid, signal.SIGSTOP)
                self._halt.wait(off)
                os.killpg(self.pgid, signal.SIGCONT)
                if on:
                    self._halt.wait(on)

    def __enter__(self) -> DutyCycle:
        if self.stopped >= 1:
            os.killpg(self.pgid, signal.SIGSTOP)
        elif self.stopped > 0:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(ProcessLookupError):  # serve took a hung server down
            os.killpg(self.pgid, signal.SIGCONT)
        time.sleep(0.05)
