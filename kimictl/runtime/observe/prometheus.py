"""Prometheus text exposition: samples and cumulative histograms."""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass

__all__ = [
    "Histogram",
    "Sample",
    "parse_prometheus_text",
]


# --- Prometheus text exposition -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sample:
    """One line of Prometheus text: `name{labels} value [timestamp_ms]`."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str, default: str = "") -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return default


# name, optional {label body}, value (a trailing timestamp is ignored)
_LINE_RE = re.compile(r"([^{\s]+)(?:\{(.*)\})?\s+(\S+)")
_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_BODY_RE = re.compile(r'\s*(?:[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"\s*,?\s*)*')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r"\\[\\\"n]")


def _unescape(value: str) -> str:
    return _ESCAPE_RE.sub(lambda m: _UNESCAPE[m.group(0)], value) if "\\" in value else value


def _parse_line(line: str) -> Sample | None:
    """One sample line, or None when malformed. A few C-level regex calls per line: this runs on
    every wanted line of every scrape."""
    match = _LINE_RE.match(line)
    if match is None:
        return None
    name, body, raw = match.groups()
    try:
        value = float(raw)  # accepts NaN, +Inf, -Inf
    except ValueError:
        return None
    if not body:
        return Sample(name, (), value)
    if _BODY_RE.fullmatch(body) is None:
        return None
    return Sample(name, tuple((k, _unescape(v)) for k, v in _PAIR_RE.findall(body)), value)


def parse_prometheus_text(
    text: str, *, prefixes: tuple[str, ...] | None = None
) -> tuple[list[Sample], dict[str, str]]:
    """Parse Prometheus text format 0.0.4 into samples and `# TYPE` declarations.

    Malformed lines are skipped (a scrape is never lost to one odd line). With `prefixes`, only
    samples whose line starts with one of them are parsed (vLLM exposes ~900 lines; a snapshot
    needs ~130).
    """
    samples: list[Sample] = []
    types: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        if prefixes is not None and not line.startswith(prefixes):
            continue
        sample = _parse_line(line)
        if sample is not None:
            samples.append(sample)
    return samples, types


# --- histograms ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative bucket counts (`le` upper bounds, ascending, last = +Inf), count and sum."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float
    sum: float

    def minus(self, older: Histogram) -> Histogram:
        """Bucket-wise difference (caller has ruled out a reset)."""
        return Histogram(
            self.bounds,
            tuple(a - b for a, b in zip(self.cumulative, older.cumulative, strict=True)),
            self.count - older.count,
            self.sum - older.sum,
        )

    def plus(self, other: Histogram) -> Histogram:
        if other.bounds != self.bounds:
            raise ValueError("cannot add histograms with different bucket bounds")
        return Histogram(
            self.bounds,
            tuple(a + b for a, b in zip(self.cumulative, other.cumulative, strict=True)),
            self.count + other.count,
            self.sum + other.sum,
        )

    def went_down(self, older: Histogram) -> bool:
        if self.count < older.count:
            return True
        return any(a < b for a, b in zip(self.cumulative, older.cumulative, strict=True))

    def quantile(self, q: float) -> float | None:
        """Prometheus `histogram_quantile`: linear interpolation inside the bucket.

        None when the histogram is empty. A quantile in the +Inf bucket returns the largest finite
        bound (the true value is somewhere above it).
        """
        total = self.cumulative[-1] if self.cumulative else 0.0
        if total <= 0 or not 0.0 <= q <= 1.0:
            return None
        rank = q * total
        idx = bisect.bisect_left(self.cumulative, rank)
        idx = min(idx, len(self.cumulative) - 1)
        upper = self.bounds[idx]
        if math.isinf(upper):
            finite = [b for b in self.bounds if not math.isinf(b)]
            return finite[-1] if finite else None
        lower = self.bounds[idx - 1] if idx > 0 else 0.0
        below = self.cumulative[idx - 1] if idx > 0 else 0.0
        in_bucket = self.cumulative[idx] - below
        if in_bucket <= 0:
            return upper
        if idx == 0 and upper <= 0:
            return upper
        return lower + (upper - lower) * (rank - below) / in_bucket

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None
