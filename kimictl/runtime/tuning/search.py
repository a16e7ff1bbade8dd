"""Search TP x DCP x draft tokens x max-num-seqs with the model; Pareto frontier; a choice and why.

Every candidate is one replica of TP GPUs (replicas = gpus / TP) at full load (batch =
max-num-seqs), on the specialized path and on stock. The choice is made at the user's concurrency
(requests in flight across all replicas): under an SLO, the configuration with the most tokens/s
per GPU that meets it; without one, the fastest per user (this is a latency path). Its
max-num-seqs is the largest load that still meets the SLO and fits memory, and the answer says
which of those bound it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from kimictl.core.errors import InputError
from kimictl.deployment import k3
from kimictl.runtime.load.slo import SLO
from kimictl.runtime.tuning.model import (
    MODEL_VERSION,
    Config,
    PathName,
    Prediction,
    acceptance_rate_for,
    default_acceptance_rate,
    fitted_parameters,
    kv_read_us,
    predict,
)
from kimictl.runtime.tuning.systems import System

__all__ = [
    "MAX_NUM_SEQS_GRID",
    "Choice",
    "SearchInputs",
    "SearchResult",
    "model_stats",
    "pareto_front",
    "search",
    "allowed_paths",
]

# max-num-seqs values tried (requests per replica at full load)
MAX_NUM_SEQS_GRID: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class SearchInputs:
    system: System
    gpus: int
    context: int = 8192
    output_len: int = 1024
    concurrency: int = 1
    slo: SLO | None = None
    acceptance_length: float | None = None  # measured AL ...
    acceptance_draft_tokens: int = 7  # ... at this many draft tokens
    paths: tuple[PathName, ...] = ("specialized", "stock")

    def acceptance_rate(self) -> float:
        if self.acceptance_length is None:
            return default_acceptance_rate()
        return acceptance_rate_for(self.acceptance_length, self.acceptance_draft_tokens)

    def to_json(self) -> dict[str, Any]:
        return {
            "system": self.system.name,
            "gpus": self.gpus,
            "context": self.context,
            "output_len": self.output_len,
            "concurrency": self.concurrency,
            "slo": str(self.slo) if self.slo else None,
            "acceptance_length": self.acceptance_length,
            "acceptance_length_assumed": self.acceptance_length is None,
            "acceptance_draft_tokens": self.acceptance_draft_tokens,
            "acceptance_rate_per_position": round(self.acceptance_rate(), 4),
        }


def model_stats(pred: Prediction, replicas: int = 1) -> dict[str, float]:
    """The model's figures under the SLO keys of kimictl.runtime.load.slo (canonical units).

    The model predicts means; every percentile of a per-request metric gets that mean (it has no
    spread model), which the output says.
    """
    cfg = pred.config
    interactivity = pred.tokens_per_s_per_user
    tpot_ms = 1000.0 / interactivity
    itl_ms = pred.step_us / 1000.0  # one streamed chunk per step, carrying AL tokens
    e2el_ms = pred.ttft_ms + max(cfg.output_len - 1, 0) * tpot_ms
    stats: dict[str, float] = {
        "output_throughput": pred.tokens_per_s * replicas,
        "throughput_per_gpu": pred.tokens_per_s_per_gpu,
        "request_throughput": pred.tokens_per_s * replicas / cfg.output_len,
    }
    for metric, value in (
        ("interactivity", interactivity),
        ("tpot", tpot_ms),
        ("itl", itl_ms),
        ("ttft", pred.ttft_ms),
        ("e2el", e2el_ms),
    ):
        stats[f"{metric}_mean"] = value
        stats[f"{metric}_median"] = value
        for pct in (1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9):
            stats[f"{metric}_p{pct:g}"] = value
    return stats


def _meets(slo: SLO | None, pred: Prediction, replicas: int) -> bool:
    if slo is None:
        return True
    stats = model_stats(pred, replicas)
    for term in slo.terms:
        key = term.key
        if key not in stats and term.stat and term.stat.startswith("p"):
            key = f"{term.metric}_mean"  # any other percentile: the model's mean
        stats.setdefault(term.key, stats[key])
    return slo.met(stats)


def pareto_front(points: Iterable[Prediction]) -> list[Prediction]:
    """Predictions no other beats on both tokens/s/user and tokens/s/GPU, by interactivity."""
    ordered = sorted(points, key=lambda p: (-p.tokens_per_s_per_user, -p.tokens_per_s_per_gpu))
    front: list[Prediction] = []
    best_gpu = -math.inf
    for pred in ordered:
        if pred.tokens_per_s_per_gpu > best_gpu:
            front.append(pred)
            best_gpu = pred.tokens_per_s_per_gpu
    return front


@dataclass(frozen=True)
class Choice:
    config: Config  # at the user's concurrency per replica
    max_num_seqs: int
    replicas: int
    prediction: Prediction  # at the user's concurrency
    stock: Prediction  # the same configuration on stock vLLM, same load
    bound_by: str  # "slo" | "memory" | "fast-path" | "load" | "grid"
    why: list[str] = field(default_factory=list)
    fast_path_limit: int = 0  # requests per replica beyond which every step leaves the fast path

    def to_json(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "path": cfg.path,
            "tensor_parallel_size": cfg.tp,
            "decode_context_parallel_size": cfg.dcp,
            "num_speculative_tokens": cfg.draft_tokens,
            "max_num_seqs": self.max_num_seqs,
            "replicas": self.replicas,
            "concurrency_per_replica": cfg.batch,
            "predicted": self.prediction.predicted(),
            "detail": self.prediction.to_json(),
            "stock": self.stock.predicted(),
            "speedup_over_stock": round(
                self.prediction.tokens_per_s_per_user / self.stock.tokens_per_s_per_user, 3
            ),
            "fallback_share": round(self.prediction.fallback_share, 4),
            "fast_path_limit": self.fast_path_limit,
            "bound_by": self.bound_by,
            "why": self.why,
        }


@dataclass(frozen=True)
class SearchResult:
    inputs: SearchInputs
    candidates: list[Prediction]
    pareto: list[Prediction]
    choice: Choice | None
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "model_version": MODEL_VERSION,
            "inputs": self.inputs.to_json(),
            "candidates": [_row(p, self.inputs.gpus) for p in self.candidates],
            "pareto": [_row(p, self.inputs.gpus) for p in self.pareto],
            "choice": self.choice.to_json() if self.choice else None,
            "notes": self.notes,
            "fitted_parameters": fitted_parameters(self.inputs.system),
        }


def _row(pred: Prediction, gpus: int) -> dict[str, Any]:
    cfg = pred.config
    return {
        "path": cfg.path,
        "tp": cfg.tp,
        "dcp": cfg.dcp,
        "draft_tokens": cfg.draft_tokens,
        "max_num_seqs": cfg.batch,
        "replicas": gpus // cfg.tp,
        **pred.predicted(),
        "fallback_share": round(pred.fallback_share, 4),
        "fits_memory": pred.fits_memory,
    }


def allowed_paths(system: System, tp: int) -> dict[PathName, str | None]:
    """Each path -> None when it can run, else the reason it cannot."""
    reasons: dict[PathName, str | None] = {"stock": None, "specialized": None}
    if not system.specialized_supported:
        reasons["specialized"] = (
            f"{system.gpu} is compute capability {system.compute_capability[0]}."
            f"{system.compute_capability[1]}; the specialized decode needs 10.x (vLLM: "
            f"'{k3.unsupported_message(k3.RULES[0].reason)}')"
        )
    elif tp > system.nvlink_domain:
        reasons["specialized"] = (
            f"TP{tp} spans more than one NVLink domain of {system.nvlink_domain} GPUs on "
            f"{system.name}; all TP ranks must share one"
        )
    return reasons


def _capacity(
    system: System, cfg: Config, slo: SLO | None, replicas: int, limit: int
) -> tuple[int, str]:
    """Largest requests per replica (<= limit) meeting the SLO and memory, and what bound it."""
    memory = predict(system, cfg).max_seqs_by_memory
    best = 0
    lo = 1
    hi = min(limit, memory) if memory > 0 else 0
    # interactivity falls monotonically with load: binary search the last load that meets the SLO
    while lo <= hi:
        mid = (lo + hi) // 2
        if _meets(slo, predict(system, replace(cfg, batch=mid)), replicas):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    if best == 0:
        return 0, "slo" if memory > 0 else "memory"
    if best < min(limit, memory):
        return best, "slo"
    if memory < limit:
        return best, "memory"
    return best, "grid"


def search(inputs: SearchInputs) -> SearchResult:
    """Evaluate the grid, build the Pareto frontier and choose a profile for `inputs`."""
    system = inputs.system
    tps = [tp for tp in k3.ALLOWED_TP if inputs.gpus % tp == 0]
    if not tps:
        raise InputError(
            f"{inputs.gpus} GPU(s) (from --gpus or the snapshot) cannot hold whole TP8 or TP16 "
            f"replicas; allowed: a multiple of {min(k3.ALLOWED_TP)} GPUs (replicas = gpus / TP)."
        )
    rate = inputs.acceptance_rate()
    notes: list[str] = []
    if inputs.acceptance_length is None:
        notes.append(
            f"acceptance length ASSUMED {6.0:g} at 7 draft tokens (the published synthetic "
            f"figure); pass --draft-acceptance with your workload's measured AL"
        )
    notes.append("the model predicts means: every percentile in an SLO is checked against the mean")
    candidates: list[Prediction] = []
    for tp in tps:
        reasons = allowed_paths(system, tp)
        for path in inputs.paths:
            if reasons[path]:
                note = f"{path} path skipped for TP{tp}: {reasons[path]}"
                if note not in notes:
                    notes.append(note)
                continue
            for dcp in sorted({1, tp}):
                for draft in range(k3.MAX_SPECULATIVE_TOKENS + 1):
                    for seqs in MAX_NUM_SEQS_GRID:
                        cfg = Config(
                            tp=tp,
                            batch=seqs,
                            dcp=dcp,
                            draft_tokens=draft,
                            acceptance=rate,
                            context=inputs.context,
                            output_len=inputs.output_len,
                            path=path,
                        )
                        candidates.append(predict(system, cfg))
    feasible = [p for p in candidates if p.fits_memory]
    if not feasible:
        notes.append(
            f"nothing fits: the weights plus one request's KV cache at context {inputs.context} "
            f"exceed {system.name}'s memory at every TP"
        )
    return SearchResult(
        inputs=inputs,
        candidates=candidates,
        pareto=pareto_front(feasible),
        choice=_choose(inputs, feasible, rate, notes),
        notes=notes,
    )


def _choose(
    inputs: SearchInputs, feasible: list[Prediction], rate: float, notes: list[str]
) -> Choice | None:
    system = inputs.system
    preferred: PathName = "specialized" if "specialized" in inputs.paths else "stock"
    if not any(p.config.path == preferred for p in feasible):
        preferred = "stock"
    shapes = sorted(
        {
            (p.config.tp, p.config.dcp, p.config.draft_tokens)
            for p in feasible
            if p.config.path == preferred
        }
    )
    scored: list[tuple[Prediction, int]] = []
    for tp, dcp, draft in shapes:
        replicas = inputs.gpus // tp
        load = max(1, math.ceil(inputs.concurrency / replicas))
        cfg = Config(
            tp=tp,
            batch=load,
            dcp=dcp,
            draft_tokens=draft,
            acceptance=rate,
            context=inputs.context,
            output_len=inputs.output_len,
            path=preferred,
        )
        pred = predict(system, cfg)
        if pred.fits_memory:
            scored.append((pred, replicas))
    if not scored:
        return None
    meeting = [(p, r) for p, r in scored if _meets(inputs.slo, p, r)]
    if inputs.slo is not None and meeting:
        best, replicas = max(
            meeting, key=lambda pr: (pr[0].tokens_per_s_per_gpu, pr[0].tokens_per_s_per_user)
        )
        objective = f"most tokens/s/GPU among configurations meeting the SLO '{inputs.slo}'"
    else:
        if inputs.slo is not None:
            notes.append(
                f"no configuration meets the SLO '{inputs.slo}' at concurrency "
                f"{inputs.concurrency}; showing the fastest per user instead"
            )
        best, replicas = max(
            scored, key=lambda pr: (pr[0].tokens_per_s_per_user, pr[0].tokens_per_s_per_gpu)
        )
        objective = "most tokens/s/user (no SLO given, or none met)"
    cfg = best.config
    fast_limit = k3.MAX_PREPARED_TOKENS // cfg.q
    slo_for_capacity = inputs.slo if meeting else None
    capacity, bound = _capacity(system, cfg, slo_for_capacity, replicas, MAX_NUM_SEQS_GRID[-1])
    if slo_for_capacity is None:
        # latency first: keep every step on the fast path unless the user's load needs more
        capacity = min(fast_limit, best.max_seqs_by_memory)
        bound = "fast-path" if capacity == fast_limit else "memory"
    if capacity < cfg.batch:
        capacity, bound = cfg.batch, "load"
    stock = predict(system, replace(cfg, path="stock"))
    why = _explain(inputs, best, scored, objective, capacity, bound, fast_limit, replicas)
    return Choice(
        config=cfg,
        max_num_seqs=capacity,
        replicas=replicas,
        prediction=best,
        stock=stock,
        bound_by=bound,
        why=why,
        fast_path_limit=fast_limit,
    )


def _best_where(scored: list[tuple[Prediction, int]], **fixed: int) -> Prediction | None:
    rows = [
        p for p, _ in scored if all(getattr(p.config, key) == value for key, value in fixed.items())
    ]
    return max(rows, key=lambda p: p.tokens_per_s_per_user) if rows else None


def _explain(
    inputs: SearchInputs,
    best: Prediction,
    scored: list[tuple[Prediction, int]],
    objective: str,
    capacity: int,
    bound: str,
    fast_limit: int,
    replicas: int,
) -> list[str]:
    cfg = best.config
    why = [f"objective: {objective}"]
    other_tp = _best_where(scored, tp=16 if cfg.tp == 8 else 8)
    if other_tp is not None:
        why.append(
            f"TP{cfg.tp} over TP{other_tp.config.tp}: {best.tokens_per_s_per_user:.0f} vs "
            f"{other_tp.tokens_per_s_per_user:.0f} tokens/s/user, {best.tokens_per_s_per_gpu:.0f} "
            f"vs {other_tp.tokens_per_s_per_gpu:.0f} tokens/s/GPU at this load"
        )
    other_dcp = _best_where(scored, tp=cfg.tp, dcp=cfg.tp if cfg.dcp == 1 else 1,
                            draft_tokens=cfg.draft_tokens)  # fmt: skip
    if other_dcp is not None and cfg.tp > 1:
        share = _kv_share(inputs.system, best)
        kv = f"the {inputs.context}-token KV read is {share:.1%} of the step"
        why.append(
            f"DCP {cfg.dcp} over DCP {other_dcp.config.dcp}: "
            f"{best.tokens_per_s_per_user:.0f} vs {other_dcp.tokens_per_s_per_user:.0f} "
            f"tokens/s/user ({kv}); DCP {cfg.tp} also holds {cfg.tp}x the context per request"
        )
    no_draft = _best_where(scored, tp=cfg.tp, dcp=cfg.dcp, draft_tokens=0)
    if cfg.draft_tokens and no_draft is not None:
        why.append(
            f"{cfg.draft_tokens} draft tokens: {best.tokens_per_step:.2f} tokens per step give "
            f"{best.tokens_per_s_per_user:.0f} tokens/s/user vs "
            f"{no_draft.tokens_per_s_per_user:.0f} without speculation"
        )
    elif not cfg.draft_tokens:
        why.append("no speculation: at this load drafting costs more than accepted tokens return")
    load = cfg.batch
    bound_text = {
        "slo": "the SLO: one more request per replica breaks it",
        "memory": "memory: the KV cache and KDA state of one more request do not fit",
        "fast-path": f"the fast path: beyond {fast_limit} requests x {cfg.q} tokens = "
        f"{fast_limit * cfg.q} tokens per step exceed the largest prepared batch "
        f"({k3.MAX_PREPARED_TOKENS}) and every step runs stock",
        "grid": f"the search limit ({MAX_NUM_SEQS_GRID[-1]})",
        "load": f"the requested concurrency ({inputs.concurrency} over {replicas} replica(s))",
    }[bound]
    if bound == "slo" and capacity == fast_limit:
        bound_text += f" (request {capacity + 1} pushes the step past 64 tokens, off the fast path)"
    why.append(f"max-num-seqs {capacity} per replica ({replicas} replica(s)) bound by {bound_text}")
    why.append(
        f"at concurrency {inputs.concurrency} ({load} per replica) "
        f"{best.fallback_share:.1%} of steps fall back to stock (prefills"
        f"{' and steps over 64 tokens' if load * cfg.q > k3.MAX_PREPARED_TOKENS else ''})"
    )
    return why


def _kv_share(system: System, pred: Prediction) -> float:
    """Share of the decode step spent reading the MLA KV cache."""
    return kv_read_us(system, pred.config) / pred.decode_step_us
