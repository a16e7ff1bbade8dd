"""Widgets of the monitor screen. They are fed (reactive data set by the app), never fetching."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import RenderableType
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


def status_text(view: EndpointView, style: str, slo: float | None = None) -> Text:
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
    if stats is not None and stats.tokens_per_s is not None:
        # the live operating point: throughput at the slow-tail interactivity
        p10 = stats.interactivity_p10
        text.append(f"  {stats.tokens_per_s:.1f} tok/s", style="bold")
        text.append(" @ p10 " + ("-" if p10 is None else f"{p10:.1f}") + " tok/s/user")
        if slo is not None and p10 is not None:
            ok = p10 >= slo
            text.append(" SLO met" if ok else " SLO missed", style="green" if ok else "bold red")
    if stats is not None and stats.resets:
        text.append(" · restarted in window", style="yellow")
    text.append(f"  {view.url}", style="dim")
    return text


class _Fed(Static):
    """A Static that re-lays out only when its line count changes (layout is the costly part)."""

    _lines = -1

    def feed(self, content: RenderableType, lines: int) -> None:
        self.update(content, layout=lines != self._lines)
        self._lines = lines


class StatusLine(_Fed):
    """UP/DOWN lines, one per endpoint."""

    def show(self, views: Sequence[EndpointView], slo: float | None = None) -> None:
        lines = Text("\n").join(
            status_text(v, SERIES_STYLES[i % len(SERIES_STYLES)], slo) for i, v in enumerate(views)
        )
        self.feed(lines, len(views))


class FiguresTable(_Fed):
    """Rows = figures, one column per endpoint, plus the A/B ratio column when there is a pair.

    Drawn as plain fixed-width lines (a rich Table costs ~10x more to lay out every second).
    """

    def show(
        self,
        views: Sequence[EndpointView],
        ratios: dict[str, float | None] | None,
        ab: tuple[str, str] | None,
        window_label: str,
    ) -> None:
        label_w = max(len(r.label) for r in ROWS) + 2
        heads: list[tuple[str, str]] = []
        for i, v in enumerate(views):
            stale = " (stale)" if v.stale_since is not None else ""
            heads.append((v.name + stale, f"bold {SERIES_STYLES[i % len(SERIES_STYLES)]}"))
        show_ratio = ab is not None and ratios is not None
        if show_ratio:
            assert ab is not None
            heads.append((f"{ab[0]}/{ab[1]}", "bold"))
        col_w = max(12, *(len(h) + 2 for h, _ in heads))
        lines = [
            Text.assemble(
                (f"window {window_label}".ljust(label_w), "bold"),
                *((h.rjust(col_w), st) for h, st in heads),
            )
        ]
        for row in ROWS:
            parts: list[tuple[str, str]] = [(row.label.ljust(label_w), "")]
            for v in views:
                value = getattr(v.stats, row.key, None) if v.stats is not None else None
                parts.append((fmt(row, value).rjust(col_w), "dim" if v.stale_since else ""))
            if show_ratio:
                assert ratios is not None
                ratio = ratios.get(row.key)
                style = ""
                if ratio is not None and abs(ratio - 1.0) > 0.02:
                    better = (ratio > 1.0) == HIGHER_IS_BETTER[row.key]
                    style = "bold green" if better else "bold red"
                cell = fmt_ratio(ratio) if row.key in HIGHER_IS_BETTER else ""
                parts.append((cell.rjust(col_w), style))
            lines.append(Text.assemble(*parts))
        self.feed(Text("\n").join(lines), len(lines))


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
        blank_style = "yellow"
        for r in range(rows - 1, -1, -1):
            blank = "┄" if r == slo_row else " "
            # one (text, style) run per change of style: few segments, cheap to draw
            runs: list[tuple[str, str]] = []
            cells = [(blank, blank_style)] * pad
            for v in data:
                if v is None:
                    cells.append((blank, blank_style))
                    continue
                idx = int(max(0, min(8, round(v / self.ymax * rows * 8 - r * 8))))
                if idx == 0:
                    cells.append((blank, blank_style))
                    continue
                style = self.series_style
                if self.slo is not None:
                    style = "green" if v >= self.slo else "red"
                cells.append((_BLOCKS[idx], style))
            for ch, st in cells:
                if runs and runs[-1][1] == st:
                    runs[-1] = (runs[-1][0] + ch, st)
                else:
                    runs.append((ch, st))
            lines.append(Text.assemble(*runs))
        return Text("\n").join(lines)


class GpuStrip(_Fed):
    def show(self, telemetry: GpuTelemetry | None) -> None:
        if telemetry is None:
            self.feed("", 0)
            return
        if not telemetry.gpus:
            self.feed(Text(f"GPUs: none here ({telemetry.reason})", style="dim"), 1)
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
        self.feed(Text("  ".join(parts)), len(parts))
