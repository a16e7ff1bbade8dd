"""The live judge: tuned against stock while real users are split (canary) or copied (shadow),
from the per-request spans the monitor receives (observe.otlp), decided while it runs.

- canary: each request went to one arm. Counts per arm are checked against the configured weight
  first (verdict.strata.srm_check; a mismatch blocks the verdict); then mean log interactivity is
  compared within input x output length strata, reweighted to both arms' mix.
- shadow: every mirrored request ran on both arms under one X-Request-Id (the proxy sets it at the
  edge), which vLLM reports as the span's request id; pairs are matched by it and judged on
  per-pair log ratios. The share of primary requests that found their mirror is checked against
  the mirror percentage the same way.
Either way the ratio's interval is verdict.sequential's confidence sequence, valid at every look.
Requests of one output token (kimictl's readiness probe, the multi-node heartbeat) carry no TPOT
and are left out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kimictl.core.errors import InputError
from kimictl.runtime.observe.otlp import (
    TracedRequest,
    TraceStore,
    server_key_matches,
    traced_figures,
)
from kimictl.runtime.verdict.sequential import LogRatioSummary, Watch, paired_estimate
from kimictl.runtime.verdict.strata import Shaped, Srm, srm_check, stratified_estimate

__all__ = ["CANARY", "SHADOW", "Arm", "LiveJudge", "state_line"]

CANARY = "canary"
SHADOW = "shadow"
# Spans arrive in the SDK's batches (every few seconds), not in finish order across arms: each look
# re-reads this far back and keeps each request once.
REREAD_S = 30.0
# shadow: a primary request counts as unmirrored only after its mirror had this long to finish
SETTLE_S = 20.0
MIN_FOR_SRM = 20


@dataclass(frozen=True, slots=True)
class Arm:
    """An endpoint the judge reads: its name (tuned | stock) and URL (spans match by either)."""

    name: str
    url: str


def _key(r: TracedRequest) -> tuple[str | None, float]:
    return (r.request_id, r.finished_at)


@dataclass
class LiveJudge:
    """Accumulates each arm's requests since it started and judges at each `look`.

    mode canary: `pct` is the share of traffic sent to tuned (the canary); shadow: `pct` is the
    share of stock's (the primary's) requests mirrored to tuned (the shadow)."""

    mode: str
    pct: float
    tuned: Arm
    stock: Arm
    started_at: float = field(default_factory=time.time)
    watch: Watch = field(default_factory=Watch)
    _seen: dict[str, dict[tuple[str | None, float], TracedRequest]] = field(default_factory=dict)
    _srm: Srm | None = None
    _unknown: set[str] = field(default_factory=set)
    _last_ingest: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in (CANARY, SHADOW):
            raise InputError(f"judge mode {self.mode!r} is not one of {CANARY}, {SHADOW}.")
        if not 0 < self.pct <= 100 or (self.mode == CANARY and self.pct >= 100):
            allowed = "more than 0 and less than 100" if self.mode == CANARY else "1-100"
            raise InputError(f"--{self.mode} {self.pct:g}% is out of range; allowed: {allowed}.")
        self._seen = {self.tuned.name: {}, self.stock.name: {}}

    # --- reading spans -----------------------------------------------------------------------
    def ingest(self, store: TraceStore, *, now: float | None = None) -> None:
        now = time.time() if now is None else now
        start = self.started_at
        if self._last_ingest is not None:
            start = max(start, self._last_ingest - REREAD_S)
        self._last_ingest = now
        for arm in (self.tuned, self.stock):
            kept = self._seen[arm.name]
            for r in store.requests(url=arm.url, name=arm.name, start=start):
                if r.tpot_s is not None:
                    kept.setdefault(_key(r), r)
        self._unknown = {
            key
            for key in store.servers
            if not any(server_key_matches(key, url=a.url, name=a.name) for a in self.arms)
        }

    @property
    def arms(self) -> tuple[Arm, Arm]:
        return self.tuned, self.stock

    def requests(self, arm: str) -> list[TracedRequest]:
        return list(self._seen[arm].values())

    # --- judging -----------------------------------------------------------------------------
    def look(self, store: TraceStore | None = None, *, now: float | None = None) -> dict[str, Any]:
        """Ingest (when given the store), judge, and return the JSON the monitor carries."""
        now = time.time() if now is None else now
        if store is not None:
            self.ingest(store, now=now)
        tuned, stock = self.requests(self.tuned.name), self.requests(self.stock.name)
        est, extra = (
            self._shadow(tuned, stock, now) if self.mode == SHADOW else self._canary(tuned, stock)
        )
        if self._srm is not None and self._srm.mismatch:
            self.watch.block("SRM", now)
        else:
            self.watch.look(est, now)
        return self._doc(tuned, stock, extra)

    def _canary(
        self, tuned: Sequence[TracedRequest], stock: Sequence[TracedRequest]
    ) -> tuple[LogRatioSummary | None, dict[str, Any]]:
        counts = {self.tuned.name: len(tuned), self.stock.name: len(stock)}
        weights = {self.tuned.name: self.pct, self.stock.name: 100.0 - self.pct}
        self._srm = srm_check(counts, weights) if sum(counts.values()) >= MIN_FOR_SRM else None
        est, coverage = stratified_estimate(_shaped(tuned), _shaped(stock))
        return est, {"strata_coverage": coverage}

    def _shadow(
        self, tuned: Sequence[TracedRequest], stock: Sequence[TracedRequest], now: float
    ) -> tuple[LogRatioSummary | None, dict[str, Any]]:
        mirror = {r.request_id: r for r in tuned if r.request_id}
        ratios = []
        settled = mirrored = 0
        for r in stock:
            m = mirror.get(r.request_id) if r.request_id else None
            if m is not None:
                ratios.append(math.log(r.tpot_s / m.tpot_s))  # type: ignore[operator]
            if r.finished_at <= now - SETTLE_S:
                settled += 1
                mirrored += m is not None
        primary_ids = {r.request_id for r in stock}
        orphans = sum(1 for rid in mirror if rid not in primary_ids)
        self._srm = None
        if settled >= MIN_FOR_SRM:
            counts = {"mirrored": mirrored, "not mirrored": settled - mirrored}
            weights = {"mirrored": self.pct, "not mirrored": 100.0 - self.pct}
            self._srm = srm_check(counts, weights)
        return paired_estimate(ratios), {"pairs": len(ratios), "unpaired_mirrors": orphans}

    def _doc(
        self, tuned: Sequence[TracedRequest], stock: Sequence[TracedRequest], extra: dict[str, Any]
    ) -> dict[str, Any]:
        total = len(tuned) + len(stock)
        arms: dict[str, Any] = {}
        for arm, rows in ((self.tuned, tuned), (self.stock, stock)):
            figures, _ = traced_figures(rows)
            arms[arm.name] = {
                "n": len(rows),
                "share": len(rows) / total if total and self.mode == CANARY else None,
                **{
                    k: figures[k]
                    for k in (
                        "interactivity_p10",
                        "interactivity_p50",
                        "interactivity_p90",
                        "ttft_p90_ms",
                    )
                },
            }
        return {
            "mode": self.mode,
            "pct": self.pct,
            "tuned": self.tuned.name,
            "stock": self.stock.name,
            "started_at": self.started_at,
            "arms": arms,
            "srm": None if self._srm is None else self._srm.to_json(),
            "unknown_servers": sorted(self._unknown),
            **extra,
            **self.watch.to_json(),
        }


def _shaped(rows: Sequence[TracedRequest]) -> list[Shaped]:
    return [
        Shaped(-math.log(r.tpot_s), r.prompt_tokens or 0, r.output_tokens or 0)  # type: ignore[arg-type]
        for r in rows
    ]


def state_line(doc: dict[str, Any]) -> str:
    """One line for screens: the state, the ratio and its interval, since when."""
    state = doc["state"]
    when = ""
    if doc.get("since") is not None:
        when = " since " + time.strftime("%H:%M:%S", time.localtime(doc["since"]))
    if state == "SRM":
        srm = doc["srm"] or {}
        obs = ", ".join(f"{k} {v:.0%}" for k, v in srm.get("observed_share", {}).items() if v)
        p = srm.get("p", 0.0)
        return f"SRM: observed {obs} vs configured {doc['pct']:g}% (p={p:.1g}); no verdict{when}"
    ratio, ci = doc.get("ratio"), doc.get("ci")
    figure = ""
    if ratio is not None:
        figure = f" interactivity x{ratio:.3f}"
        if ci:
            figure += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    unknown = doc.get("unknown_servers") or []
    note = f"; spans from unknown servers: {', '.join(unknown)}" if unknown else ""
    return f"{doc['mode']} {doc['pct']:g}%: {state}{figure}{when}{note}"
