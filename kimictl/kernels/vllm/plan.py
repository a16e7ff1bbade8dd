"""The CuTe DSL compile units vLLM 0.33.0 builds at start-up for a Kimi K3 deployment.

vLLM compiles K3's specialized decode kernels on every start, on every TP rank, with no persistent
cache of its own: `SpecializedDecode.__init__` / `build_providers()` call `@functools.cache`'d
compile functions whose arguments are the cache keys. This module re-derives those keys from a
DeploymentSpec WITHOUT vLLM, following vLLM 0.33.0's code (file:function named per family), and
groups them by what each kernel really uses (its effective key): units whose vLLM key differs only
in arguments the kernel ignores are duplicates, compiled twice by vLLM for the same code.

tests/test_kernel_plan_vs_vllm.py runs vLLM 0.33.0's own `SpecializedDecode` construction (wheel
sources, CUDA stubbed, every compile function recorded) and checks both the keys and the duplicate
classes against this module for every shipped profile.

Scope (what is derived here): the attention half of each layer (input projection, KDA and MLA
cores, o-projection with its all-reduce) and the AttnRes consumers. NOT derived: the MoE providers
(front, experts, shared experts, tail, small-batch chain, dense MLP), the embedding gather, the L2
prefetch kernel and the low-latency GEMM warmups of `low_latency_gemm.py` on SM100/SM103 (on
sm_90a they are the `skinny_gemm` family, skinny.py, when an arch is given); they are
listed in `NOT_DERIVED` and make every total here a lower bound.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimictl.core.resources import package_path
from kimictl.deployment.spec import DeploymentSpec

__all__ = [
    "DEFAULT_CAPTURE_SIZES",
    "K3Layout",
    "K3_LAYOUT",
    "NOT_DERIVED",
    "CompileUnit",
    "FamilyCount",
    "FamilyTime",
    "KernelPlan",
    "compile_times",
    "plan_report",
    "plan_units",
]

# vLLM 0.33.0 specialized_decode/runtime/providers.py BATCHES
PREPARED_BATCHES: tuple[int, ...] = (*range(1, 9), 16, 32, 64)
# vLLM's CompilationConfig default capture sizes (1, 2, 4, 8, 16, ... 512); only <= 64 matter here.
DEFAULT_CAPTURE_SIZES: tuple[int, ...] = (1, 2, 4, *range(8, 257, 8), *range(272, 513, 16))
HIDDEN = 7168
CAP = 64  # mailbox rows (oproj/prepared.py compile_oproj cap)
# oproj/prepared.py TWOSHOT "33-64:1" / "17-64:1": batches whose all-reduce is two-shot
TWOSHOT_RANGE: dict[int, tuple[int, int]] = {8: (33, 64), 16: (17, 64)}
# moe/small_batch/chain.py SmallBatchBox.batches: the MoE front publishes at these batches
SMALL_BATCH_BATCHES: dict[int, tuple[int, ...]] = {8: (1,), 16: (1, 2)}

NOT_DERIVED: tuple[tuple[str, str], ...] = (
    ("moe", "MoE front, routed/shared experts, tail and small-batch chain (cutedsl/moe/*)"),
    ("dense_mlp", "first-layer dense MLP (cutedsl/moe/dense.py)"),
    ("embedding", "embedding gather (cutedsl/common/embedding.py)"),
    ("prefetch", "L2 weight prefetch (cutedsl/common/prefetch.py)"),
    (
        "low_latency_gemm",
        "skinny GEMM warmups of low_latency_gemm.py on SM100/SM103 (sm_90a: family skinny_gemm "
        "with --arch) and the KDA skinny GEMMs",
    ),
    ("attn_res_aux", "AttnRes variants for the aux hidden-state layers a DSpark draft reads"),
)


@dataclass(frozen=True)
class K3Layout:
    """What vLLM's K3 decoder layers derive from the model's config (nvidia/model.py:
    is_moe_layer, is_block_write_layer, prev_valid_blocks; kimi_linear.py: is_kda_layer).

    The default is an ASSUMPTION (no K3 checkpoint config here): 93 layers, the 24 MLA layers at
    1-based positions 4, 8, ..., 92 and 93, AttnRes blocks of 12 layers (the largest block count
    vLLM's o-proj consumer accepts is 8 = ceil(93 / 12)), first layer dense."""

    num_layers: int = 93
    mla_layers: tuple[int, ...] = (*range(3, 92, 4), 92)  # 0-based
    attn_res_block_size: int = 12
    first_k_dense_replace: int = 1
    moe_layer_freq: int = 1
    heads: int = 96
    head_dim: int = 128

    def is_mla(self, i: int) -> bool:
        return i in self.mla_layers

    def is_moe(self, i: int) -> bool:
        return i >= self.first_k_dense_replace and i % self.moe_layer_freq == 0

    def is_block_write(self, i: int) -> bool:
        return i % self.attn_res_block_size == 0

    def prev_valid_blocks(self, i: int) -> int:
        return -(-i // self.attn_res_block_size)

    @property
    def num_attn_res_blocks(self) -> int:
        return -(-self.num_layers // self.attn_res_block_size)


K3_LAYOUT = K3Layout()


@dataclass(frozen=True)
class CompileUnit:
    """One entry of one of vLLM's compile caches: `key` is vLLM's cache key (arguments of the
    compile function, device/arch arguments left out); `effective` is what the compiled code
    depends on; `kernels` counts `cute.compile` calls behind the unit."""

    family: str
    key: tuple[Any, ...]
    effective: tuple[Any, ...]
    kernels: int = 1


@dataclass(frozen=True)
class FamilyCount:
    family: str
    units: int  # distinct vLLM keys: what vLLM compiles
    distinct: int  # distinct effective keys: what needs compiling
    kernels: int  # cute.compile calls vLLM makes

    @property
    def duplicates(self) -> int:
        return self.units - self.distinct


@dataclass
class KernelPlan:
    tp: int
    dcp: int
    q: int
    batches: tuple[int, ...]
    specialized: bool
    units: list[CompileUnit] = field(default_factory=list)

    def families(self) -> list[FamilyCount]:
        out = []
        for fam in dict.fromkeys(u.family for u in self.units):
            mine = [u for u in self.units if u.family == fam]
            distinct = len({u.effective for u in mine})
            out.append(FamilyCount(fam, len(mine), distinct, sum(u.kernels for u in mine)))
        return out


def _batches(q: int, capture_sizes: tuple[int, ...]) -> tuple[int, ...]:
    """decode.py SpecializedDecode.__init__: prepared batches plus each captured size (rounded up
    to whole requests of q tokens) up to 64."""
    rounded = {math.ceil(s / q) * q for s in capture_sizes}
    return tuple(sorted({*PREPARED_BATCHES, *(m for m in rounded if m <= PREPARED_BATCHES[-1])}))


def _projection_policies(tp: int, rows: int, batches: tuple[int, ...]) -> dict[int, tuple]:
    """providers.py projection_policies: split-K (M tile, N tile, split, stages) per batch."""
    policies = {}
    for batch in batches:
        n = next(b for b in (8, 16, 32, 64) if batch <= b)
        if rows == 6288 and (tp == 8 or n > 8):
            tactic = (64, 64, 1, 6) if n == 64 else (128, n, 2, 5 if n == 32 else 6)
        else:
            stages = {8: 8, 16: 10, 32: 8, 64: 6 if rows == 3216 else 5}[n]
            tactic = (64, n, 4 if n == 8 else 2, stages)
        policies[batch] = tactic
    return policies


def _kda_pitch(tp: int, layout: K3Layout) -> int:
    """Rows of the packed KDA projection in_proj_qkvgfab: Q, K, V, G (4 x heads x 128), F_A
    (128) and beta (one per head), padded to 16 (6288 at TP8, 3216 at TP16)."""
    h = layout.heads // tp
    return math.ceil((4 * h * layout.head_dim + 128 + h) / 16) * 16


def _mla_pitch(tp: int, layout: K3Layout) -> int:
    """Rows of MLA's fused_qkv_a_g_proj: q_a (1536) + kv_a (576) + gate (heads x 128)."""
    return 2112 + layout.heads // tp * layout.head_dim


def _oproj_units(tp, k, nb, delta, mla, publish_at, batches, twoshots):
    """oproj/prepared.py PreparedOproj.__init__ -> compile_oproj; effective keys from the
    kernels compile_oproj builds (producer(), OprojConsumer, OprojFused) and their fake args."""
    for b in batches:
        fused = tp == 16 and (not mla or b >= 5) and b <= 8
        twoshot = b in twoshots and not fused
        for kind in ("fused",) if fused else ("producer", "consumer"):
            front = b in publish_at and kind != "producer"
            key = (kind, k, b, tp, nb, delta, mla, front, CAP, twoshot)
            if kind == "producer":
                if b <= 8:
                    staged = 0 if tp == 16 else 4 if mla else 8
                    kernel: tuple = ("OprojProducer", k, staged, twoshot)
                elif tp == 8 and b <= 16:  # engine(): grouped mma.sync
                    kernel = ("OprojProducer", k, 0 if tp == 16 else 2, "rows2", twoshot)
                else:
                    kernel = ("OprojUmma", k, twoshot)
                effective = (*kernel, b, tp)  # x [b, k], w [7168, k], box/recv over tp
            elif kind == "consumer":  # batch only picks the CTA groups; mla and k unused
                groups = 4 if b <= 32 and not twoshot else 1
                effective = ("OprojConsumer", nb, groups, twoshot, delta, tp, front)
            else:
                effective = ("OprojFused", nb, delta, b, k, tp, front)
            yield CompileUnit(f"oproj.{kind}", key, effective)


def _attn_res_units(layout: K3Layout, tp: int) -> list[CompileUnit]:
    """decode.py SpecializedDecode.__init__: PreparedAttnRes.for_target per layer and the final
    one; bind_ring for the AttnRes after every MoE layer (the MoE tail's [1, 64, 7168] output
    ring). attn_res/prepared.py compile_consumer keys (nb, delta, write, final, slots, cap, aux)."""
    keys = []
    n = layout.num_layers
    before = {}
    for i in range(n):
        write = i // layout.attn_res_block_size if layout.is_block_write(i) else -1
        before[i] = (layout.prev_valid_blocks(i), i != 0, write, False)
    final = (layout.num_attn_res_blocks, True, -1, True)
    keys += [(*k, 0, 0, False) for k in before.values()]
    keys.append((*final, 0, 0, False))
    followers = [before[i] for i in range(1, n)] + [final]
    for i, consumer in zip(range(n), followers, strict=True):
        if layout.is_moe(i):
            keys.append((*consumer, 1, CAP, False))
    unique = list(dict.fromkeys(keys))
    return [CompileUnit("attn_res", k, k) for k in unique]


def _skinny_family(plan: KernelPlan, arch: str | None) -> None:
    """low_latency_gemm.py's ShapeDynamicSkinnyGemm units (skinny.py): installed by
    the model on SM90/SM100/SM103 whatever the decode backend; derived for sm_90a only."""
    from kimictl.kernels.vllm.skinny import skinny_units

    for unit in (skinny_units(arch, plan.tp) or []) if arch else []:
        plan.units.append(CompileUnit("skinny_gemm", unit.key, unit.effective))


def plan_units(
    spec: DeploymentSpec, layout: K3Layout = K3_LAYOUT, *, arch: str | None = None
) -> KernelPlan:
    """The compile units of `spec`'s specialized decode on SM100/SM103 (none when the deployment
    runs stock decode: decode_backend auto), plus, when `arch` is given, the low-latency skinny
    GEMM units vLLM compiles on that arch (skinny.py; sm_90a only)."""
    tp, dcp, q = (
        spec.tensor_parallel_size,
        spec.decode_context_parallel_size,
        spec.tokens_per_request,
    )
    sizes = tuple(spec.cudagraph_capture_sizes or DEFAULT_CAPTURE_SIZES)
    batches = _batches(q, sizes)
    plan = KernelPlan(tp, dcp, q, batches, spec.decode_backend == "latency_specialized")
    if not plan.specialized or tp not in TWOSHOT_RANGE:
        _skinny_family(plan, arch)
        return plan
    lo, hi = TWOSHOT_RANGE[tp]
    twoshots = {b for b in batches if lo <= b <= hi}
    k = layout.heads // tp * layout.head_dim
    units: dict[tuple, CompileUnit] = {}

    def add(unit: CompileUnit) -> None:
        units.setdefault((unit.family, unit.key), unit)  # vLLM's caches dedupe equal keys

    # additional_config.mla_core picks the stock decode core (trtllm-gen or tokenspeed) between
    # the CuTe query and value kernels; the CuTe units are the same for both.
    queries = (1, q) if q > 1 else (1,)
    for i in range(layout.num_layers):
        mla = layout.is_mla(i)
        pitch = _mla_pitch(tp, layout) if mla else _kda_pitch(tp, layout)
        for tactic in _projection_policies(tp, pitch, batches).values():
            add(CompileUnit("splitk_projection", (tactic, "bfloat16"), (tactic, "bfloat16")))
        for m, (bs, opb, ku) in {1: (128, 4, 1), 2: (64, 4, 2)}.items():  # SkinnyProjection
            cfg = (m, bs, opb, ku, 8, HIDDEN)
            add(CompileUnit("skinny_projection", ("bfloat16", cfg, False), cfg))
        if mla:
            for b in batches:
                for qq in queries:
                    if b % qq:
                        continue
                    key = (b, layout.heads // tp, pitch, dcp if dcp > 1 else 0, qq)
                    add(CompileUnit("mla_core", key, key, kernels=2))
                    if dcp > 1:  # mla/dcp.py compile_value (its own cache) under DCP
                        vkey = (layout.heads // tp, dcp, b, CAP, pitch, qq)
                        add(CompileUnit("mla_dcp_value", vkey, vkey))
        else:
            h = layout.heads // tp
            modes = {b: (1 if b == 1 else 2 if b <= 8 else 0) if tp == 8 else 0 for b in batches}
            kda_keys: list[tuple] = [(b, 1, modes[b]) for b in batches]
            if q > 1:
                kda_keys += [(b // q, q, int(tp == 8)) for b in batches if b % q == 0]
            for reqs, tokens, mode in kda_keys:
                kda_key = (reqs * tokens, h, mode, tokens)
                add(CompileUnit("kda_core", kda_key, kda_key))
        nb = layout.prev_valid_blocks(i) + layout.is_block_write(i)
        publish_at = SMALL_BATCH_BATCHES[tp] if layout.is_moe(i) else ()
        delta = not layout.is_block_write(i)
        for unit in _oproj_units(tp, k, nb, delta, mla, publish_at, batches, twoshots):
            add(unit)
    for unit in _attn_res_units(layout, tp):
        add(unit)
    plan.units = list(units.values())
    _skinny_family(plan, arch)
    return plan


TIMES_FILE = package_path("data", "kernel_compile_times.json")


@dataclass(frozen=True)
class FamilyTime:
    family: str
    seconds_per_kernel: float  # median of the measured samples
    measured: bool  # False: the median of all measured samples stands in (an estimate)
    vllm_seconds: float  # every unit vLLM compiles, per rank per start
    distinct_seconds: float  # one compile per effective key


def compile_times(plan: KernelPlan, path: Path = TIMES_FILE) -> tuple[list[FamilyTime], dict]:
    """Expected compile seconds per family from the per-kernel times measured on this node
    (lab/bench/kernel_compile_times.py); ({}, provenance) parts are empty when never measured."""
    if not path.is_file():
        return [], {}
    doc = json.loads(path.read_text())
    cold: dict[str, list[float]] = doc.get("cold_seconds", {})
    # medians: single samples on a shared machine swing several-fold
    means = {f: statistics.median(v) for f, v in cold.items() if v}
    pooled = [t for v in cold.values() for t in v]
    overall = statistics.median(pooled) if pooled else 0.0
    out = []
    for fam in plan.families():
        per = means.get(fam.family, overall)
        per_unit = fam.kernels / fam.units if fam.units else 1
        out.append(
            FamilyTime(
                fam.family,
                per,
                fam.family in means,
                per * fam.kernels,
                per * per_unit * fam.distinct,
            )
        )
    return out, doc.get("provenance", {})


def plan_report(
    spec: DeploymentSpec, layout: K3Layout = K3_LAYOUT, *, arch: str | None = None
) -> dict[str, Any]:
    """Everything `kimictl kernels plan` shows, as JSON-able data."""
    plan = plan_units(spec, layout, arch=arch)
    times, provenance = compile_times(plan)
    by_family = {t.family: t for t in times}
    families = []
    for fam in plan.families():
        row: dict[str, Any] = {
            "family": fam.family,
            "units": fam.units,
            "distinct": fam.distinct,
            "duplicates": fam.duplicates,
            "kernels": fam.kernels,
        }
        t = by_family.get(fam.family)
        if t is not None:
            row.update(
                seconds_per_kernel=round(t.seconds_per_kernel, 3),
                measured=t.measured,
                vllm_seconds=round(t.vllm_seconds, 1),
                distinct_seconds=round(t.distinct_seconds, 1),
            )
        families.append(row)
    return {
        "specialized": plan.specialized,
        "arch": arch,
        "tp": plan.tp,
        "dcp": plan.dcp,
        "q": plan.q,
        "batches": list(plan.batches),
        "families": families,
        "totals": {
            "units": len(plan.units),
            "distinct": sum(f.distinct for f in plan.families()),
            "kernels": sum(u.kernels for u in plan.units),
            "vllm_seconds": round(sum(t.vllm_seconds for t in times), 1) if times else None,
            "distinct_seconds": round(sum(t.distinct_seconds for t in times), 1) if times else None,
        },
        "not_derived": [{"family": f, "what": w} for f, w in NOT_DERIVED],
        "layout": {
            "num_layers": layout.num_layers,
            "mla_layers": list(layout.mla_layers),
            "attn_res_block_size": layout.attn_res_block_size,
            "first_k_dense_replace": layout.first_k_dense_replace,
            "assumed": layout == K3_LAYOUT,
        },
        "times_provenance": provenance,
    }
