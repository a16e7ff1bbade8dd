"""The published K3 figures the decode model must reproduce, and the calibration against them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kimictl.runtime.tuning.model import (
    N_LAYERS,
    PATHS,
    Config,
    PathName,
    _decode_step,
    default_acceptance_rate,
    predict,
    with_path,
)
from kimictl.runtime.tuning.params import PARAMS, param
from kimictl.runtime.tuning.systems import System

__all__ = [
    "FigureCheck",
    "PUBLISHED_LAYER_US",
    "PUBLISHED_NOSPEC_SPEEDUP",
    "PUBLISHED_SPEC_SPEEDUP",
    "PUBLISHED_SPEC_TOKENS_PER_S",
    "PUBLISHED_SYSTEM",
    "calibrate",
    "mean_layer_us",
    "published_checks",
    "published_setups",
]


# --- the published figures the model must reproduce (k3-vllm-facts.md, "Published results") -----
PUBLISHED_LAYER_US: dict[PathName, float] = {"stock": 130.0, "specialized": 69.0}
PUBLISHED_SPEC_TOKENS_PER_S = 840.0  # 16 GB300, batch 1, DSpark synthetic AL 6 (7 draft tokens)
PUBLISHED_SPEC_SPEEDUP = 1.73  # same setup, over stock vLLM
PUBLISHED_NOSPEC_SPEEDUP = (1.88, 1.92)  # TP16, batch 1-2, no speculation
PUBLISHED_SYSTEM = "gb300"


def mean_layer_us(system: System, cfg: Config, path: PathName) -> float:
    """Average time of one of the 93 layers (kernels, data, all-reduces) on `path`."""
    step = _decode_step(system, cfg, path)
    return (step["kernels"] + step["data"] + step["comm"]) / N_LAYERS


def published_setups() -> dict[str, Config]:
    """The configurations the published figures were measured in (16 GB300 = one TP16 replica)."""
    return {
        "layer": Config(tp=16, batch=1),
        "spec": Config(tp=16, batch=1, draft_tokens=7, acceptance=default_acceptance_rate()),
        "nospec_b1": Config(tp=16, batch=1),
        "nospec_b2": Config(tp=16, batch=2),
    }


def calibrate(system: System) -> dict[str, float]:
    """Recompute the fitted PARAMS from the published figures (values to store in PARAMS).

    Step 1: per-kernel overhead of each path = (published layer time - the model's bytes and
    all-reduce time for that layer) / published kernels per layer. Step 2: routing locality by
    bisection so that the spec setup gives the published tokens/s. Does not change PARAMS.
    """
    saved = dict(PARAMS)
    try:
        setups = published_setups()
        fitted: dict[str, float] = {}
        for path in PATHS:
            name = f"kernel_overhead_us_{path}"
            PARAMS[name] = replace(PARAMS[name], value=0.0)
            rest = mean_layer_us(system, setups["layer"], path)
            value = (PUBLISHED_LAYER_US[path] - rest) / param(f"kernels_per_layer_{path}")
            PARAMS[name] = replace(PARAMS[name], value=value)
            fitted[name] = value
        lo, hi = 0.0, 1.0
        for _ in range(50):
            mid = (lo + hi) / 2
            PARAMS["routing_locality"] = replace(PARAMS["routing_locality"], value=mid)
            got = predict(system, setups["spec"]).tokens_per_s_per_user
            lo, hi = (mid, hi) if got < PUBLISHED_SPEC_TOKENS_PER_S else (lo, mid)
        fitted["routing_locality"] = (lo + hi) / 2
        return fitted
    finally:
        PARAMS.clear()
        PARAMS.update(saved)


@dataclass(frozen=True)
class FigureCheck:
    """One published figure against the model: `in_sample` when a fitted parameter targets it."""

    name: str
    published: float
    predicted: float
    in_sample: bool
    low: float | None = None  # for a published range, its ends
    high: float | None = None

    @property
    def error(self) -> float:
        """Relative error; 0 inside a published range, else against the nearer end."""
        if self.low is not None and self.high is not None:
            if self.low <= self.predicted <= self.high:
                return 0.0
            end = self.low if self.predicted < self.low else self.high
            return (self.predicted - end) / end
        return (self.predicted - self.published) / self.published

    def to_json(self) -> dict[str, Any]:
        return {
            "figure": self.name,
            "published": self.published,
            "published_range": [self.low, self.high] if self.low is not None else None,
            "predicted": round(self.predicted, 3),
            "error": round(self.error, 4),
            "in_sample": self.in_sample,
        }


def published_checks(system: System) -> list[FigureCheck]:
    """The model against every published figure (k3-vllm-facts.md), on `system` (gb300)."""
    setups = published_setups()
    checks = [
        FigureCheck(
            f"one layer, {path} (us)",
            PUBLISHED_LAYER_US[path],
            mean_layer_us(system, setups["layer"], path),
            in_sample=True,
        )
        for path in ("stock", "specialized")
    ]
    spec = predict(system, setups["spec"])
    spec_stock = predict(system, with_path(setups["spec"], "stock"))
    checks.append(
        FigureCheck(
            "batch 1, AL 6, 16 GPUs: tokens/s",
            PUBLISHED_SPEC_TOKENS_PER_S,
            spec.tokens_per_s_per_user,
            in_sample=True,
        )
    )
    checks.append(
        FigureCheck(
            "batch 1, AL 6, 16 GPUs: speedup over stock",
            PUBLISHED_SPEC_SPEEDUP,
            spec.tokens_per_s_per_user / spec_stock.tokens_per_s_per_user,
            in_sample=False,
        )
    )
    low, high = PUBLISHED_NOSPEC_SPEEDUP
    for key, batch in (("nospec_b1", 1), ("nospec_b2", 2)):
        own = predict(system, setups[key])
        stock = predict(system, with_path(setups[key], "stock"))
        checks.append(
            FigureCheck(
                f"TP16 batch {batch}, no speculation: speedup over stock",
                (low + high) / 2,
                own.tokens_per_s_per_user / stock.tokens_per_s_per_user,
                in_sample=False,
                low=low,
                high=high,
            )
        )
    return checks
