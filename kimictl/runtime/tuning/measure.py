"""Measured tuning: sweep concurrency against a live server, find the largest load meeting an SLO.

Each point is one closed-loop bench run (load.bench.run_bench, the same engine as
`kimictl bench`) with fixed-length random prompts. Concurrency doubles until the SLO breaks (or
`max_concurrency`), then bisects between the last load that met it and the first that did not.
The answer is written into a profile as max-num-seqs, with the measured points as provenance.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimictl.core.apikeys import env_api_key
from kimictl.core.errors import EndpointError, InputError

__all__ = ["MeasureResult", "MeasuredPoint", "measure", "sweep", "write_measured"]


@dataclass(frozen=True)
class MeasuredPoint:
    concurrency: int
    met: bool
    completed: int
    failed: int
    interactivity_p10: float | None
    interactivity_p50: float | None
    output_throughput: float
    ttft_p99_ms: float | None
    acceptance_length: float | None
    terms: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "slo_met": self.met,
            "completed": self.completed,
            "failed": self.failed,
            "interactivity_p10": _r(self.interactivity_p10),
            "interactivity_p50": _r(self.interactivity_p50),
            "output_throughput": _r(self.output_throughput),
            "ttft_p99_ms": _r(self.ttft_p99_ms),
            "spec_decode_acceptance_length": _r(self.acceptance_length),
            "terms": self.terms,
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass(frozen=True)
class MeasureResult:
    target: str
    url: str
    model: str
    run_id: str | None
    profile: str | None
    slo: str
    context: int
    output_len: int
    points: list[MeasuredPoint]
    best: int  # largest concurrency that met the SLO; 0 when none did
    limit_reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "url": self.url,
            "model": self.model,
            "run_id": self.run_id,
            "profile": self.profile,
            "slo": self.slo,
            "context": self.context,
            "output_len": self.output_len,
            "points": [p.to_json() for p in self.points],
            "max_concurrency_meeting_slo": self.best,
            "why": self.limit_reason,
        }


def _point_from(summary: dict[str, Any], concurrency: int) -> MeasuredPoint:
    kim = summary.get("kimictl") or {}
    inter = kim.get("interactivity_tok_s_per_user") or {}
    slo = kim.get("slo") or {}
    return MeasuredPoint(
        concurrency=concurrency,
        met=bool(slo.get("met")) and summary.get("failed", 0) == 0,
        completed=int(summary.get("completed", 0)),
        failed=int(summary.get("failed", 0)),
        interactivity_p10=inter.get("p10_slow_tail"),
        interactivity_p50=inter.get("p50"),
        output_throughput=float(summary.get("output_throughput") or 0.0),
        ttft_p99_ms=summary.get("p99_ttft_ms"),
        acceptance_length=summary.get("spec_decode_acceptance_length"),
        terms=list(slo.get("terms") or []),
    )


def sweep(meets: Callable[[int], bool], max_concurrency: int) -> tuple[int, int | None]:
    """(largest load that met, smallest that broke or None): double from 1, then bisect.

    Assumes meeting the SLO is monotone in load; every load is asked at most once by the caller's
    cache, and about log2(limit) + log2(gap) loads are tried.
    """
    good, bad = 0, None
    concurrency = 1
    while concurrency <= max_concurrency:
        if meets(concurrency):
            good = concurrency
            concurrency *= 2
        else:
            bad = concurrency
            break
    if good and bad is None and good < max_concurrency:
        # the doubling overshot the limit: try the limit itself, then bisect below it
        if meets(max_concurrency):
            return max_concurrency, None
        bad = max_concurrency
    if bad is not None and good and bad - good > 1:
        lo, hi = good, bad
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if meets(mid) else (lo, mid)
        good, bad = lo, hi
    return good, bad


def measure(
    target_text: str,
    *,
    slo_text: str,
    context: int,
    output_len: int,
    max_concurrency: int = 64,
    prompts_per_point: int | None = None,
    progress: Callable[[str], Any] | None = None,
) -> MeasureResult:
    """Sweep concurrency on a live endpoint (URL, NAME=URL or run id) and find the SLO's limit."""
    from kimictl.core.loops import run as run_loop
    from kimictl.runtime.load.bench import BenchConfig, resolve_models, run_bench
    from kimictl.runtime.load.records import LoadPoint, LoadTarget
    from kimictl.runtime.load.slo import parse_slo
    from kimictl.runtime.load.workloads import LengthDist, RandomWorkload
    from kimictl.runtime.serving.runs import resolve_target

    if max_concurrency < 1:
        raise InputError(f"--max-concurrency must be at least 1, got {max_concurrency}.")
    if prompts_per_point is not None and prompts_per_point < 1:
        raise InputError(f"--num-prompts must be at least 1, got {prompts_per_point}.")
    slo = parse_slo(slo_text)
    found = resolve_target(target_text)
    profile = None
    if found.run_id is not None:
        from kimictl.runtime.serving.runs import get_run

        profile = get_run(found.run_id).profile
    api_key = env_api_key()
    target = LoadTarget(
        name=found.name, url=found.url, model=found.model or "", api_key=api_key, gpus=found.gpus
    )
    try:
        target = asyncio.run(resolve_models([target]))[0]
    except EndpointError as exc:  # its hint names bench's --model, which tune does not have
        keyed = "API key" in (exc.hint or "") or "the key" in (exc.hint or "")
        raise EndpointError(
            exc.message,
            hint=exc.hint if keyed else "check the server is up (`kimictl ps`) and serves a model",
        ) from exc
    except OSError as exc:  # pragma: no cover - resolve_models maps its own errors
        raise EndpointError(f"cannot reach {found.url}: {exc}") from exc
    workload: Any = RandomWorkload(  # satisfies the load generator's Workload protocol
        input_len=LengthDist("fixed", context), output_len=LengthDist("fixed", output_len)
    )
    results: dict[int, MeasuredPoint] = {}

    def run_point(concurrency: int) -> MeasuredPoint:
        if concurrency in results:
            return results[concurrency]
        cfg = BenchConfig(
            targets=(target,),
            workload=workload,
            points=(LoadPoint(concurrency=concurrency),),
            num_prompts=prompts_per_point or max(2 * concurrency, 4),
            warmup=1,
            slo=slo,
            timeout=120.0,
        )
        outcome = run_loop(run_bench(cfg), cfg.loop)
        if not outcome.summaries:
            raise EndpointError(
                f"no request to {target.url} completed at concurrency {concurrency}",
                hint="check the server with `kimictl ps` / `kimictl logs`",
            )
        point = _point_from(outcome.summaries[0], concurrency)
        if point.completed == 0:
            raise EndpointError(
                f"every request to {target.url} failed at concurrency {concurrency}",
                hint="check the server with `kimictl ps` / `kimictl logs`",
            )
        results[concurrency] = point
        if progress is not None:
            verdict = "meets" if point.met else "breaks"
            p10 = point.interactivity_p10
            progress(
                f"concurrency {concurrency}: {verdict} the SLO (interactivity p10 "
                f"{'n/a' if p10 is None else f'{p10:.1f}'} tok/s/user, "
                f"{point.output_throughput:.1f} tok/s)"
            )
        return point

    good, bad = sweep(lambda c: run_point(c).met, max_concurrency)
    if good == 0:
        reason = f"even one request at a time breaks the SLO '{slo_text}'"
    elif bad is None:
        reason = f"the SLO held up to the sweep's limit of {max_concurrency} (--max-concurrency)"
    else:
        broken = [t["term"] for t in results[bad].terms if not t.get("met")]
        reason = f"at concurrency {bad} the SLO breaks" + (
            f" ({', '.join(broken)})" if broken else ""
        )
    return MeasureResult(
        target=found.name,
        url=target.url,
        model=target.model,
        run_id=found.run_id,
        profile=profile,
        slo=slo_text,
        context=context,
        output_len=output_len,
        points=[results[c] for c in sorted(results)],
        best=good,
        limit_reason=reason,
    )


def write_measured(
    result: MeasureResult,
    path: str | Path,
    *,
    base_profile: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the measured limit as max-num-seqs into a copy of the run's (or given) profile."""
    from kimictl.deployment.profiles import load_profile
    from kimictl.deployment.spec import PREBUILT_DEFAULT

    name = base_profile or result.profile
    if name is None:
        raise InputError(
            f"--write needs a base profile: {result.url} was not launched by kimictl, so its "
            f"profile is unknown.",
            hint="pass --profile NAME (the profile the server runs), or measure a run id",
        )
    if result.best < 1:
        raise InputError(
            f"--write: no concurrency met the SLO '{result.slo}', so there is no limit to write."
        )
    base = load_profile(name)
    spec = base.spec.with_(max_num_seqs=result.best)
    provenance = {
        "source": "kimictl tune --measure",
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "base_profile": base.name,
        "measured_url": result.url,
        "slo": result.slo,
        "max_concurrency_meeting_slo": result.best,
        "why": result.limit_reason,
        "workload": f"random, {result.context} prompt tokens, {result.output_len} output tokens",
        "points": [
            {k: v for k, v in p.to_json().items() if v is not None and k != "terms"}
            for p in result.points
        ],
    }
    stock = None
    stock_prebuilt = PREBUILT_DEFAULT
    if base.stock_twin is not None:
        try:
            twin = load_profile(base.stock_twin)
        except InputError:
            pass
        else:
            stock = twin.spec.with_(max_num_seqs=result.best)
            stock_prebuilt = twin.prebuilt_units
    from kimictl.runtime.tuning.choice_profile import write_spec_pair

    return write_spec_pair(
        path,
        spec,
        stock,
        provenance,
        description=f"{base.description or base.name}; max-num-seqs {result.best} measured "
        f"against the SLO '{result.slo}'",
        overwrite=overwrite,
        runtime=base.runtime,
        prebuilt_units=(base.prebuilt_units, stock_prebuilt),
    )
