"""Timing of kimictl's kernels against cuBLAS on the node's GPU.

Method: each measurement captures one CUDA graph of back-to-back
launches, each on its own weight copy, with enough copies (>= ROTATE_BYTES in all) that no launch
finds its weights in the 60 MB L2; the graph is replayed many times and the median replay divided
by the launches in it is the time per GEMM. cuBLAS is torch.nn.functional.linear (what vLLM calls
for an unquantized projection) and torch.addmm for the fused-residual comparison.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from kimictl.kernels.toolchain.dispatch import (
    ALL_FAMILIES,
    BENCH_MS,
    CHAIN_KIMICTL,
    CHAIN_MIX,
    CHAIN_TUNED,
    CHAIN_VLLM,
    CUBLAS,
    K3_GEMM_SHAPES,
    LLG_MODULE,
    VLLM,
    Choice,
    DispatchTable,
    Measurement,
    descend,
    family_of,
    geomean,
    pick_chain_plan,
    pick_family_set,
)

__all__ = [
    "ROTATE_BYTES",
    "BenchReport",
    "BenchRow",
    "bench",
    "settle_chains",
    "time_graph",
    "tune_chain",
    "vllm_plan",
]

ROTATE_BYTES = 256 << 20  # > 4x the H200's 60 MB L2
MIN_LAUNCHES = 16
REPLAYS = 25


@dataclass(frozen=True)
class BenchRow:
    shape: str
    n: int
    k: int
    m: int
    provider: str  # "cublas", "cublas_addmm" or a kimictl variant name
    residual: bool
    us: float
    tbps: float  # weight bytes / time

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BenchReport:
    device: str
    arch: str
    rows: list[BenchRow]
    table: DispatchTable
    chains: list[dict[str, Any]]
    seconds: float

    def summary(self, ms: tuple[int, ...] = BENCH_MS) -> dict[str, Any]:
        """Dispatched speedup over cuBLAS per grid point and its geometric mean."""
        points: list[dict[str, Any]] = []
        for name, n, k, m, c in self.table.grid(ms):
            if c.cublas_us is None:
                continue
            best_kernel = min(
                (r.us for r in self.rows if (r.n, r.k, r.m) == (n, k, m) and not r.residual
                 and r.provider not in (CUBLAS, "cublas_addmm")),
                default=float("nan"),
            )  # fmt: skip
            points.append(
                {
                    "shape": name,
                    "n": n,
                    "k": k,
                    "m": m,
                    "mb": round(n * k * 2 / 1e6, 1),
                    "cublas_us": c.cublas_us,
                    "cublas_tbps": n * k * 2 / c.cublas_us / 1e6,
                    "best_kernel_us": best_kernel,
                    "best_kernel_tbps": n * k * 2 / best_kernel / 1e6
                    if best_kernel == best_kernel
                    else None,
                    "dispatched": c.name,
                    "dispatched_us": c.us,
                    "speedup": c.speedup,
                }
            )
        return {
            "points": points,
            "geomean_speedup_dispatched": geomean([p["speedup"] for p in points if p["speedup"]]),
            "geomean_speedup_best_kernel_m_le_8": geomean(
                [
                    p["cublas_us"] / p["best_kernel_us"]
                    for p in points
                    if p["m"] <= 8 and p["best_kernel_us"] == p["best_kernel_us"]
                ]
            ),  # fmt: skip
            # the per-point rule alone (no layer-chain restriction): best kernel or cuBLAS
            "geomean_speedup_per_point": geomean(
                [
                    max(1.0, p["cublas_us"] / p["best_kernel_us"])
                    if p["best_kernel_us"] == p["best_kernel_us"]
                    else 1.0
                    for p in points
                ]
            ),
            "slower_than_cublas": [p for p in points if p["speedup"] and p["speedup"] < 1.0],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> BenchReport:
        """A recorded report (bench --json, lab/bench/kernels_h200.py) back into the object."""
        return cls(
            str(raw["device"]),
            str(raw["arch"]),
            [BenchRow(**r) for r in raw["rows"]],
            DispatchTable.from_json(raw["dispatch_table"]),
            list(raw.get("chains", [])),
            float(raw.get("seconds", 0.0)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "arch": self.arch,
            "seconds": round(self.seconds, 1),
            "rows": [r.to_json() for r in self.rows],
            "chains": self.chains,
            "summary": self.summary(),
            "dispatch_table": self.table.to_json(),
        }


def time_graph(launches: list[Callable[[], Any]], *, replays: int = REPLAYS) -> float:
    """Microseconds per launch: median over graph replays of the captured launch sequence."""
    import torch

    for f in launches[:2]:
        f()  # eager warm-up: handles, workspaces, module load
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for f in launches:
            f()
    for _ in range(3):
        graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(replays)]  # fmt: skip
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in events)
    return ms * 1e3 / len(launches)


def vllm_plan(llg: Any = None) -> Callable[[Any, Any], Any] | None:
    """vLLM 0.33.0's own K3 decode-GEMM plan as `run(x, w) -> y`, exactly as its installed
    KimiK3LowLatencyLinearMethod serves a bias-free call: the per-(N, K) plan for this GPU when it
    has an entry for M, else its cuBLAS fallback. None when vLLM (or its K3 module, or a table for
    this GPU) is not there: the bench is then two-way. Uses vLLM 0.33.0's plan helpers (pinned)."""
    if llg is None:
        import importlib

        try:
            llg = importlib.import_module(LLG_MODULE)
        except Exception:  # no vLLM, or a build without the K3 NVIDIA path
            return None
    table = llg._low_latency_table()
    if table is None:
        return None
    plans: dict[tuple[int, int], Any] = {}
    linear = llg.torch.nn.functional.linear

    def run(x: Any, w: Any) -> Any:
        key = (int(w.shape[0]), int(w.shape[1]))
        if key not in plans:
            spec = table.get(key)
            plans[key] = llg._build_plan(spec) if spec is not None else {}
        y = None
        if not llg.envs.VLLM_BATCH_INVARIANT and llg._runtime_ok(x, w):
            y = llg._run_plan(plans[key], x, w)
        return y if y is not None else linear(x, w)

    return run


def _copies(n: int, k: int) -> int:
    return max(1, min(64, math.ceil(ROTATE_BYTES / (n * k * 2))))


def bench(
    lib: Any,
    *,
    shapes: tuple[tuple[str, int, int], ...] = K3_GEMM_SHAPES,
    ms: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64),
    chain_ms: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64),
    log: Callable[[str], None] | None = None,
    vllm: Callable[[Any, Any], Any] | None | bool = True,
) -> BenchReport:
    """Time cuBLAS and every kimictl variant per (shape, M); with vLLM installed (`vllm=True`
    looks for it, or pass `vllm_plan()`'s runner) also vLLM's own plan, making the table
    three-way; `vllm=False` or no vLLM: two-way (log says which)."""
    import torch
    import torch.nn.functional as F

    from kimictl.kernels.toolchain.harness import arch_of

    t0 = time.perf_counter()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    table = DispatchTable(props.name, str(arch_of(torch.cuda.get_device_capability())))
    rows: list[BenchRow] = []
    by_m: dict[tuple[int, bool], list[str]] = {}
    vllm_run = vllm_plan() if vllm is True else (vllm or None)
    if log:
        log("three-way: timing vLLM's own plan too" if vllm_run else "two-way: no vLLM plan timed")
    for name in lib.names:
        e = lib.entry(name)
        by_m.setdefault((int(e["m"]), bool(e["residual"])), []).append(name)

    for shape, n, k in shapes:
        copies = _copies(n, k)
        ws = [torch.randn((n, k), device=dev).to(torch.bfloat16) for _ in range(copies)]
        order = [ws[i % copies] for i in range(max(copies, MIN_LAUNCHES))]  # rotated weights
        for m in ms:
            x = torch.randn((m, k), device=dev).to(torch.bfloat16)
            r = torch.randn((m, n), device=dev).to(torch.bfloat16)
            y = torch.empty((m, n), device=dev, dtype=torch.bfloat16)
            kb = n * k * 2 / 1e3  # weight kB: TB/s = kB / us / 1e3

            cublas_us = time_graph([partial(F.linear, x, w) for w in order])
            rows.append(BenchRow(shape, n, k, m, CUBLAS, False, cublas_us, kb / cublas_us / 1e3))
            kernels: dict[str, float] = {}
            for name in by_m.get((m, False), []):
                us = time_graph([partial(lib.launch, name, x, w, y, y) for w in order])
                rows.append(BenchRow(shape, n, k, m, name, False, us, kb / us / 1e3))
                kernels[name] = us
            vllm_us = None
            if vllm_run is not None:
                vllm_us = time_graph([partial(vllm_run, x, w) for w in order])
            table.add(Measurement(n, k, m, cublas_us, kernels, vllm_us=vllm_us))
            if by_m.get((m, True)):
                addmm_us = time_graph([partial(torch.addmm, r, x, w.t()) for w in order])
                rows.append(
                    BenchRow(shape, n, k, m, "cublas_addmm", True, addmm_us, kb / addmm_us / 1e3)
                )
                res_kernels: dict[str, float] = {}
                for name in by_m[(m, True)]:
                    us = time_graph([partial(lib.launch, name, x, w, y, r) for w in order])
                    rows.append(BenchRow(shape, n, k, m, name, True, us, kb / us / 1e3))
                    res_kernels[name] = us
                table.add(Measurement(n, k, m, addmm_us, res_kernels, residual=True))
            if log:
                c = table.choose(n, k, m)
                log(f"{shape:22s} M={m:2d} cuBLAS {cublas_us:7.2f} us  best {c.name} {c.us} us")
        del ws, order
        torch.cuda.empty_cache()

    chains = [_chain(lib, table, m, shapes, vllm_run) for m in chain_ms if (m, False) in by_m]
    settle_chains(table, chains)
    return BenchReport(props.name, table.arch, rows, table, chains, time.perf_counter() - t0)


def settle_chains(table: DispatchTable, chains: list[dict[str, Any]]) -> None:
    """Per M, from the measured layer-chain candidates: restrict the table to the family set whose
    chain won (pick_family_set), record the choices, and guard an M whose chain lost to cuBLAS.
    Where the three-way chains were timed (`plans`), keep the fastest as that M's chain plan."""
    for chain in chains:
        # per-point winners of different families can lose together (kernel boundaries
        # interact): keep the family set whose measured layer chain was fastest for this M
        best, allowed = pick_family_set(chain["candidates"])
        table.restrict(chain["m"], allowed)
        chain["chosen_families"] = best
        chain["dispatched_us"] = chain["candidates"][best]
        chain["dispatched_tbps"] = chain["bytes"] / chain["dispatched_us"] / 1e6
        chain["speedup"] = chain["cublas_us"] / chain["dispatched_us"]
        chosen = {s: table.choose(n, k, chain["m"]) for s, n, k in chain["layer"]}
        chain["choices"] = {s: c.name for s, c in chosen.items()}
        chain["dispatched_predicted_us"] = sum(c.us or 0.0 for c in chosen.values())
        del chain["layer"]
        # the per-point rule is not enough when neighbours interact: a layer chain of the chosen
        # kernels that loses to cuBLAS sends that M back to cuBLAS everywhere
        if chain["dispatched_us"] > chain["cublas_us"]:
            table.guard(
                chain["m"],
                f"layer chain {chain['dispatched_us']:.1f} us "
                f"vs cuBLAS {chain['cublas_us']:.1f} us",
            )
            chain["guarded"] = True
        plans = chain.get("plans")
        if plans:
            if chain.get("guarded"):
                # the two-way picks are now cuBLAS; the mix was timed on the unguarded picks
                plans = {CHAIN_VLLM: plans[CHAIN_VLLM], CHAIN_KIMICTL: chain["cublas_us"]}
            plan = pick_chain_plan(plans)
            cells = chain.get("tuned_cells", []) if plan == CHAIN_TUNED else []
            table.set_chain(chain["m"], plan, {(int(n), int(k)): str(v) for n, k, v in cells})
            chain["chain_plan"] = plan
            chain["shipped_us"] = plans[plan]


def _chain(
    lib: Any,
    table: DispatchTable,
    m: int,
    shapes: tuple[tuple[str, int, int], ...],
    vllm_run: Callable[[Any, Any], Any] | None = None,
) -> dict[str, Any]:
    """A layer's projections back to back (lm_head excluded): cuBLAS-only vs dispatched (two-way,
    per family set); with `vllm_run` also the three-way plans: vLLM's plan at every projection
    and the per-cell three-way mix (on the family set the two-way chains kept)."""
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda")
    layer = [(s, n, k) for s, n, k in shapes if s != "lm_head"]
    ws = {s: torch.randn((n, k), device=dev).to(torch.bfloat16) for s, n, k in layer}
    xs = {s: torch.randn((m, k), device=dev).to(torch.bfloat16) for s, n, k in layer}
    ys = {s: torch.empty((m, n), device=dev, dtype=torch.bfloat16) for s, n, k in layer}
    total_bytes = sum(n * k * 2 for _, n, k in layer)

    def cub(s: str) -> Callable[[], Any]:
        return partial(F.linear, xs[s], ws[s])

    def dispatched(s: str, n: int, k: int, t: DispatchTable) -> Callable[[], Any]:
        c = t.choose(n, k, m)
        if c.provider == CUBLAS:
            return cub(s)
        return partial(lib.launch, c.name, xs[s], ws[s], ys[s], ys[s])

    def ours_only(s: str, n: int, k: int) -> Callable[[], Any]:
        """The fastest kimictl kernel even where cuBLAS measured faster (isolates interplay)."""
        meas = table.measurements.get((n, k, m, False))
        if meas is None or not meas.kernels:
            return cub(s)
        name = min(meas.kernels, key=lambda v: meas.kernels[v])
        return partial(lib.launch, name, xs[s], ws[s], ys[s], ys[s])

    reps = 4  # the layer repeated so replays see a steady state
    cub_us = time_graph([cub(s) for _ in range(reps) for s, _, _ in layer]) * len(layer)
    # candidate family sets: all (per-point winners), all but one family, one family alone
    fams = sorted({family_of(c.name) for c in (table.choose(n, k, m) for _, n, k in layer)
                   if c.provider != CUBLAS})  # fmt: skip
    sets: dict[str, tuple[str, ...] | None] = {ALL_FAMILIES: None}
    if len(fams) > 1:
        for f in fams:
            sets["+".join(g for g in fams if g != f)] = tuple(g for g in fams if g != f)
            sets[f] = (f,)
    candidates: dict[str, float] = {}
    for label, allowed in sets.items():
        t = copy.deepcopy(table)
        t.restrict(m, allowed)
        us = time_graph([dispatched(s, n, k, t) for _ in range(reps) for s, n, k in layer])
        candidates[label] = us * len(layer)
    ours_us = time_graph([ours_only(s, n, k) for _ in range(reps) for s, n, k in layer])
    ours_us *= len(layer)
    plans: dict[str, float] = {}
    tuned: dict[str, Any] = {}
    if vllm_run is not None:
        kept, allowed_kept = pick_family_set(candidates)  # the set settle_chains will keep
        t3 = copy.deepcopy(table)
        t3.restrict(m, allowed_kept)
        t3.set_chain(m, CHAIN_MIX)

        def mixed(s: str, n: int, k: int) -> Callable[[], Any]:
            c = t3.choose3(n, k, m)
            if c.provider == VLLM:
                return partial(vllm_run, xs[s], ws[s])
            return dispatched(s, n, k, t3)

        vllm_chain: list[Callable[[], Any]] = [
            partial(vllm_run, xs[s], ws[s]) for _ in range(reps) for s, _, _ in layer
        ]
        plans[CHAIN_VLLM] = time_graph(vllm_chain) * len(layer)
        mix_chain = [mixed(s, n, k) for _ in range(reps) for s, n, k in layer]
        plans[CHAIN_MIX] = time_graph(mix_chain) * len(layer)
        plans[CHAIN_KIMICTL] = candidates[kept]
        t3.set_chain(m, pick_chain_plan(plans))

        def cell(s: str, n: int, k: int, pick: str) -> Callable[[], Any]:
            if pick == VLLM:
                return partial(vllm_run, xs[s], ws[s])
            if pick == CUBLAS:
                return cub(s)
            return partial(lib.launch, pick, xs[s], ws[s], ys[s], ys[s])

        def chain_us(cells: dict[tuple[int, int], str]) -> float:
            chain = [cell(s, n, k, cells[(n, k)]) for _ in range(reps) for s, n, k in layer]
            return time_graph(chain) * len(layer)

        tuned = tune_chain(table, t3, m, layer, chain_us)
        plans[CHAIN_TUNED] = tuned.pop("us")
    torch.cuda.empty_cache()
    return {
        "m": m,
        "shapes": [s for s, _, _ in layer],
        "mb": round(total_bytes / 1e6, 1),
        "bytes": total_bytes,
        "layer": layer,  # (shape, N, K); bench() fills the choice fields and drops this
        "cublas_us": cub_us,
        "cublas_tbps": total_bytes / cub_us / 1e6,
        "kimictl_only_us": ours_us,
        "candidates": candidates,
        **({"plans": plans, **tuned} if plans else {}),
    }


def tune_chain(
    table: DispatchTable,
    start: DispatchTable,
    m: int,
    layer: list[tuple[str, int, int]],
    chain_us: Callable[[dict[tuple[int, int], str]], float],
) -> dict[str, Any]:
    """The CHAIN_TUNED plan at M: from `start`'s choose3 picks (the best of the other plans),
    `descend` over each cell's candidates with `chain_us(cells)` timing the whole chain, then the
    settled picks timed afresh (the search kept its luckiest timings). Returns the cells as
    [N, K, pick] rows, that fresh time (`us`) and how many chains the search timed."""
    cells = {(n, k): _provider(start.choose3(n, k, m)) for _, n, k in layer}
    cands = {(n, k): _cell_candidates(table, n, k, m, cells[(n, k)]) for _, n, k in layer}
    log = descend(cands, cells, lambda: chain_us(cells))
    return {
        "tuned_cells": [[n, k, v] for (n, k), v in cells.items()],
        "tune_evaluations": len(log),
        "us": chain_us(cells),
    }


def _provider(c: Choice) -> str:
    """A cell's pick as chain_cells stores it: VLLM, CUBLAS or the kimictl variant."""
    return c.provider if c.provider in (VLLM, CUBLAS) else c.name


CELL_TOP = 4  # kimictl kernels the chain search tries per cell (fastest measured there first)


def _cell_candidates(table: DispatchTable, n: int, k: int, m: int, start: str) -> list[str]:
    """What the chain search tries at a cell: its start, vLLM's plan, the CELL_TOP fastest
    kimictl kernels measured there (any family) and cuBLAS."""
    meas = table.measurements.get((n, k, m, False))
    timed = sorted((us, v) for v, us in (meas.kernels if meas else {}).items()
                   if math.isfinite(us) and us > 0)  # fmt: skip
    return list(dict.fromkeys([start, VLLM, *(v for _, v in timed[:CELL_TOP]), CUBLAS]))
