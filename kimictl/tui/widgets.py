"""Widgets of the monitor screen. They are fed (reactive data set by the app), never fetching."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.widget import Widget
from textual.widgets import Static

from kimictl.runtime.gpu_telemetry import GpuTelemetry
from kimictl.runtime.metrics import HIGHER_IS_BETTER, EndpointStatus, EndpointView
from kimictl.tui.rows import ROWS, fmt, fmt_ratio

__all__ = ["FiguresTable", "GpuStrip", "HistoryChart", "StatusLine"]

_BLOCKS = " ▁▂▃▄▅▆▇█"
SERIES_STYLES = ("cyan", "magenta", "yellow", "blue", "green", "red")


def _clock(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%H:%M:%S", time.localtime(ts))


def status_text(view: EndpointView, style: str) -> Text:
    text = Text()
    text.append(f"■ {view.name} ", style=f"bold {style}")
    if view.status is EndpointStatus.UP:
        text.append("UP", style="bold green")
    elif view.status is EndpointStatus.DOWN:
        text.append("DOWN", style="bold white on red")
        text.append(f" {view.reason or ''}", style="red")
        if view.next_try_in_s is not None:
            text.append(f" · retry in {view.next_try_in_s:.0f}s", style="dim")
    else:
        text.append("CONNECTING", style="yellow")
    if view.stale_since is not None:
        text.append(f" · stale since {_clock(view.stale_since)}", style="bold yellow")
    stats = view.stats
    if stats is not None and stats.resets:
        text.append(" · restarted in window", style="yellow")
    text.append(f"  {view.url}", style="dim")
    return text


class StatusLine(Static):
    """UP/DOWN lines, one per endpoint."""

    def show(self, views: Sequence[EndpointView]) -> None:
        lines = Text("\n").join(
            status_text(v, SERIES_STYLES[i % len(SERIES_STYLES)]) for i, v in enumerate(views)
        )
        self.update(lines)


class FiguresTable(Static):
    """Rows = figures, one column per endpoint, plus the A/B ratio column when there is a pair."""

    def show(
        self,
        views: Sequence[EndpointView],
        ratios: dict[str, float | None] | None,
        ab: tuple[str, str] | None,
        window_label: str,
    ) -> None:
        table = Table(expand=True, box=None, padding=(0, 1), header_style="bold")
        table.add_column(f"window {window_label}", style="dim", no_wrap=True)
        for i, v in enumerate(views):
            head = Text(v.name, style=f"bold {SERIES_STYLES[i % len(SERIES_STYLES)]}")
            if v.stale_since is not None:
                head.append(" (stale)", style="yellow")
            table.add_column(head, justify="right", no_wrap=True)
        if ab is not None and ratios is not None:
            table.add_column(f"{ab[0]}/{ab[1]}", justify="right", no_wrap=True)
        for row in ROWS:
            cells: list[RenderableType] = []
            for v in views:
                value = getattr(v.stats, row.key, None) if v.stats is not None else None
                cells.append(Text(fmt(row, value), style="dim" if v.stale_since else ""))
            if ab is not None and ratios is not None:
                ratio = ratios.get(row.key)
                style = ""
                if ratio is not None and abs(ratio - 1.0) > 0.02:
                    better = (ratio > 1.0) == HIGHER_IS_BETTER[row.key]
                    style = "bold green" if better else "bold red"
                cells.append(Text(fmt_ratio(ratio) if row.key in HIGHER_IS_BETTER else "", style))
            table.add_row(row.label, *cells)
        self.update(table)


class HistoryChart(Widget):
    """A bar chart of one figure over time (newest right), with an optional SLO line.

    Each bar is one scrape; its value is the figure over the 10 s before it. Bars under the SLO
    are red, over it green. The y scale is shared by the app across endpoints (`ymax`).
    """

    DEFAULT_CSS = "HistoryChart { height: 8; }"

    def __init__(self, title: str, style: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title = title
        self.series_style = style
        self.values: list[float | None] = []
        self.ymax: float = 1.0
        self.slo: float | None = None

    def set_data(self, values: list[float | None], *, ymax: float, slo: float | None) -> None:
        self.values = values
        self.ymax = max(ymax, 1e-9)
        self.slo = slo
        self.refresh()

    def render(self) -> RenderableType:
        width = max(8, self.content_size.width)
        height = max(2, self.content_size.height)
        rows = height - 1  # the first line is the title
        data = self.values[-width:]
        now = next((v for v in reversed(data) if v is not None), None)
        title = Text(f"{self.title} ", style="bold")
        title.append("now " + ("-" if now is None else f"{now:.1f}"), style=self.series_style)
        title.append(f"  max {self.ymax:.0f}", style="dim")
        if self.slo is not None:
            title.append(f"  SLO {self.slo:g}", style="yellow")
        pad = width - len(data)
        slo_row = None
        if self.slo is not None and self.slo <= self.ymax:
            slo_row = min(rows - 1, int(self.slo / self.ymax * rows))  # 0 = bottom row
        lines = [title]
        for r in range(rows - 1, -1, -1):
            line = Text()
            if pad > 0:
                line.append(("┄" if r == slo_row else " ") * pad, style="yellow")
            for v in data:
                if v is None:
                    line.append("┄" if r == slo_row else " ", style="yellow")
                    continue
                eighths = v / self.ymax * rows * 8 - r * 8
                idx = int(max(0, min(8, round(eighths))))
                style = self.series_style
                if self.slo is not None:
                    style = "green" if v >= self.slo else "red"
                if idx == 0:
                    line.append("┄" if r == slo_row else " ", style="yellow")
                else:
                    line.append(_BLOCKS[idx], style=style)
            lines.append(line)
        return Text("\n").join(lines)


class GpuStrip(Static):
    def show(self, telemetry: GpuTelemetry | None) -> None:
        if telemetry is None:
            self.update("")
            return
        if not telemetry.gpus:
            self.update(Text(f"GPUs: none here ({telemetry.reason})", style="dim"))
            return
        parts = []
        for g in telemetry.gpus:
            mem = (
                f"{g.memory_used_mib / 1024:.0f}/{g.memory_total_mib / 1024:.0f}G"
                if g.memory_used_mib is not None and g.memory_total_mib is not None
                else "-"
            )
            parts.append(
                f"GPU{g.index} {g.util_percent or 0:.0f}% {mem} "
                f"{g.power_w or 0:.0f}W {g.sm_clock_mhz or 0:.0f}MHz"
            )
        self.update(Text("  ".join(parts)))
