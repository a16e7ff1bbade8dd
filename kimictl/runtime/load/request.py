"""What `kimictl bench` asks for, as one object: the options as typed, checked and turned into a
`BenchConfig` here, so the command only parses argv and renders.

The choices are enums (the command's options take them as they are); the bounds a CLI parser can
state (>= 1, a TCP port) are the command's; what needs more than one bound or more than one option
(> 0 seconds, a sweep list, a workload's own flags) is checked in `BenchRequest.config`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kimictl.core.errors import InputError
from kimictl.core.loops import EventLoop
from kimictl.runtime.load.records import LoadPoint, LoadTarget, Schedule
from kimictl.runtime.observe.session import NamedEndpoint

if TYPE_CHECKING:
    from kimictl.runtime.load.bench import BenchConfig
    from kimictl.runtime.load.workloads import Workload

__all__ = [
    "Arrivals",
    "BenchEndpoint",
    "BenchRequest",
    "Endpoint",
    "WorkloadKind",
    "check_save_result",
]


class WorkloadKind(StrEnum):
    random = "random"
    agentic = "agentic"
    replay = "replay"
    prompts = "prompts"


class Endpoint(StrEnum):
    completions = "completions"
    chat = "chat"


class Arrivals(StrEnum):
    poisson = "poisson"
    constant = "constant"


class BenchEndpoint(NamedEndpoint, Protocol):
    """A resolved target (serving.runs.Target reads so), with its GPUs when its run knows them."""

    @property
    def gpus(self) -> int | None: ...


@dataclass(frozen=True, kw_only=True)
class BenchRequest:
    """The bench options as the user gave them; `config()` checks them together."""

    model: str | None = None
    workload: WorkloadKind = WorkloadKind.random
    input_len: str = "256"
    output_len: str = "128"
    prefix_len: int = 0
    agentic_config: str = "agentx"
    trace: Path | None = None
    replay_speed: float = 1.0
    prompts: Path | None = None
    endpoint: Endpoint = Endpoint.completions
    concurrency: str | None = None
    rate: str | None = None
    burstiness: float = 1.0
    arrivals: Arrivals = Arrivals.poisson
    num_prompts: int | None = None
    duration: float | None = None
    warmup: int | None = None
    seed: int = 0
    repeat: int = 1
    timeout: float = 300.0
    ignore_eos: bool = True
    gpus: int | None = None
    slo: str | None = None
    scrape_metrics: bool = True
    traces_port: int | None = None
    schedule: Schedule = Schedule.abba
    interleave: bool = False
    workers: int | None = None  # client worker processes; None: loadgen.default_workers
    loop: EventLoop = EventLoop.auto  # each client process's event loop
    api_key: str | None = None
    save_result: Path | None = None  # --save-result FILE: one (target, point, repeat) in it
    output: Path | None = None  # -o FILE: the report JSON
    csv_out: Path | None = None  # --csv FILE: one row per request
    plot: Path | None = None  # --plot DIR
    force: bool = False  # replace existing output files

    @classmethod
    def from_options(cls, options: Mapping[str, Any], **given: Any) -> BenchRequest:
        """The request from the command's options, taken by field name; `given` wins."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**({k: v for k, v in options.items() if k in names} | given))

    def config(self, targets: Sequence[BenchEndpoint]) -> BenchConfig:
        """The bench to run against `targets` (resolved, names unique); InputError on a bad mix."""
        from kimictl.runtime.load.bench import BenchConfig
        from kimictl.runtime.load.exports import check_bench_outputs
        from kimictl.runtime.load.loadgen import default_warmup
        from kimictl.runtime.load.slo import parse_slo

        check_bench_outputs(  # every file before any request
            output=self.output,
            csv_out=self.csv_out,
            plot=self.plot,
            save_result=self.save_result,
            overwrite=self.force,
        )
        if self.duration is not None and self.duration <= 0:
            raise InputError(f"--duration {self.duration} must be > 0 seconds")
        if self.timeout <= 0:
            raise InputError(f"--timeout {self.timeout} must be > 0 seconds")
        schedule = self._schedule()
        workload = self._workload()
        points = self._points()
        slo = parse_slo(self.slo) if self.slo else None
        loaded = tuple(
            LoadTarget(
                name=t.name,
                url=t.url,
                model=self.model or t.model or "",
                api_key=self.api_key,
                gpus=self.gpus if self.gpus is not None else t.gpus,
            )
            for t in targets
        )
        warmup = self.warmup
        if warmup is None:
            warmup = default_warmup(len(loaded), points)
        if self.save_result is not None:
            check_save_result(len(loaded), len(points), self.repeat)
        no_end = self.num_prompts is None and self.duration is None
        return BenchConfig(
            targets=loaded,
            workload=workload,
            points=tuple(points),
            num_prompts=50 if no_end else self.num_prompts,
            duration=self.duration,
            warmup=warmup,
            seed=self.seed,
            repeat=self.repeat,
            timeout=self.timeout,
            chat=self.endpoint is Endpoint.chat,
            ignore_eos=self.ignore_eos,
            scrape_metrics=self.scrape_metrics,
            traces_port=self.traces_port,
            schedule=schedule.value,
            slo=slo,
            workers=self.workers,
            loop=self.loop.value,
        )

    def _schedule(self) -> Schedule:
        if self.interleave and self.schedule not in (Schedule.abba, Schedule.interleave):
            raise InputError(
                f"--interleave and --schedule {self.schedule.value} ask for two schedules: give one"
            )
        return Schedule.interleave if self.interleave else self.schedule

    def _workload(self) -> Workload:
        from kimictl.runtime.load import workloads as w

        out_dist = w.parse_length(self.output_len, what="--output-len")
        kind = self.workload
        if kind is WorkloadKind.random:
            in_dist = w.parse_length(self.input_len, what="--input-len")
            return w.RandomWorkload(in_dist, out_dist, self.prefix_len)
        if kind is WorkloadKind.agentic:
            return w.AgenticWorkload(w.load_agentic_config(self.agentic_config))
        if kind is WorkloadKind.replay:
            if self.trace is None:
                raise InputError("--workload replay needs --trace FILE.jsonl")
            return w.ReplayWorkload.from_file(self.trace, speed=self.replay_speed)
        if self.prompts is None:
            raise InputError("--workload prompts needs --prompts FILE (JSON or JSONL)")
        return w.PromptsWorkload.from_file(self.prompts, output_len=out_dist)

    def _points(self) -> list[LoadPoint]:
        if self.burstiness <= 0:
            raise InputError(f"--burstiness {self.burstiness} must be > 0 (1 = Poisson)")
        conc = _numbers(self.concurrency, "--concurrency", int) if self.concurrency else None
        if self.workload is WorkloadKind.replay:
            if self.rate:
                raise InputError(
                    "--workload replay runs on the trace's clock; drop --rate (use --replay-speed)"
                )
            return [LoadPoint(concurrency=conc[0] if conc else None, rate=float("inf"))]
        if self.rate:
            if conc and len(conc) > 1:
                raise InputError(
                    "with --rate, --concurrency is one cap on requests in flight, not a list"
                )
            cap = conc[0] if conc else None
            return [
                LoadPoint(
                    concurrency=cap, rate=r, burstiness=self.burstiness, arrivals=self.arrivals
                )
                for r in _numbers(self.rate, "--rate", float)
            ]
        return [LoadPoint(concurrency=c) for c in (conc or [1])]


def _numbers(text: str, what: str, kind: type) -> list[Any]:
    """A comma-separated sweep of positive numbers (`1,2,4,8`)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = kind(part)
        except ValueError:
            raise InputError(
                f"{what} {text!r}: {part!r} is not a {'whole ' if kind is int else ''}number; "
                f"give a comma-separated list, e.g. {what} 1,2,4,8"
            ) from None
        if value <= 0:
            raise InputError(f"{what} {text!r}: {part!r} must be > 0")
        out.append(value)
    if not out:
        raise InputError(f"{what} {text!r} is empty; give e.g. {what} 1,2,4")
    return out


def check_save_result(targets: int, points: int, repeat: int) -> None:
    """Before the run: a vLLM result file holds one (target, point, repeat)."""
    if targets != 1 or points != 1 or repeat != 1:
        raise InputError(
            f"--save-result writes one vLLM result (one target, one point, --repeat 1); this run "
            f"has {targets} target(s), {points} point(s), repeat {repeat}: use --output FILE "
            "for sweeps."
        )
