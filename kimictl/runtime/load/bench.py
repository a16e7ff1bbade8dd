"""The whole bench, as `kimictl bench` and `kimictl demo` run it: load, summaries, A/B."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from kimictl.core.http1 import fetch_text
from kimictl.runtime.load.ab import HEADLINE, compare
from kimictl.runtime.load.loadgen import run_load
from kimictl.runtime.load.records import (
    LoadPoint,
    LoadSettings,
    LoadTarget,
    RecordList,
    RequestRecord,
)
from kimictl.runtime.load.slo import SLO
from kimictl.runtime.load.summary import summarize_run
from kimictl.runtime.load.workloads import Workload

__all__ = [
    "BenchConfig",
    "BenchOutcome",
    "resolve_models",
    "run_bench",
]


# ---------------------------------------------------------------------------------------------
# The whole bench: what `kimictl bench` calls

# vLLM's batch span processor sends every 0.5 s as kimictl configures it (deployment.traces)
SPAN_DELIVERY_S = 1.5


@dataclass(frozen=True, kw_only=True)
class BenchConfig(LoadSettings):
    """A bench: the load settings plus what is loaded, and the SLO the summaries judge."""

    targets: tuple[LoadTarget, ...]
    workload: Workload
    scrape_metrics: bool = True  # a bench reports the server's view beside the client's
    # receive traced servers' per-request spans here (observe.otlp): the server's view then has
    # exact percentiles; None = histograms only (a monitor may hold the port), as a taken port.
    traces_port: int | None = None
    slo: SLO | None = None
    primary: str = HEADLINE  # the A/B metric tested alone, whose row carries the verdict


@dataclass
class BenchOutcome:
    records: RecordList
    summaries: list[dict[str, Any]]
    ab: list[dict[str, Any]] | None
    stop_reason: str | None
    schedule: str = "abba"  # LoadSettings.schedule the run used

    def to_json(self) -> dict[str, Any]:
        """The `--json` document: `runs` holds one vllm-bench-compatible dict per (target, point,
        repeat); `ab` the A/B rows (first target / second target) or null; `schedule` the turns
        the targets took, in the order they ran."""
        return {
            "kimictl_bench": 1,
            "stop_reason": self.stop_reason,
            "warnings": self.warnings,
            "schedule": {"design": self.schedule, "turns": self.records.schedule},
            "runs": self.summaries,
            "ab": self.ab,
        }

    @property
    def warnings(self) -> list[str]:
        """Each distinct warning of the runs (the client lagged, ...), first seen first."""
        found = (s["kimictl"].get("client_warning") for s in self.summaries)
        return list(dict.fromkeys(w for w in found if w))


async def resolve_models(
    targets: Sequence[LoadTarget], *, timeout: float = 10.0
) -> list[LoadTarget]:
    """Fill in each target's model from its /v1/models (first id) where none was given."""
    from kimictl.core.errors import EndpointError

    out = []
    for t in targets:
        if t.model:
            out.append(t)
            continue
        try:
            text = await fetch_text(t.url, "/v1/models", api_key=t.api_key, timeout=timeout)
            models = [m["id"] for m in orjson.loads(text).get("data", [])]
        except (OSError, TimeoutError, orjson.JSONDecodeError, KeyError, AttributeError) as exc:
            from kimictl.core.apikeys import auth_hint

            status = next((c for c in (401, 403) if f"HTTP {c}" in str(exc)), 0)
            raise EndpointError(
                f"cannot read the model list of {t.name} at {t.url}/v1/models: {exc}",
                hint=auth_hint(status, key_sent=bool(t.api_key))
                or "check the server is up (`kimictl ps`), or pass --model",
            ) from exc
        if not models:
            raise EndpointError(f"{t.name} at {t.url} serves no model", hint="pass --model")
        out.append(replace(t, model=models[0]))
    return out


async def run_bench(
    cfg: BenchConfig,
    *,
    stop: asyncio.Event | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    on_point: Callable[[LoadTarget, LoadPoint, int], None] | None = None,
) -> BenchOutcome:
    """Run the load, summarize every (target, point, repeat), compare the first two targets."""
    receiver = None
    if cfg.scrape_metrics and cfg.traces_port is not None:
        from kimictl.runtime.observe.otlp import OtlpReceiver

        receiver = OtlpReceiver(port=cfg.traces_port)
        receiver.try_start()
    try:
        records = await run_load(
            cfg.targets,
            cfg.workload,
            cfg,
            stop=stop,
            on_record=on_record,
            on_point=on_point,
        )
        if receiver is not None and receiver.store.received:
            await asyncio.sleep(SPAN_DELIVERY_S)  # the last requests' spans are on their way
    finally:
        if receiver is not None:
            receiver.close()
    summaries = summarize_run(
        records,
        targets={t.name: t for t in cfg.targets},
        points={p.label: p for p in cfg.points},
        gpus={t.name: t.gpus for t in cfg.targets},
        slo=cfg.slo,
        endpoint_type="openai-chat" if cfg.chat else "openai",
        num_prompts=cfg.num_prompts,
        workload=cfg.workload.describe(),
        traces=receiver.store if receiver is not None else None,
    )
    ab = None
    if len(cfg.targets) >= 2:
        ab = compare(
            summaries,
            records,
            a=cfg.targets[0].name,
            b=cfg.targets[1].name,
            primary=cfg.primary,
            seed=cfg.seed,
        )
    design = cfg.schedule if len(cfg.targets) > 1 else "one target"
    return BenchOutcome(records, summaries, ab, records.stop_reason, design)
