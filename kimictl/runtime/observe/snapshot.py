"""One /metrics scrape as a MetricsSnapshot (engines merged), and merging replicas."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kimictl.runtime.observe.names import (
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    KV_CACHE_USAGE,
    PROCESS_START,
    SAMPLE_NAMES,
    SPEC_ACCEPTED_PER_POS,
)
from kimictl.runtime.observe.prometheus import Histogram, parse_prometheus_text

__all__ = [
    "MetricsSnapshot",
    "merge_snapshots",
    "snapshot_from_text",
]


# --- snapshots --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One scrape of one endpoint, engines merged. Cumulative values as the server reported them.

    `taken_at` is wall-clock (for display and records), `monotonic` orders and times windows.
    Absent families are absent from the mappings (never zero-filled).
    """

    taken_at: float
    monotonic: float
    gauges: Mapping[str, float]
    counters: Mapping[str, float]
    histograms: Mapping[str, Histogram]
    accepted_per_pos: tuple[float, ...] = ()
    process_start: float | None = None
    engines: int = 1
    models: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "taken_at": self.taken_at,
            "gauges": dict(self.gauges),
            "counters": dict(self.counters),
            "histograms": {
                k: {
                    "bounds": list(h.bounds),
                    "cumulative": list(h.cumulative),
                    "count": h.count,
                    "sum": h.sum,
                }
                for k, h in self.histograms.items()
            },
            "engines": self.engines,
            "models": list(self.models),
        }


# Only the samples a snapshot uses get parsed (vLLM exposes ~900 lines; about 130 are needed).
_SNAPSHOT_PREFIXES = tuple(p for n in SAMPLE_NAMES for p in (n + "{", n + " "))


def snapshot_from_text(
    text: str,
    *,
    taken_at: float | None = None,
    monotonic: float | None = None,
    model: str | None = None,
) -> MetricsSnapshot:
    """Build a snapshot from /metrics text, summing over engines (and finished_reason etc.).

    `model` keeps only samples whose `model_name` label equals it (samples without the label stay).
    """
    samples, _ = parse_prometheus_text(text, prefixes=_SNAPSHOT_PREFIXES)
    gauge_sum: dict[str, float] = {}
    gauge_n: dict[str, int] = {}
    counters: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    h_count: dict[str, float] = {}
    h_sum: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    engines: set[str] = set()
    models: set[str] = set()
    process_start: float | None = None
    gauge_names = set(GAUGES)
    counter_names = {c + "_total": c for c in COUNTERS}
    hist_names = set(HISTOGRAMS)
    per_pos_name = SPEC_ACCEPTED_PER_POS + "_total"

    for s in samples:
        name = s.name
        if name == PROCESS_START:
            process_start = s.value
            continue
        if model is not None:
            m = s.label("model_name", model)
            if m != model:
                continue
        if math.isnan(s.value):
            continue
        engine = s.label("engine", "")
        if engine:
            engines.add(engine)
        mn = s.label("model_name", "")
        if mn:
            models.add(mn)
        if name in gauge_names:
            gauge_sum[name] = gauge_sum.get(name, 0.0) + s.value
            gauge_n[name] = gauge_n.get(name, 0) + 1
        elif name in counter_names:
            fam = counter_names[name]
            counters[fam] = counters.get(fam, 0.0) + s.value
        elif name == per_pos_name:
            try:
                pos = int(s.label("position", "-1"))
            except ValueError:
                continue
            if pos >= 0:
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
        elif name.endswith("_bucket"):
            fam = name[: -len("_bucket")]
            if fam in hist_names:
                le = s.label("le", "")
                try:
                    bound = float(le)
                except ValueError:
                    continue
                fb = buckets.setdefault(fam, {})
                fb[bound] = fb.get(bound, 0.0) + s.value
        elif name.endswith("_count"):
            fam = name[: -len("_count")]
            if fam in hist_names:
                h_count[fam] = h_count.get(fam, 0.0) + s.value
        elif name.endswith("_sum"):
            fam = name[: -len("_sum")]
            if fam in hist_names:
                h_sum[fam] = h_sum.get(fam, 0.0) + s.value

    gauges = {}
    for g, total in gauge_sum.items():
        # KV usage is a per-engine fraction: merged as the mean; request counts add up.
        gauges[g] = total / gauge_n[g] if g == KV_CACHE_USAGE else total
    histograms = {}
    for fam, fb in buckets.items():
        bounds = tuple(sorted(fb))
        cumulative = tuple(fb[b] for b in bounds)
        count = h_count.get(fam, cumulative[-1] if cumulative else 0.0)
        histograms[fam] = Histogram(bounds, cumulative, count, h_sum.get(fam, 0.0))
    accepted = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return MetricsSnapshot(
        taken_at=time.time() if taken_at is None else taken_at,
        monotonic=time.monotonic() if monotonic is None else monotonic,
        gauges=gauges,
        counters=counters,
        histograms=histograms,
        accepted_per_pos=accepted,
        process_start=process_start,
        engines=max(1, len(engines)),
        models=tuple(sorted(models)),
    )


def merge_snapshots(snapshots: Sequence[MetricsSnapshot]) -> MetricsSnapshot:
    """Merge replicas scraped at (about) the same time: sum counters, buckets and request gauges.

    KV cache usage becomes the mean. Histograms whose bucket bounds differ between replicas
    cannot be summed and are dropped (they then show up as missing).
    """
    if not snapshots:
        raise ValueError("merge_snapshots needs at least one snapshot")
    if len(snapshots) == 1:
        return snapshots[0]
    gauges: dict[str, float] = {}
    kv: list[float] = []
    counters: dict[str, float] = {}
    histograms: dict[str, Histogram] = {}
    dropped: set[str] = set()
    per_pos: list[float] = []
    for snap in snapshots:
        for k, v in snap.gauges.items():
            if k == KV_CACHE_USAGE:
                kv.append(v)
            else:
                gauges[k] = gauges.get(k, 0.0) + v
        for k, v in snap.counters.items():
            counters[k] = counters.get(k, 0.0) + v
        for k, h in snap.histograms.items():
            if k in dropped:
                continue
            if k not in histograms:
                histograms[k] = h
            elif histograms[k].bounds == h.bounds:
                histograms[k] = histograms[k].plus(h)
            else:
                dropped.add(k)
                del histograms[k]
        for i, v in enumerate(snap.accepted_per_pos):
            if i >= len(per_pos):
                per_pos.append(0.0)
            per_pos[i] += v
    if kv:
        gauges[KV_CACHE_USAGE] = sum(kv) / len(kv)
    starts = [s.process_start for s in snapshots if s.process_start is not None]
    return MetricsSnapshot(
        taken_at=max(s.taken_at for s in snapshots),
        monotonic=max(s.monotonic for s in snapshots),
        gauges=gauges,
        counters=counters,
        histograms=histograms,
        accepted_per_pos=tuple(per_pos),
        # a restart of any replica changes the sum of start times (reset detection)
        process_start=sum(starts) if len(starts) == len(snapshots) else None,
        engines=sum(s.engines for s in snapshots),
        models=tuple(sorted({m for s in snapshots for m in s.models})),
    )
