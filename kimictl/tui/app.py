"""The `kimictl monitor` screen: one column per endpoint, A/B ratio, history charts, GPU strip.

Polling never blocks drawing: `set_interval` triggers an exclusive async worker that scrapes all
endpoints concurrently (timeout <= interval) and posts `MetricsUpdated`; the handler feeds the
widgets. A failed scrape marks the endpoint DOWN (reason, backoff) and keeps its history.
The keys only set state (`paused`, `interval`, `window_s` are reactive); the `watch_*` methods
redraw and restart the timer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Footer, Header, Static
from textual.worker import Worker, WorkerState

from kimictl.core.outputs import atomic_write
from kimictl.runtime.observe.gpu_telemetry import GpuTelemetry, sample_gpus
from kimictl.runtime.observe.poller import (
    EndpointPoller,
    EndpointView,
    ab_pair_of,
    append_jsonl,
    monitor_snapshot,
    poll_all,
)
from kimictl.runtime.observe.window import WINDOWS_S, ab_ratios, format_window
from kimictl.tui.rows import judge_lines, traces_line
from kimictl.tui.widgets import (
    SERIES_STYLES,
    ChartsPanel,
    FiguresTable,
    GpuStrip,
    Series,
    StatusLine,
)

__all__ = ["INTERVALS_S", "MetricsUpdated", "MonitorApp"]

INTERVALS_S = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)

HELP = """\
[b]kimictl monitor[/b]

  p      pause / resume polling
  + / -  poll faster / slower (0.25 s .. 10 s)
  w      switch window: 10s -> 1m -> 5m
  e      export the current snapshot as JSON (into the current folder)
  ?      this help
  q      quit

Figures are windowed: differences of counters and histogram buckets
between two scrapes, never since-start averages.
Interactivity = tokens/s/user = 1/TPOT per request. Its p10 is the slow
tail (= 1000 / TPOT p90 ms), the one an SLO protects.
Chart bars: one per scrape, the figure over the 10 s before it.
Ratio column = tuned / stock: green = better, red = worse.

[dim]press any key to close[/dim]"""


class MetricsUpdated(Message):
    """One polling round finished: fresh views of every endpoint, and the GPUs."""

    def __init__(self, views: list[EndpointView], gpus: GpuTelemetry) -> None:
        super().__init__()
        self.views = views
        self.gpus = gpus


class HelpScreen(ModalScreen[None]):
    def compose(self) -> ComposeResult:
        yield Static(HELP)

    def on_key(self) -> None:
        self.dismiss(None)


class MonitorApp(App[None]):
    CSS_PATH = "monitor.tcss"
    TITLE = "kimictl monitor"
    BINDINGS = [
        Binding("p", "pause", "pause"),
        Binding("plus,equals_sign", "faster", "faster"),
        Binding("minus", "slower", "slower"),
        Binding("w", "window", "window"),
        Binding("e", "export", "export"),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
    ]

    # state the keys change; watch_* below redraws (init=False: on_ready draws the first time)
    paused: reactive[bool] = reactive(False, init=False)
    interval: reactive[float] = reactive(1.0, init=False)
    window_s: reactive[float] = reactive(10.0, init=False)

    def __init__(
        self,
        pollers: list[EndpointPoller],
        *,
        interval: float = 1.0,
        window_s: float = 10.0,
        slo_interactivity: float | None = None,
        record: Path | None = None,
        export_dir: Path | None = None,
        gpu_sampler: Any = sample_gpus,
        traces_status: Callable[[], Mapping[str, Any]] | None = None,
        judge: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.judge = judge  # the live judge's look (monitor --canary/--shadow)
        self.judged: Mapping[str, Any] | None = None
        self.pollers = pollers
        self.set_reactive(MonitorApp.interval, interval)
        self.set_reactive(MonitorApp.window_s, window_s)
        self.slo = slo_interactivity
        self.record = record
        self.export_dir = export_dir or Path.cwd()
        self.gpu_sampler = gpu_sampler
        self.traces_status = traces_status
        self.ab = ab_pair_of([p.name for p in pollers])
        self.views: list[EndpointView] = []
        self.gpus: GpuTelemetry | None = None
        self.rounds = 0
        self._timer: Timer | None = None
        self._busy = False
        self.last_export: Path | None = None

    # ---- layout
    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="body"):
            yield StatusLine(id="status")
            yield FiguresTable(id="figures")
            yield ChartsPanel(id="charts")
            yield GpuStrip(id="gpus")
        yield Footer()

    def on_ready(self) -> None:
        # on_ready, not on_mount: the widgets exist before the first round lands
        self._update_subtitle()
        self._restart_timer()
        self.poll_now()

    async def on_unmount(self) -> None:
        for poller in self.pollers:
            poller.close()

    def _restart_timer(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_interval(self.interval, self._tick)

    def _tick(self) -> None:
        if not self.paused and not self._busy:
            self.poll_now()

    def _update_subtitle(self) -> None:
        state = "PAUSED · " if self.paused else ""
        self.sub_title = (
            f"{state}window {format_window(self.window_s)} · every {self.interval:g}s"
            + (f" · SLO interactivity p10 >= {self.slo:g}" if self.slo is not None else "")
        )

    # ---- polling
    @work(exclusive=True, group="poll", exit_on_error=False, description="scrape /metrics")
    async def poll_now(self) -> None:
        self._busy = True
        try:
            await poll_all(self.pollers, interval=self.interval)
            views = [p.view(self.window_s, interval=self.interval) for p in self.pollers]
            gpus = self.gpu_sampler()
        finally:
            self._busy = False
        self.post_message(MetricsUpdated(views, gpus))

    @on(Worker.StateChanged)
    def _on_worker_state(self, event: Worker.StateChanged) -> None:
        # the one place a failed round is handled: say so, keep the screen, poll again next tick
        if event.state is WorkerState.ERROR and event.worker.group == "poll":
            error = event.worker.error
            self.notify(
                f"polling failed: {type(error).__name__}: {error}",
                title="kimictl monitor",
                severity="error",
            )

    @on(MetricsUpdated)
    def _on_metrics(self, message: MetricsUpdated) -> None:
        self.views = message.views
        self.gpus = message.gpus
        self.judged = self.judge() if self.judge is not None else None
        self.rounds += 1
        self._render_views()
        if self.record is not None:
            append_jsonl(self.record, self.snapshot())

    def _views_now(self) -> list[EndpointView]:
        return [p.view(self.window_s, interval=self.interval) for p in self.pollers]

    def _render_views(self) -> None:
        views = self.views
        try:
            status = self.query_one(StatusLine)
        except NoMatches:  # another screen (help) is on top, or the app is closing
            status = None
        if status is None:
            return
        traces = self.traces_status() if self.traces_status is not None else None
        status.show(views, self.slo, traces_line(traces), judge_lines(self.judged))
        ratios = None
        if self.ab is not None:
            by = {v.name: v for v in views}
            t, s = by.get(self.ab[0]), by.get(self.ab[1])
            ratios = ab_ratios(t.stats if t else None, s.stats if s else None)
        self.query_one(FiguresTable).show(views, ratios, self.ab, format_window(self.window_s))
        tps_max = 1.0
        int_max = self.slo * 1.2 if self.slo else 1.0
        for v in views:
            for h in v.history:
                tps_max = max(tps_max, h.tokens_per_s or 0.0)
                int_max = max(int_max, h.interactivity_p10 or 0.0)
        tps, inter = [], []
        for i, v in enumerate(views):
            style = SERIES_STYLES[i % len(SERIES_STYLES)]
            tps.append(Series(f"{v.name} tokens/s", style, [h.tokens_per_s for h in v.history]))
            inter.append(
                Series(
                    f"{v.name} p10 tok/s/user",
                    style,
                    [h.interactivity_p10 for h in v.history],
                )
            )
        self.query_one(ChartsPanel).set_data(
            [(tps, tps_max * 1.05, None), (inter, int_max * 1.05, self.slo)]
        )
        self.query_one(GpuStrip).show(self.gpus)

    def snapshot(self) -> dict[str, Any]:
        return monitor_snapshot(
            self.views,
            window_s=self.window_s,
            ab=self.ab,
            gpus=self.gpus.to_json() if self.gpus is not None else None,
            traces=self.traces_status() if self.traces_status is not None else None,
            judge=self.judged,
        )

    # ---- state: the watchers redraw; the keys only set it
    def watch_paused(self) -> None:
        self._update_subtitle()

    def watch_interval(self) -> None:
        self._restart_timer()
        self._update_subtitle()

    def watch_window_s(self) -> None:
        self._update_subtitle()
        if self.views:
            self.views = self._views_now()
            self._render_views()

    # ---- keys
    def action_pause(self) -> None:
        self.paused = not self.paused

    def action_faster(self) -> None:
        faster = [s for s in INTERVALS_S if s < self.interval - 1e-9]
        if faster:
            self.interval = faster[-1]

    def action_slower(self) -> None:
        slower = [s for s in INTERVALS_S if s > self.interval + 1e-9]
        if slower:
            self.interval = slower[0]

    def action_window(self) -> None:
        later = [w for w in WINDOWS_S if w > self.window_s]
        self.window_s = later[0] if later else WINDOWS_S[0]

    def action_export(self) -> None:
        import orjson

        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = self.export_dir / f"kimictl-monitor-{stamp}.json"
        atomic_write(path, orjson.dumps(self.snapshot(), option=orjson.OPT_INDENT_2))
        self.last_export = path
        self.notify(f"snapshot written to {path}", title="export")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())
