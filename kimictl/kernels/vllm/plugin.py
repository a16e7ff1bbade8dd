"""vLLM general plugin: kimictl's kernels serve vLLM's Kimi K3 decode GEMMs where this node
measured them faster than vLLM's own plan.

vLLM loads every `vllm.general_plugins` entry point in each of its processes and calls it.
`register()` first loads prebuilt CuTe units when KIMICTL_VLLM_PREBUILT names a cache
(prebuilt.py), then routes GEMMs only when KIMICTL_VLLM_KERNELS=1 (a profile renders it from
`[serve] kimictl_kernels = true`). When enabled it wraps vLLM 0.33's
`enable_kimi_k3_low_latency_gemm`: vLLM installs its own per-module plans first, then each
module whose local (N, K) this node measured gets, per M, the fastest of {vLLM's plan, a kimictl
kernel, cuBLAS} from the node's three-way dispatch table (`DispatchTable.choose3`). Everything else
falls through to vLLM's plan: another dtype, batch-invariant mode, no table for this GPU, a bias,
the fused-residual form, a layout or dtype the kernels do not take, and every M vLLM's plan was not
timed at. Above M = 16 vLLM's plan is its cuBLAS fallback, which the bench times as vLLM's plan at
the M it measures (32, 64), so those M are routed like the rest. One place vLLM's plan is not what
the bench timed: in its TP8 KDA layers, under CUDA-graph capture and up to
KDA_PROJECTION_OVERLAP_MAX_TOKENS (14), vLLM runs in_proj_qkvgfab and f_b_proj on two streams
(`run_kda_projection_overlap`) without calling their methods; those (module, M) points are left to
vLLM, in eager steps too. One log line per model says what was installed.

KIMICTL_VLLM_LAYER=1 (`[serve] kimictl_layer = true`) routes the fused layer's front segment
(layer_route.py) into each K3 attention it computes, at the (kind, M) where it measured faster
(`layer_route.SERVED`: MLA at M = 1, 2), before the GEMM routes (which then serve the rest); one
log line per model says where it runs and why not elsewhere.

This module imports neither torch nor vLLM at import time (kimictl's CLI imports it for doctor).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimictl.deployment.spec import KERNELS_ENV_VAR
from kimictl.kernels.toolchain.dispatch import CUBLAS, LLG_MODULE, VLLM, DispatchTable

__all__ = [
    "ENTRY_POINT",
    "ENV_VAR",
    "GROUP",
    "TABLE_ENV_VAR",
    "InstallReport",
    "Route",
    "enabled",
    "module_plan",
    "patch_vllm",
    "plugin_status",
    "register",
    "take_over",
]

GROUP = "vllm.general_plugins"
ENTRY_POINT = "kimictl_kernels"
# both are in checks.hardware.RECORDED_ENV too, so snapshots carry them for doctor
ENV_VAR = KERNELS_ENV_VAR
TABLE_ENV_VAR = "KIMICTL_VLLM_KERNELS_TABLE"  # a dispatch.json to use instead of the node's
# modules that bind the install function by name at import (`from ... import enable_...`)
BOUND_IN = ("vllm.models.kimi_k3.nvidia.model", "vllm.models.kimi_k3.nvidia.mtp")
INSTALL_FN = "enable_kimi_k3_low_latency_gemm"
OVERLAPPED = ("in_proj_qkvgfab", "f_b_proj")  # a KDA layer's projections vLLM may run itself

log = logging.getLogger("vllm.kimictl")  # under vLLM's logger: its handler prints our line


def enabled(env: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get(ENV_VAR, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Route:
    """What runs at one M instead of vLLM's plan."""

    provider: str  # "kimictl" | "cublas"
    kernel: str  # variant name, or "cublas"
    us: float
    vllm_us: float


@dataclass
class InstallReport:
    installed: int = 0  # modules that got at least one kimictl/cuBLAS route
    kept: int = 0  # modules vLLM planned where vLLM's plan measured fastest at every M
    routes: int = 0  # (module, M) points taken over
    overlapped: int = 0  # (module, M) points left to vLLM's KDA projection overlap
    kernels: set[str] = field(default_factory=set)
    skipped: str = ""  # why nothing was installed at all

    def line(self) -> str:
        if self.skipped:
            return f"kimictl kernels: not installed ({self.skipped}); vLLM's plan everywhere"
        names = ", ".join(sorted(self.kernels)) or "none"
        overlap = (
            f"; {self.overlapped} (module, M) points left to vLLM's KDA projection overlap"
            if self.overlapped
            else ""
        )
        return (
            f"kimictl kernels: {self.routes} (module, M) routes on {self.installed} modules "
            f"measured faster than vLLM's plan ({self.kept} modules keep vLLM's plan{overlap}); "
            f"kernels: {names}"
        )


def module_plan(table: DispatchTable, n: int, k: int) -> dict[int, Route]:
    """{M: Route} for the M where the node measured something faster than vLLM's plan (at any M
    the table holds: above 16 vLLM's plan is its cuBLAS fallback, and the bench timed that)."""
    plan: dict[int, Route] = {}
    for m in sorted({mm for nn, kk, mm, res in table.measurements if (nn, kk) == (n, k)}):
        c = table.choose3(n, k, m)
        if c.provider == VLLM or c.us is None:
            continue
        vllm_us = table.measurements[(n, k, m, False)].vllm_us
        plan[m] = Route(c.provider, c.name, c.us, float(vllm_us or 0.0))
    return plan


def _overlapped(llg: Any, module: Any) -> dict[int, int]:
    """{id(projection): M up to which vLLM runs it itself} for each KDA layer where vLLM's install
    enabled its projection overlap (it sets `_projection_overlap_max_tokens`, raised to
    KDA_PROJECTION_OVERLAP_MAX_TOKENS once its kernels are warm)."""
    top = int(getattr(llg, "KDA_PROJECTION_OVERLAP_MAX_TOKENS", 0))
    out: dict[int, int] = {}
    for child in module.modules():
        now = int(getattr(child, "_projection_overlap_max_tokens", 0) or 0)
        if now > 0:
            for name in OVERLAPPED:
                proj = getattr(child, name, None)
                if proj is not None:
                    out[id(proj)] = max(now, top)
    return out


def _servable(x: Any, w: Any, torch: Any) -> bool:
    """The kernels' contract: packed row-major bf16 x [M, K] and w [N, K] on one CUDA device."""
    return (
        x.dim() == 2
        and w.dim() == 2
        and x.dtype == torch.bfloat16
        and w.dtype == torch.bfloat16
        and x.is_cuda
        and w.is_cuda
        and x.device == w.device
        and x.shape[1] == w.shape[1]
        and x.shape[1] % 8 == 0
        and x.stride() == (x.shape[1], 1)
        and w.stride() == (w.shape[1], 1)
    )


_CLASSES: dict[Any, Any] = {}


def _routed_class(base: Any, llg: Any) -> Any:
    """A subclass of vLLM's method class whose apply() takes the routed M and defers the rest
    (bias, residual form, batch-invariant, unroutable layout, other M) to vLLM's own apply."""
    if base in _CLASSES:
        return _CLASSES[base]

    def apply(self: Any, layer: Any, x: Any, bias: Any = None) -> Any:
        route = self._kimictl_routes.get(x.shape[0]) if bias is None else None
        if route is not None and not llg.envs.VLLM_BATCH_INVARIANT:
            torch = llg.torch
            w = layer.weight
            if _servable(x, w, torch):
                if route.provider == CUBLAS:
                    return torch.nn.functional.linear(x, w)
                return torch.ops.kimictl.decode_gemm(x, w, route.kernel)
        return base.apply(self, layer, x, bias)

    cls = type(f"Kimictl{base.__name__}", (base,), {"apply": apply})
    _CLASSES[base] = cls
    return cls


def _route_method(method: Any, routes: dict[int, Route], llg: Any) -> Any:
    cls = _routed_class(type(method), llg)
    new = cls.__new__(cls)
    new.__dict__.update(method.__dict__)  # vLLM's plan, residual plan, gemm impl: kept as built
    new._kimictl_routes = routes
    return new


def _node_table() -> DispatchTable | None:
    import torch

    from kimictl.kernels.toolchain.harness import arch_of
    from kimictl.kernels.toolchain.node import dispatch_table_path

    override = os.environ.get(TABLE_ENV_VAR)
    if override:
        path = Path(override)
    else:
        arch = arch_of(torch.cuda.get_device_capability())
        if arch is None:
            return None
        path = dispatch_table_path(arch)
    return DispatchTable.load(path) if path.is_file() else None


def take_over(
    llg: Any,
    module: Any,
    dtype: Any,
    *,
    table: DispatchTable | None,
    register_ops: Callable[[], Any] | None = None,
) -> InstallReport:
    """Re-route the modules vLLM's install step planned (and unquantized linears it left on
    cuBLAS) where `table` has a three-way measurement faster than vLLM's plan."""
    report = InstallReport()
    torch = llg.torch
    if dtype != torch.bfloat16:
        report.skipped = f"dtype {dtype} is not bfloat16"
        return report
    if llg.envs.VLLM_BATCH_INVARIANT:
        report.skipped = "VLLM_BATCH_INVARIANT is set"
        return report
    if table is None:
        report.skipped = "no kimictl dispatch table for this GPU"
        return report
    planned = (llg.KimiK3LowLatencyLinearMethod, llg.KimiK3LowLatencyEmbeddingMethod)
    overlapped = _overlapped(llg, module)
    for child in module.modules():
        method = getattr(child, "quant_method", None)
        vllm_planned = type(method) in planned
        plain = isinstance(child, llg.LinearBase) and type(method) is llg.UnquantizedLinearMethod
        if not (vllm_planned or plain):
            continue
        weight = getattr(child, "weight", None)
        if weight is None or weight.dim() != 2 or weight.dtype != torch.bfloat16:
            continue
        routes = module_plan(table, int(weight.shape[0]), int(weight.shape[1]))
        upto = overlapped.get(id(child), 0)
        if upto:  # vLLM's overlap runs these M under capture; the bench never timed it
            kept = {m: r for m, r in routes.items() if m > upto}
            report.overlapped += len(routes) - len(kept)
            routes = kept
        if not routes:
            report.kept += vllm_planned
            continue
        if any(r.provider != CUBLAS for r in routes.values()) and register_ops is not None:
            register_ops()
        child.quant_method = _route_method(method, routes, llg)
        report.installed += 1
        report.routes += len(routes)
        report.kernels.update(r.kernel for r in routes.values())
    return report


def _node_layer_variants() -> dict[tuple[str, int], str] | None:
    """Segment f's variants in this node's layer build (None: no build for this GPU)."""
    from kimictl.kernels.toolchain.build import gpu_layer_build, read_manifest
    from kimictl.kernels.vllm.layer_route import front_variants

    found = gpu_layer_build()
    manifest = read_manifest(found) if found is not None else None
    if manifest is None:
        return None
    return front_variants([k["name"] for k in manifest.get("kernels", [])])


def _tp_size() -> int:
    from vllm.distributed import get_tensor_model_parallel_world_size

    return int(get_tensor_model_parallel_world_size())


def patch_vllm(
    llg: Any,
    *,
    table_loader: Callable[[], DispatchTable | None] = _node_table,
    register_ops: Callable[[], Any] | None = None,
    modules: Mapping[str, Any] | None = None,
    gemm: bool = True,
    layer: bool = False,
    tp_size: Callable[[], int] = _tp_size,
    layer_variants: Callable[[], dict[tuple[str, int], str] | None] = _node_layer_variants,
    register_layer_op: Callable[[], Any] | None = None,
    layer_points: Collection[tuple[str, int]] | None = None,
) -> bool:
    """Wrap `llg.enable_kimi_k3_low_latency_gemm` (and the copies already bound by name in
    vLLM's K3 model modules): `layer` routes the fused front segment (layer_route.install),
    then `gemm` re-routes the GEMMs (take_over); `layer_points` overrides the (kind, M) it serves
    (a benchmark's choice). Returns False when it was already wrapped."""
    original = getattr(llg, INSTALL_FN)
    if getattr(original, "__kimictl_wrapped__", False):
        return False
    if register_ops is None:
        from kimictl.kernels.toolchain.torch_ops import register_ops as _register

        register_ops = _register
    if register_layer_op is None:
        from kimictl.kernels.toolchain.torch_ops import register_layer_op as _layer_op

        register_layer_op = _layer_op

    def wrapped(module: Any, dtype: Any) -> None:
        original(module, dtype)
        if layer:
            from kimictl.kernels.vllm.layer_route import SERVED, install

            try:
                routed = install(module, tp_size(), dtype, llg.torch, variants=layer_variants(),
                                 op=register_layer_op, served=layer_points or SERVED)  # fmt: skip
                line, served = routed.line(), routed.served
            except Exception as exc:  # a layout it cannot read must not take the server down
                line, served = f"kimictl layer: not installed ({exc}); vLLM's forward", 0
            # asked for and not served: a warning, not news
            (log.info if served else log.warning)("%s", line)
        if not gemm:
            return
        try:
            report = take_over(llg, module, dtype, table=table_loader(), register_ops=register_ops)
        except Exception as exc:  # a broken table or library must not take the server down
            log.warning("kimictl kernels: not installed (%s); vLLM's plan everywhere", exc)
            return
        log.info("%s", report.line())

    wrapped.__kimictl_wrapped__ = True  # type: ignore[attr-defined]
    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    wrapped.__doc__ = original.__doc__
    setattr(llg, INSTALL_FN, wrapped)
    loaded = sys.modules if modules is None else modules
    for name in BOUND_IN:
        mod = loaded.get(name)
        if mod is not None and getattr(mod, INSTALL_FN, None) is original:
            setattr(mod, INSTALL_FN, wrapped)
    return True


def register() -> None:
    """The `vllm.general_plugins` entry point, called in every vLLM process. First the prebuilt
    CuTe units (KIMICTL_VLLM_PREBUILT, prebuilt.py: before vLLM's warmup compiles), then the
    GEMM routing (KIMICTL_VLLM_KERNELS) and the fused layer's report (KIMICTL_VLLM_LAYER)."""
    from kimictl.kernels.vllm.layer_route import layer_enabled
    from kimictl.kernels.vllm.prebuilt import load_prebuilt

    load_prebuilt()
    gemm, layer = enabled(), layer_enabled()
    if not (gemm or layer):
        return
    import importlib

    try:
        llg = importlib.import_module(LLG_MODULE)
    except Exception as exc:  # not an SM90/SM100 build of vLLM 0.33, or no CUDA: stay out
        log.warning("kimictl kernels: %s not importable (%s); vLLM's plan", LLG_MODULE, exc)
        return
    patch_vllm(llg, gemm=gemm, layer=layer)


def plugin_status(env: Mapping[str, str] | None = None, arch: str | None = None) -> dict[str, Any]:
    """For doctor: is the entry point installed, is it enabled, is there a table for `arch`
    (and how many of its points carry vLLM timings, i.e. are three-way); is the layer switch on,
    and where are the layer kernels built for `arch` (None: not built)."""
    from importlib.metadata import entry_points

    from kimictl.kernels.toolchain.node import dispatch_table_path

    eps = [ep for ep in entry_points(group=GROUP) if ep.name == ENTRY_POINT]
    status: dict[str, Any] = {
        "installed": bool(eps),
        "entry_point": eps[0].value if eps else None,
        "enabled": enabled(env),
        "arch": arch,
        "table": None,
        "three_way_points": 0,
        "layer_enabled": False,
        "layer_build": None,
    }
    from kimictl.kernels.vllm.layer_route import layer_enabled

    status["layer_enabled"] = layer_enabled(env)
    if arch is not None:
        from kimictl.kernels.toolchain.build import find_layer_build

        found = find_layer_build(arch)
        status["layer_build"] = str(found) if found else None
    env_map = os.environ if env is None else env
    override = env_map.get(TABLE_ENV_VAR)
    path = Path(override) if override else (dispatch_table_path(arch) if arch else None)
    if path is not None and path.is_file():
        status["table"] = str(path)
        try:
            table = DispatchTable.load(path)
            status["three_way_points"] = sum(
                m.vllm_us is not None for m in table.measurements.values()
            )
        except (OSError, ValueError, KeyError) as exc:
            status["table_error"] = str(exc)
    return status
