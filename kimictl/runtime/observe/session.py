"""One monitor session, as `kimictl monitor` asks for it: the options checked together, then the
pollers, the history they keep and the trace receiver they share.

`MonitorRequest.open(targets)` returns a `MonitorSession` to run headless (`watch`) or hand to the
TUI; closing it stops the receiver. Bounds a CLI parser states (the interval's range, a TCP port)
are the command's own; what is left (a finite number, an option that needs another) is here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kimictl.core.errors import InputError
from kimictl.deployment.traces import DEFAULT_TRACES_PORT

if TYPE_CHECKING:
    from kimictl.runtime.observe.capture import CaptureWriter
    from kimictl.runtime.observe.judge import LiveJudge
    from kimictl.runtime.observe.otlp import OtlpReceiver
    from kimictl.runtime.observe.poller import EndpointPoller

__all__ = ["MonitorRequest", "MonitorSession", "NamedEndpoint", "history_keep_s"]

# The history a poller keeps: the charts' span (5 min), and more when the window is longer.
MIN_HISTORY_S = 330.0


class NamedEndpoint(Protocol):
    """An endpoint to watch (serving.runs.Target reads so): a name, a URL, its model if known."""

    @property
    def name(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def model(self) -> str | None: ...


def history_keep_s(window_s: float, interval: float) -> float:
    """Seconds of scrapes and spans to keep: the window, with room for a scrape at each end."""
    return max(MIN_HISTORY_S, window_s * 1.1 + 2 * interval)


@dataclass(frozen=True, kw_only=True)
class MonitorRequest:
    """The monitor options as the user gave them, checked when made (InputError for a bad mix of
    options or a bad --record FILE); `open()` starts the session."""

    window: str = "10s"
    interval: float = 1.0
    once: bool = False
    json: bool = False
    no_tui: bool = False
    duration: float | None = None
    slo_interactivity: float | None = None
    record: Path | None = None
    traces: bool = True
    traces_port: int = DEFAULT_TRACES_PORT
    capture: Path | None = None  # --capture FILE (observe.capture)
    canary: float | None = None  # judge a live canary: PCT% of requests on tuned (observe.judge)
    shadow: float | None = None  # judge a live shadow: PCT% of stock's requests copied to tuned
    window_s: float = field(init=False)  # --window in seconds

    def __post_init__(self) -> None:
        object.__setattr__(self, "window_s", self._check())

    @property
    def headless(self) -> bool:
        return self.once or self.no_tui

    def _check(self) -> float:
        from kimictl.runtime.observe.poller import check_record_target
        from kimictl.runtime.observe.window import parse_window

        window_s = parse_window(self.window)
        # `not 0 < x < inf` also refuses nan, which compares false with everything
        slo = self.slo_interactivity
        if slo is not None and not 0 < slo < math.inf:
            raise InputError(f"--slo-interactivity {slo:g} must be > 0 tokens/s/user.")
        if self.duration is not None and not 0 < self.duration < math.inf:
            raise InputError(
                f"--duration {self.duration:g} must be a finite number of seconds > 0."
            )
        if self.json and not self.headless:
            raise InputError("--json needs --once or --no-tui (the TUI is a screen, not JSON).")
        if self.record is not None:
            check_record_target(self.record)
        if self.capture is not None:
            from kimictl.runtime.observe.capture import check_capture_target

            if not self.traces:
                raise InputError("--capture reads the servers' trace spans: drop --no-traces.")
            check_capture_target(self.capture)
        if self.canary is not None and self.shadow is not None:
            raise InputError(
                "--canary and --shadow judge different set-ups (a split, a copy); give one."
            )
        if (self.canary is not None or self.shadow is not None) and not self.traces:
            flag = "--canary" if self.canary is not None else "--shadow"
            raise InputError(f"{flag} judges from per-request spans; drop --no-traces.")
        return window_s

    def open(self, targets: Sequence[NamedEndpoint]) -> MonitorSession:
        """Pollers for `targets` and, with traces, a receiver on 127.0.0.1:traces_port (a taken
        port becomes the receiver's `reason`: the figures come from histograms then)."""
        from kimictl.runtime.observe.poller import EndpointPoller
        from kimictl.runtime.observe.window import MetricsSeries

        keep_s = history_keep_s(self.window_s, self.interval)
        receiver = None
        if self.traces:
            from kimictl.runtime.observe.otlp import OtlpReceiver, TraceStore

            receiver = OtlpReceiver(port=self.traces_port, store=TraceStore(keep_s=keep_s))
            if self.capture is None:
                receiver.try_start()
        writer = None
        try:
            pollers = [
                EndpointPoller(
                    t.name,
                    t.url,
                    t.model,
                    series=MetricsSeries(keep_s=keep_s),
                    traces=receiver.store if receiver is not None else None,
                )
                for t in targets
            ]
            if self.capture is not None and receiver is not None:
                writer = _capture(self.capture, targets, receiver)
                receiver.start()  # a capture without its receiver records nothing: fail now
            judge = self._judge(targets)
        except BaseException:
            if receiver is not None:
                receiver.close()
            raise
        return MonitorSession(self, pollers, receiver, capture=writer, judge=judge)

    def _judge(self, targets: Sequence[NamedEndpoint]) -> LiveJudge | None:
        """The live judge of --canary/--shadow: tuned against stock (observe.judge)."""
        if self.canary is None and self.shadow is None:
            return None
        from kimictl.runtime.observe.judge import CANARY, SHADOW, Arm, LiveJudge
        from kimictl.runtime.observe.poller import ab_pair_of

        by_name = {t.name: t for t in targets}
        pair = ab_pair_of(list(by_name))
        flag = "--canary" if self.canary is not None else "--shadow"
        if pair is None:
            raise InputError(
                f"{flag} compares two endpoints, tuned and stock; got {', '.join(by_name)}.",
                hint="name them: kimictl monitor tuned=URL stock=URL (or start `serve --ab`).",
            )
        tuned, stock = (Arm(n, by_name[n].url) for n in pair)
        if self.canary is not None:
            return LiveJudge(mode=CANARY, pct=self.canary, tuned=tuned, stock=stock)
        assert self.shadow is not None
        return LiveJudge(mode=SHADOW, pct=self.shadow, tuned=tuned, stock=stock)


def _capture(path: Path, targets: Sequence[NamedEndpoint], receiver: OtlpReceiver) -> CaptureWriter:
    """A CaptureWriter on the receiver's store, naming each server by its monitor target."""
    from kimictl.runtime.observe.capture import CaptureWriter
    from kimictl.runtime.observe.otlp import server_key_matches

    def arm_of(server: str) -> str | None:
        for t in targets:
            if server_key_matches(server, url=t.url, name=t.name):
                return t.name
        return None

    writer = CaptureWriter(path, arm_of=arm_of)
    receiver.store.listeners.append(writer.take)
    return writer


@dataclass
class MonitorSession:
    """What a monitor runs: the pollers and the receiver (closed by `close()` or `with`)."""

    request: MonitorRequest
    pollers: list[EndpointPoller]
    receiver: OtlpReceiver | None
    capture: CaptureWriter | None = None
    on_close: Callable[[str], None] | None = None  # told what the capture wrote
    judge: LiveJudge | None = None

    @property
    def judge_look(self) -> Callable[[], Mapping[str, Any]] | None:
        """One look of the live judge at the received spans (None without a judge)."""
        judge, receiver = self.judge, self.receiver
        if judge is None or receiver is None:
            return None
        store = receiver.store
        return lambda: judge.look(store)

    @property
    def traces_status(self) -> Callable[[], Mapping[str, Any]] | None:
        receiver, writer = self.receiver, self.capture
        if receiver is None:
            return None
        if writer is None:
            return receiver.status
        return lambda: dict(receiver.status()) | {"capture": writer.status()}

    @property
    def run_for(self) -> float | None:
        """Seconds of headless polling: --once until the scrapes span one window (giving up a
        little after it), else --duration (None: until interrupted)."""
        if self.request.once:
            return self.request.window_s + max(5.0, 3 * self.request.interval)
        return self.request.duration

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
        writer = self.capture
        if writer is not None:
            self.capture = None
            writer.close()
            if self.on_close is not None:
                files = ", ".join(map(str, writer.files)) or "no file"
                self.on_close(
                    f"capture: {writer.rows} rows in {files} ({writer.own} of kimictl's own "
                    f"requests and {writer.late} late spans left out)"
                )

    def __enter__(self) -> MonitorSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
