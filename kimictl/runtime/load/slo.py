"""Service-level objectives: `parse_slo("interactivity_p10>=100,ttft_p99<=2000ms")`.

Shared by bench (goodput and the SLO verdict), monitor and tune. A term is
`METRIC[_STAT] OP VALUE[UNIT]`:

- per-request metrics: `ttft`, `tpot`, `itl`, `e2el` (times; canonical unit ms, `s`/`ms`/`us`
  accepted) and `interactivity` (tokens/s/user = 1/TPOT, per request; unit `tok/s` optional);
- STAT: `mean`, `median`, `pNN` (e.g. p10, p99, p99.9). A per-request metric without a stat is
  rejected: say which percentile the objective protects;
- run-level metrics (no stat): `output_throughput`, `throughput_per_gpu` (tokens/s),
  `request_throughput` (requests/s);
- OP: `<=`, `<`, `>=`, `>`.

Evaluation takes a flat mapping of stat keys to values in canonical units: `ttft_p99` (ms),
`interactivity_p10` (tokens/s), `output_throughput` (tokens/s). `interactivity_p10` is the 10th
percentile of per-request interactivity, i.e. the slow tail (equal to 1000 / tpot_p90 in ms).

A request is "good" for goodput when it meets every per-request term's threshold on its own value
(mean/median/pNN then describe how many requests must meet it; the aggregate verdict checks that).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kimictl.core.errors import InputError

__all__ = ["PER_REQUEST", "RUN_LEVEL", "SLO", "SloResult", "SloTerm", "parse_slo"]

PER_REQUEST = {"ttft": "ms", "tpot": "ms", "itl": "ms", "e2el": "ms", "interactivity": "tok/s"}
RUN_LEVEL = {
    "output_throughput": "tok/s",
    "throughput_per_gpu": "tok/s",
    "request_throughput": "req/s",
}

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
}
_TIME_UNITS = {"ms": 1.0, "s": 1000.0, "us": 0.001}
_TERM = re.compile(
    r"^\s*([a-z][a-z0-9_]*?)(?:_(mean|median|p\d+(?:\.\d+)?))?\s*(<=|>=|<|>)\s*([0-9.eE+-]+)\s*([a-z/]*)\s*$"
)
_ALLOWED = (
    "METRIC_STAT OP VALUE with METRIC one of ttft, tpot, itl, e2el (ms), interactivity (tok/s) and "
    "STAT mean, median or pNN; or output_throughput, throughput_per_gpu, request_throughput "
    "without a stat; OP one of <=, <, >=, >"
)


@dataclass(frozen=True)
class SloTerm:
    metric: str
    stat: str | None  # mean | median | pNN | None (run-level)
    op: str
    value: float  # canonical unit (ms for times, tokens/s, requests/s)
    text: str

    @property
    def key(self) -> str:
        return f"{self.metric}_{self.stat}" if self.stat else self.metric

    @property
    def unit(self) -> str:
        return PER_REQUEST.get(self.metric) or RUN_LEVEL[self.metric]

    @property
    def percentile(self) -> float | None:
        if self.stat == "median":
            return 50.0
        if self.stat and self.stat.startswith("p"):
            return float(self.stat[1:])
        return None

    def holds(self, value: float) -> bool:
        return _OPS[self.op](value, self.value)


@dataclass(frozen=True)
class SloResult:
    term: SloTerm
    observed: float | None  # None: the stat could not be measured (no successful request)
    met: bool


@dataclass(frozen=True)
class SLO:
    terms: tuple[SloTerm, ...]
    text: str

    @property
    def per_request_terms(self) -> tuple[SloTerm, ...]:
        return tuple(t for t in self.terms if t.metric in PER_REQUEST)

    def request_ok(self, values: Mapping[str, float | None]) -> bool:
        """Whether one request meets every per-request threshold. `values` maps metric -> the
        request's value in canonical units (`ttft` ms, `interactivity` tokens/s, ...); a missing
        value (e.g. TPOT of a one-token answer) does not fail the term, as in vllm bench."""
        for t in self.per_request_terms:
            v = values.get(t.metric)
            if v is not None and not t.holds(v):
                return False
        return True

    def evaluate(self, stats: Mapping[str, float | None]) -> list[SloResult]:
        out = []
        for t in self.terms:
            v = stats.get(t.key)
            out.append(SloResult(t, v, v is not None and t.holds(v)))
        return out

    def met(self, stats: Mapping[str, float | None]) -> bool:
        return all(r.met for r in self.evaluate(stats))

    def __str__(self) -> str:
        return self.text


def parse_slo(text: str) -> SLO:
    """Parse a comma-separated list of terms; raises InputError naming the bad term."""
    terms = []
    for raw in (p for p in text.split(",") if p.strip()):
        m = _TERM.match(raw.lower())
        if not m:
            raise InputError(f"SLO term {raw.strip()!r} is not {_ALLOWED}")
        metric, stat, op, number, unit = m.groups()
        if metric in PER_REQUEST and stat is None:
            raise InputError(
                f"SLO term {raw.strip()!r} needs a statistic: {metric}_p99, {metric}_p10, "
                f"{metric}_median or {metric}_mean"
            )
        if metric in RUN_LEVEL and stat is not None:
            raise InputError(
                f"SLO term {raw.strip()!r}: {metric} is run-level and takes no statistic"
            )
        if metric not in PER_REQUEST and metric not in RUN_LEVEL:
            raise InputError(f"SLO term {raw.strip()!r}: unknown metric {metric!r}; {_ALLOWED}")
        try:
            value = float(number)
        except ValueError:
            raise InputError(f"SLO term {raw.strip()!r}: {number!r} is not a number") from None
        if stat and stat.startswith("p") and not 0 <= float(stat[1:]) <= 100:
            raise InputError(f"SLO term {raw.strip()!r}: percentile must be between 0 and 100")
        if PER_REQUEST.get(metric) == "ms":
            if unit and unit not in _TIME_UNITS:
                raise InputError(f"SLO term {raw.strip()!r}: time unit {unit!r} is not ms, s or us")
            value *= _TIME_UNITS[unit or "ms"]
        elif unit and unit not in ("tok/s", "req/s", "/s"):
            raise InputError(f"SLO term {raw.strip()!r}: unit {unit!r} is not tok/s or req/s")
        terms.append(SloTerm(metric, stat, op, value, raw.strip()))
    if not terms:
        raise InputError(f"SLO {text!r} has no term; {_ALLOWED}")
    return SLO(tuple(terms), text)
