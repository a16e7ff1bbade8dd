"""Per-shape choice between kimictl's kernels and cuBLAS, from the node's measured table.

The rule is deliberately dull: for an (N, K, M[, residual]) point, take the fastest measured
kimictl variant only if it was measured strictly faster than cuBLAS on this node; otherwise, and
for every point nobody measured, cuBLAS. Nothing is extrapolated from other shapes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimictl.core.outputs import atomic_write

__all__ = [
    "K3_GEMM_SHAPES",
    "family_of",
    "pick_family_set",
    "pick_chain_plan",
    "descend",
    "CHAIN_PLANS",
    "CHAIN_WORDS",
    "decode_gemm",
    "routes",
    "BENCH_MS",
    "Choice",
    "VLLM",
    "DispatchTable",
    "Measurement",
    "geomean",
    "ALL_FAMILIES",
    "CHAIN_KIMICTL",
    "CHAIN_MIX",
    "CHAIN_TUNED",
    "CHAIN_VLLM",
    "CUBLAS",
    "LLG_MODULE",
]

# (name, N, K) per GPU, TP8 unless the name says otherwise
K3_GEMM_SHAPES: tuple[tuple[str, int, int], ...] = (
    ("fused_qkv_a", 2112, 7168),
    ("kda_in_tp8", 12448, 7168),
    ("kda_in_tp16", 6288, 7168),
    ("mla_q_b", 2304, 1536),
    ("o_proj", 7168, 1536),
    ("moe_latent_down", 3584, 7168),
    ("moe_latent_down_tp8", 448, 7168),
    ("moe_latent_up", 7168, 3584),
    ("shared_gate_up", 1536, 7168),
    ("shared_down", 7168, 768),
    ("router", 896, 7168),
    ("lm_head", 20480, 7168),
)
BENCH_MS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
CUBLAS = "cublas"
VLLM = "vllm"
# vLLM 0.33.0's K3 decode-GEMM plan: the VLLM provider
LLG_MODULE = "vllm.models.kimi_k3.nvidia.low_latency_gemm"


ALL_FAMILIES = "all"  # layer-chain candidate: every family (the per-point winners)
CHAIN_MARGIN = 0.02  # a restricted family set must beat "all" by more than run-to-run noise
VLLM_MARGIN = 0.02  # a kernel replaces vLLM's plan only when faster by more than run-to-run noise

# Three-way layer-chain plans, one kept per M (`chain_ms`): per-cell winners from different
# providers lose PDL overlap at kernel boundaries, so the fastest cells need not make the fastest
# layer; the bench times the whole layer under each plan and the table keeps the fastest.
CHAIN_VLLM = "vllm"  # vLLM's plan at every cell
CHAIN_MIX = "mix"  # per cell, choose3's cell rule (the default where no chain was measured)
CHAIN_KIMICTL = "kimictl"  # the two-way picks (kimictl kernel or cuBLAS), never vLLM's plan
# per cell, the provider a search over the whole chain settled on (`chain_cells`, descend)
CHAIN_TUNED = "tuned"
CHAIN_PLANS: tuple[str, ...] = (CHAIN_VLLM, CHAIN_MIX, CHAIN_KIMICTL, CHAIN_TUNED)  # tie-break
CHAIN_WORDS = {
    CHAIN_VLLM: "vLLM's plan",
    CHAIN_MIX: "per-projection three-way picks",
    CHAIN_KIMICTL: "kimictl's picks (kernel or cuBLAS)",
    CHAIN_TUNED: "per-projection picks searched in the whole layer chain",
}
TUNE_GAIN = 0.003  # descend moves a pick only for a chain (or layer) this much faster


def descend(
    cands: dict[Any, list[str]],
    picks: dict[Any, str],
    evaluate: Callable[[], float | None],
    *,
    gain: float = TUNE_GAIN,
    passes: int = 2,
) -> list[dict[str, Any]]:
    """Coordinate descent over the picks of a chain of kernels whose neighbours interact (PDL
    overlap at each boundary): each key in turn takes each of its candidates with the others
    fixed, `evaluate()` times the whole chain (None: that candidate failed), and the pick moves
    only for a gain above `gain`; a pass that moves nothing ends it. Sets `picks` in place and
    returns every evaluation. `picks` must hold a start for every key of `cands`."""
    log: list[dict[str, Any]] = []
    best = evaluate()
    log.append({"pass": 0, "start": True, "us": best})
    if best is None:
        return log
    for p in range(passes):
        moved = False
        for key, names in cands.items():
            keep = picks[key]
            for v in names:
                if v == keep:
                    continue
                picks[key] = v
                us = evaluate()
                log.append({"pass": p, "key": _jsonable(key), "pick": v, "us": us})
                if us is not None and us < best * (1 - gain):
                    best, keep, moved = us, v, True
            picks[key] = keep
        if not moved:
            break
    return log


def _jsonable(key: Hashable) -> Any:
    return list(key) if isinstance(key, tuple) else key


def family_of(variant: str) -> str:
    """Kernel family of a variant name (`wgmma_m8_...` -> `wgmma`): names start with it."""
    return variant.split("_", 1)[0]


def pick_family_set(candidates: dict[str, float]) -> tuple[str, tuple[str, ...] | None]:
    """From measured layer-chain times per candidate ("all", "wgmma", "tcstream+wstream", ...):
    the label kept and the families it allows (None = all). A restriction is kept only when its
    chain beat the per-point winners' chain by more than CHAIN_MARGIN."""
    base = candidates[ALL_FAMILIES]
    label = min(candidates, key=lambda c: (candidates[c], c != ALL_FAMILIES))
    if label == ALL_FAMILIES or candidates[label] >= base * (1 - CHAIN_MARGIN):
        return ALL_FAMILIES, None
    return label, tuple(label.split("+"))


def pick_chain_plan(chains: dict[str, float]) -> str:
    """From measured layer-chain times per plan (CHAIN_PLANS keys; unmeasured ones left out): the
    plan kept for that M. vLLM's chain stays unless another beat it by more than CHAIN_MARGIN;
    among the others the fastest measured (ties in CHAIN_PLANS order)."""
    valid = {p: us for p, us in chains.items() if p in CHAIN_PLANS and math.isfinite(us) and us > 0}
    if not valid:
        return CHAIN_MIX
    best = min(valid, key=lambda p: (valid[p], CHAIN_PLANS.index(p)))
    vllm_us = valid.get(CHAIN_VLLM)
    if vllm_us is not None and valid[best] >= vllm_us * (1 - CHAIN_MARGIN):
        return CHAIN_VLLM
    return best


@dataclass(frozen=True)
class Measurement:
    """One grid point: cuBLAS's time and each kimictl variant's, microseconds per GEMM."""

    n: int
    k: int
    m: int
    cublas_us: float
    kernels: dict[str, float] = field(default_factory=dict)
    residual: bool = False
    # vLLM 0.33's own plan for this point (its K3 kernel or its cuBLAS fallback), when timed
    vllm_us: float | None = None

    @property
    def key(self) -> tuple[int, int, int, bool]:
        return (self.n, self.k, self.m, self.residual)


@dataclass(frozen=True)
class Choice:
    provider: str  # "kimictl" | "cublas"
    name: str  # variant name, or "cublas"
    us: float | None  # measured time of the choice (None: not measured)
    cublas_us: float | None
    reason: str

    @property
    def speedup(self) -> float | None:
        if self.us is None or self.cublas_us is None or self.us <= 0:
            return None
        return self.cublas_us / self.us


@dataclass
class DispatchTable:
    device: str
    arch: str
    measurements: dict[tuple[int, int, int, bool], Measurement] = field(default_factory=dict)
    source: str = "measured"
    # M values whose dispatched layer chain measured slower than the cuBLAS chain: all cuBLAS
    guarded_ms: dict[int, str] = field(default_factory=dict)
    # M -> the kernel families allowed at that M, when a layer chain restricted to them measured
    # faster than the chain of per-point winners (families interact at kernel boundaries)
    families_ms: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # M -> the three-way layer-chain plan (CHAIN_PLANS) whose measured chain was fastest
    chain_ms: dict[int, str] = field(default_factory=dict)
    # M -> (N, K) -> VLLM, CUBLAS or a kimictl variant: the cells of a CHAIN_TUNED plan
    chain_cells: dict[int, dict[tuple[int, int], str]] = field(default_factory=dict)

    def add(self, m: Measurement) -> None:
        self.measurements[m.key] = m

    def guard(self, m: int, reason: str) -> None:
        """Send every point of this M to cuBLAS (a chain of the chosen kernels lost to cuBLAS)."""
        self.guarded_ms[m] = reason

    def restrict(self, m: int, families: tuple[str, ...] | None) -> None:
        """Allow only these kernel families at M (None: all of them again)."""
        if families is None:
            self.families_ms.pop(m, None)
        else:
            self.families_ms[m] = tuple(sorted(families))

    def set_chain(self, m: int, plan: str, cells: dict[tuple[int, int], str] | None = None) -> None:
        """choose3 follows `plan` at M (CHAIN_MIX: the per-cell rule, the default); CHAIN_TUNED
        takes its per-(N, K) picks in `cells`."""
        if plan not in CHAIN_PLANS:
            raise ValueError(f"unknown layer-chain plan {plan!r} (one of {', '.join(CHAIN_PLANS)})")
        if (plan == CHAIN_TUNED) != bool(cells):
            raise ValueError(f"cells go with the {CHAIN_TUNED!r} plan, and only with it")
        self.chain_cells.pop(m, None)
        if plan == CHAIN_MIX:
            self.chain_ms.pop(m, None)
            return
        self.chain_ms[m] = plan
        if cells:
            self.chain_cells[m] = dict(cells)

    def choose(self, n: int, k: int, m: int, *, residual: bool = False) -> Choice:
        meas = self.measurements.get((n, k, m, residual))
        if meas is None:
            return Choice(CUBLAS, CUBLAS, None, None, "not measured on this node: cuBLAS")
        if m in self.guarded_ms:
            us = meas.cublas_us if math.isfinite(meas.cublas_us) else None
            return Choice(CUBLAS, CUBLAS, us, us, f"chain guard: {self.guarded_ms[m]}")
        if not math.isfinite(meas.cublas_us) or meas.cublas_us <= 0:
            return Choice(CUBLAS, CUBLAS, None, None, "no valid cuBLAS time: cuBLAS")
        allowed = self.families_ms.get(m)
        valid = {
            k_: v
            for k_, v in meas.kernels.items()
            if math.isfinite(v) and v > 0 and (allowed is None or family_of(k_) in allowed)
        }
        if not valid:
            return Choice(CUBLAS, CUBLAS, meas.cublas_us, meas.cublas_us, "no kimictl kernel for M")
        best = min(valid, key=lambda name: (valid[name], name))
        if valid[best] < meas.cublas_us:
            why = "measured faster than cuBLAS"
            if allowed is not None:
                why += f" (families at M={m}: {', '.join(allowed)}, chosen by the layer chain)"
            return Choice("kimictl", best, valid[best], meas.cublas_us, why)
        return Choice(
            CUBLAS, CUBLAS, meas.cublas_us, meas.cublas_us, f"best kimictl ({best}) not faster"
        )

    def choose3(self, n: int, k: int, m: int, *, residual: bool = False) -> Choice:
        """Three-way, where vLLM's plan was timed on this node (provider "vllm", keep vLLM's plan,
        everywhere else). At an M with a layer-chain plan (`chain_ms`) every cell follows it:
        vLLM's plan, or the two-way pick even where vLLM's plan was faster at that cell, because
        that whole chain measured faster; under CHAIN_TUNED each cell's own pick from the search
        over the whole chain (`chain_cells`). Otherwise per cell: the fastest of {vLLM's plan, the
        best kimictl kernel, cuBLAS}, keeping vLLM's plan unless another was measured faster by
        more than VLLM_MARGIN."""
        meas = self.measurements.get((n, k, m, residual))
        vllm_us = meas.vllm_us if meas is not None else None
        if meas is None or vllm_us is None or not math.isfinite(vllm_us) or vllm_us <= 0:
            return Choice(VLLM, VLLM, None, None, "vLLM's plan not timed on this node: vLLM's plan")
        plan = self.chain_ms.get(m, CHAIN_MIX)
        chain = f"layer chain at M={m}: {plan} measured fastest as a whole"
        if plan == CHAIN_VLLM:
            return Choice(VLLM, VLLM, vllm_us, meas.cublas_us, chain)
        cell = self.chain_cells.get(m, {}).get((n, k)) if not residual else None
        if cell == VLLM:
            return Choice(VLLM, VLLM, vllm_us, meas.cublas_us, chain)
        if cell == CUBLAS:
            return Choice(CUBLAS, CUBLAS, meas.cublas_us, meas.cublas_us, chain)
        if cell is not None and cell in meas.kernels:
            return Choice("kimictl", cell, meas.kernels[cell], meas.cublas_us, chain)
        # a cell the tuned chain does not hold (or a kernel this table never timed): cell rule
        two = self.choose(n, k, m, residual=residual)
        if plan == CHAIN_KIMICTL:
            return Choice(two.provider, two.name, two.us, two.cublas_us, f"{two.reason}; {chain}")
        if two.us is not None and two.us < vllm_us * (1 - VLLM_MARGIN):
            why = f"{two.reason}; beats vLLM's plan ({vllm_us:.2f} us)"
            return Choice(two.provider, two.name, two.us, two.cublas_us, why)
        return Choice(
            VLLM, VLLM, vllm_us, meas.cublas_us, f"nothing measured {VLLM_MARGIN:.0%} faster"
        )

    def grid(self, ms: tuple[int, ...] = BENCH_MS) -> Iterator[tuple[str, int, int, int, Choice]]:
        """(shape, N, K, M, choice) for each of K3's shapes x ms, in K3_GEMM_SHAPES order."""
        for name, n, k in K3_GEMM_SHAPES:
            for m in ms:
                yield name, n, k, m, self.choose(n, k, m)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "arch": self.arch,
            "source": self.source,
            "guarded_ms": {str(m): r for m, r in self.guarded_ms.items()},
            "families_ms": {str(m): list(f) for m, f in self.families_ms.items()},
            "chain_ms": {str(m): p for m, p in self.chain_ms.items()},
            "chain_cells": {
                str(m): {f"{n}x{k}": pick for (n, k), pick in cells.items()}
                for m, cells in self.chain_cells.items()
            },
            "entries": [
                {
                    "n": m.n,
                    "k": m.k,
                    "m": m.m,
                    "residual": m.residual,
                    "cublas_us": m.cublas_us,
                    "kernels": m.kernels,
                    **({"vllm_us": m.vllm_us} if m.vllm_us is not None else {}),
                }
                for m in self.measurements.values()
            ],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> DispatchTable:
        table = cls(str(raw["device"]), str(raw["arch"]), source=str(raw.get("source", "recorded")))
        for m, reason in raw.get("guarded_ms", {}).items():
            table.guard(int(m), str(reason))
        for m, fams in raw.get("families_ms", {}).items():
            table.restrict(int(m), tuple(str(f) for f in fams))
        cells = raw.get("chain_cells", {})
        for m, plan in raw.get("chain_ms", {}).items():
            picks = {_nk(nk): str(v) for nk, v in cells.get(m, {}).items()}
            table.set_chain(int(m), str(plan), picks or None)
        for e in raw["entries"]:
            table.add(
                Measurement(
                    int(e["n"]),
                    int(e["k"]),
                    int(e["m"]),
                    float(e["cublas_us"]),
                    {str(k): float(v) for k, v in e.get("kernels", {}).items()},
                    bool(e.get("residual", False)),
                    float(e["vllm_us"]) if e.get("vllm_us") is not None else None,
                )
            )
        return table

    def save(self, path: Path) -> None:
        atomic_write(path, json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: Path) -> DispatchTable:
        return cls.from_json(json.loads(path.read_text()))


def _nk(text: str) -> tuple[int, int]:
    n, k = text.split("x")
    return int(n), int(k)


def geomean(values: list[float]) -> float:
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    if not vals:
        return float("nan")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def routes(table: DispatchTable) -> dict[str, Any]:
    """Where the table sends each K3 shape x M (the document of `kimictl kernels table --json`).
    `speedup` is cuBLAS time / the choice's time (1.0 where cuBLAS is kept, None unmeasured)."""
    points = [
        {
            "shape": name,
            "n": n,
            "k": k,
            "m": m,
            "provider": c.provider,
            "kernel": c.name,
            "us": c.us,
            "cublas_us": c.cublas_us,
            "speedup": c.speedup,
            "reason": c.reason,
        }
        for name, n, k, m, c in table.grid()
    ]
    speedups = [float(p["speedup"]) for p in points if p["speedup"]]
    head = {key: v for key, v in table.to_json().items() if key != "entries"}
    return {
        **head,
        "points": points,
        "geomean_speedup": geomean(speedups) if speedups else None,
        "kimictl_points": sum(p["provider"] == "kimictl" for p in points),
        "unmeasured_points": sum(p["us"] is None for p in points),
    }


def decode_gemm(
    x: Any, w: Any, *, residual: Any = None, table: DispatchTable, library: Any
) -> tuple[Any, Choice]:
    """y = x @ w^T (+ residual) through whatever the table chose for (N, K, M): a kimictl kernel
    from `library` (a harness.KernelLibrary) or cuBLAS through torch. Returns (y, choice)."""
    import torch
    import torch.nn.functional as F

    m, k = x.shape
    n = w.shape[0]
    choice = table.choose(n, k, m, residual=residual is not None)
    if choice.provider == CUBLAS:
        y = F.linear(x, w) if residual is None else torch.addmm(residual, x, w.t())
        return y, choice
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    library.launch(choice.name, x, w, y, residual if residual is not None else y)
    return y, choice
