"""Widgets of the monitor screen. They are fed (reactive data set by the app), never fetching."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style as RichStyle
from rich.text import Text
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from kimictl.runtime.observe.gpu_telemetry import GpuTelemetry
from kimictl.runtime.observe.poller import EndpointStatus, EndpointView
from kimictl.runtime.observe.window import HIGHER_IS_BETTER
from kimictl.tui.rows import ROWS, SOURCE_LABEL, fmt_cell, fmt_ratio, source_cell

__all__ = [
    "ChartsPanel",
    "FiguresTable",
    "GpuStrip",
    "Series",
    "StatusLine",
    "chart_lines",
    "SERIES_STYLES",
]

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
    if view.paced_s is not None:
        text.append(f" · slow scrapes: every {view.paced_s:.0f}s", style="yellow")
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


class _Lines(Widget):
    """Lines of rich Text drawn through Textual's Line API, converted to strips once per update.

    Redrawing ~5000 cells every second through Static/Content costs several % of a core; strips
    built straight from segments cost a fraction of that (docs/results.md).
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._text_lines: list[Text] = []
        self._strips: list[Strip] | None = None
        self._shape: tuple[int, int] = (-1, -1)
        self._strips_width = -1
        self._base_style = RichStyle()

    def feed(self, text: Text | str, lines: int | None = None) -> None:
        if isinstance(text, str):
            text = Text(text)
        new = list(text.split("\n", allow_blank=True)) if text.plain else []
        # a new layout only when the line count (or, for auto-width widgets, the width) changes
        auto_width = self.styles.width is not None and self.styles.width.is_auto
        shape = (len(new), max((t.cell_len for t in new), default=0) if auto_width else 0)
        self._text_lines = new
        self._strips = None
        self.refresh(layout=shape != self._shape)
        self._shape = shape

    @property
    def plain(self) -> str:
        return "\n".join(t.plain for t in self._text_lines)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._text_lines)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return max((t.cell_len for t in self._text_lines), default=0)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self._strips is None or self._strips_width != width:
            console = self.app.console
            # rich_style walks the ancestors: read it once per update, not once per line
            base = self._base_style = self.rich_style
            self._strips = [
                Strip(list(t.render(console, end=""))).apply_style(base).crop_extend(0, width, base)
                for t in self._text_lines
            ]
            self._strips_width = width
        if y >= len(self._strips):
            return Strip.blank(width, self._base_style)
        return self._strips[y]


class StatusLine(_Lines):
    """UP/DOWN lines, one per endpoint."""

    def show(
        self,
        views: Sequence[EndpointView],
        slo: float | None = None,
        traces: str | None = None,
        judge: Sequence[str] = (),
    ) -> None:
        texts = [
            status_text(v, SERIES_STYLES[i % len(SERIES_STYLES)], slo) for i, v in enumerate(views)
        ]
        if traces:
            texts.append(Text(traces, style="dim"))
        texts.extend(
            Text(line, style="bold" if i == len(judge) - 1 else "") for i, line in enumerate(judge)
        )
        self.feed(Text("\n").join(texts), len(texts))


class FiguresTable(_Lines):
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
        sources = [
            source_cell(v.stats.sources, v.stats.counts) if v.stats is not None else "-"
            for v in views
        ]
        col_w = max(12, *(len(h) + 2 for h, _ in heads), *(len(c) + 2 for c in sources))
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
                unresolved = v.stats.unresolved if v.stats is not None else {}
                cell = fmt_cell(row, value, unresolved)
                parts.append((cell.rjust(col_w), "dim" if v.stale_since else ""))
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
        parts = [(SOURCE_LABEL.ljust(label_w), "dim")]
        parts.extend((cell.rjust(col_w), "dim") for cell in sources)
        lines.append(Text.assemble(*parts))
        self.feed(Text("\n").join(lines), len(lines))


@dataclass(frozen=True, slots=True)
class Series:
    """One chart: a title, a colour, one value per scrape (newest last)."""

    title: str
    style: str
    values: Sequence[float | None]


Run = tuple[str, str]  # (text, rich style string)


def _merge_runs(cells: list[Run]) -> list[Run]:
    runs: list[Run] = []
    for ch, st in cells:
        if runs and runs[-1][1] == st:
            runs[-1] = (runs[-1][0] + ch, st)
        else:
            runs.append((ch, st))
    return runs


def chart_lines(
    series: Series, width: int, height: int, *, ymax: float, slo: float | None
) -> list[list[Run]]:
    """A bar chart as `height` lines of runs: a title line, then bars (one column per scrape,
    newest right, eighth-block resolution). With an SLO, bars are green at or above it and red
    under it, and a dotted line marks it."""
    width = max(8, width)
    rows = max(1, height - 1)
    ymax = max(ymax, 1e-9)
    data = list(series.values)[-width:]
    now = next((v for v in reversed(data) if v is not None), None)
    title = f"{series.title} "
    now_txt = "now " + ("-" if now is None else f"{now:.1f}")
    extra = (f"  SLO {slo:g}" if slo is not None else "") + f"  max {ymax:.0f}"
    head: list[Run] = [
        (title, "bold"),
        (now_txt, series.style),
        (extra, "yellow" if slo else "dim"),
    ]
    used = len(title) + len(now_txt) + len(extra)
    if used < width:
        head.append((" " * (width - used), ""))
    out = [head]
    pad = width - len(data)
    slo_row = None
    if slo is not None and slo <= ymax:
        slo_row = min(rows - 1, int(slo / ymax * rows))  # 0 = bottom row
    scale = rows * 8 / ymax
    for r in range(rows - 1, -1, -1):
        blank: Run = ("┄", "yellow") if r == slo_row else (" ", "")
        cells: list[Run] = [blank] * pad
        for v in data:
            idx = 0 if v is None else int(max(0, min(8, round(v * scale - r * 8))))
            if idx == 0:
                cells.append(blank)
            elif slo is None:
                cells.append((_BLOCKS[idx], series.style))
            else:
                cells.append((_BLOCKS[idx], "green" if v is not None and v >= slo else "red"))
        out.append(_merge_runs(cells))
    return out


class ChartsPanel(Widget):
    """History charts of every endpoint side by side, in ONE widget drawn from segments.

    Row 1: output tokens/s; row 2: interactivity p10 with the SLO line. Both rows share one y
    scale across endpoints so columns compare at a glance. (Eight separate chart widgets cost
    ~3 % of a core at 1 Hz; this costs a fraction: docs/results.md.)
    """

    CHART_HEIGHT = 8

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows: list[tuple[list[Series], float, float | None]] = []
        self.slo: float | None = None
        self._strips: list[Strip] | None = None
        self._built_for: tuple[int, int] = (-1, -1)
        self._plain: list[str] = []
        self._style_cache: dict[tuple[RichStyle, str], RichStyle] = {}

    def set_data(self, rows: list[tuple[list[Series], float, float | None]]) -> None:
        """rows: (series per endpoint, ymax, slo) for each chart row."""
        self.rows = rows
        self.slo = next((slo for _, _, slo in rows if slo is not None), None)
        self._strips = None
        self.refresh()

    @property
    def plain(self) -> str:
        return "\n".join(self._plain)

    def _style(self, base: RichStyle, spec: str) -> RichStyle:
        key = (base, spec)
        style = self._style_cache.get(key)
        if style is None:
            style = self._style_cache[key] = base + RichStyle.parse(spec) if spec else base
        return style

    def _build(self, width: int) -> None:
        base = self.rich_style
        strips: list[Strip] = []
        plain: list[str] = []
        gap = 2
        for series_list, ymax, slo in self.rows:
            n = max(1, len(series_list))
            col_w = max(8, (width - gap * (n - 1)) // n)
            columns = [
                chart_lines(s, col_w, self.CHART_HEIGHT, ymax=ymax, slo=slo) for s in series_list
            ]
            for y in range(self.CHART_HEIGHT):
                segments: list[Segment] = []
                text = []
                for i, col in enumerate(columns):
                    if i:
                        segments.append(Segment(" " * gap, base))
                        text.append(" " * gap)
                    cell_used = 0
                    for run_text, spec in col[y]:
                        room = col_w - cell_used
                        if room <= 0:
                            break
                        run_text = run_text[:room]
                        segments.append(Segment(run_text, self._style(base, spec)))
                        text.append(run_text)
                        cell_used += len(run_text)
                    if cell_used < col_w:
                        segments.append(Segment(" " * (col_w - cell_used), base))
                        text.append(" " * (col_w - cell_used))
                strips.append(Strip(segments).crop_extend(0, width, base))
                plain.append("".join(text))
            strips.append(Strip.blank(width, base))
            plain.append("")
        self._strips = strips
        self._plain = plain
        self._built_for = (width, len(self.rows))

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self._strips is None or self._built_for[0] != width:
            self._build(width)
        assert self._strips is not None
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(width, self.rich_style)


class GpuStrip(_Lines):
    def show(self, telemetry: GpuTelemetry | None) -> None:
        if telemetry is None:
            self.feed("", 0)
            return
        if not telemetry.gpus:
            self.feed(Text(f"GPUs: none here ({telemetry.reason})", style="dim"), 1)
            return
        parts = [g.summary() for g in telemetry.gpus]
        self.feed(Text("  ".join(parts)), len(parts))
