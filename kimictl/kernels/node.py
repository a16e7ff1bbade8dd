"""What `kimictl kernels install|verify|bench` do on a GPU node, and the pinned-stack plan.

Everything here that needs a GPU goes through `require_gpu()`, which raises `Unsupported` with
what is missing (no torch, no CUDA device, no build for this arch), so a laptop or CI box gets one
sentence and exit 1. The stack plan is pure: it reads A's `StackReport` and the driver's CUDA
version and says what pip would install.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimictl.kernels.dispatch import DispatchTable
from kimictl.runtime.checks.stack import CUTLASS_INSTALL
from kimictl.runtime.errors import CheckFailed, InputError, Unsupported
from kimictl.runtime.outputs import read_json_input

__all__ = [
    "KERNEL_STACK",
    "install_stack",
    "node_stack_plan",
    "MIN_DRIVER_CUDA",
    "InstallReport",
    "StackPlan",
    "dispatch_table_path",
    "install_dir",
    "install_kernels",
    "open_node_library",
    "plan_stack",
    "read_dispatch_table",
    "require_gpu",
]

# The kernel stack vLLM 0.33.0 pins; versions come from checks.stack.PINNED.
KERNEL_STACK: tuple[str, ...] = (
    "torch",
    "flashinfer-python",
    "nvidia-cutlass-dsl",
    "quack-kernels",
    "tokenspeed-mla",
)
MIN_DRIVER_CUDA = (13, 0)
DSL_HINT = f'pip install "{CUTLASS_INSTALL}" (or kimictl[build])'


def install_dir() -> Path:
    from kimictl.runtime.paths import cache_dir

    return cache_dir() / "kernels"


def dispatch_table_path(arch: str) -> Path:
    return install_dir() / arch / "dispatch.json"


def read_dispatch_table(path: Path | None, arch: str | None) -> DispatchTable:
    """The table in `path` (a dispatch table, or a `kernels bench --json` report holding one), else
    the one `kimictl kernels install` recorded on this node: for `arch`, or the only one there."""
    if path is None:
        candidates = [dispatch_table_path(arch)] if arch else install_dir().glob("*/dispatch.json")
        found = sorted(f for f in candidates if f.is_file())
        if not found:
            where = f"for {arch} " if arch else ""
            raise Unsupported(
                f"no dispatch table {where}on this node (looked in {install_dir()}).",
                hint="`kimictl kernels install` on the GPU node records one; or pass --from FILE.",
            )
        if len(found) > 1:
            archs = ", ".join(f.parent.name for f in found)
            raise InputError(f"this node has dispatch tables for {archs}: pick one with --arch.")
        path = found[0]
    return read_json_input(
        path, "a kimictl dispatch table or `kernels bench --json` report", _table_from_json
    )


def _table_from_json(raw: Any) -> DispatchTable:
    if isinstance(raw, dict) and "dispatch_table" in raw:
        raw = raw["dispatch_table"]
    return DispatchTable.from_json(raw)


def require_gpu(action: str) -> tuple[Any, str]:
    """(torch, arch) on a node with a supported NVIDIA GPU; Unsupported otherwise."""
    try:
        import torch
    except ImportError as exc:
        raise Unsupported(
            f"`kimictl kernels {action}` needs PyTorch with CUDA on an NVIDIA GPU node; "
            "torch is not installed here",
            hint="run it on the GPU node (pip install kimictl[gpu]); `kimictl kernels build` "
            "works anywhere",
        ) from exc
    if not torch.cuda.is_available():
        raise Unsupported(
            f"`kimictl kernels {action}` needs an NVIDIA GPU; torch sees no CUDA device here",
            hint="run it on the GPU node; `kimictl kernels build --arch ...` works without a GPU",
        )
    from kimictl.kernels.harness import arch_of

    cap = torch.cuda.get_device_capability()
    arch = arch_of(cap)
    if arch is None:
        raise Unsupported(
            f"compute capability {cap[0]}.{cap[1]} has no kimictl kernel build "
            "(supported: 9.0 sm_90a, 10.0 sm_100a, 10.3 sm_103a)"
        )
    return torch, arch


def open_node_library(arch: str, *, build_dir: Path | None = None) -> Any:
    from kimictl.kernels.harness import LinkError, find_build, open_library

    arch_dir = (build_dir / arch) if build_dir else find_build(arch)
    if arch_dir is None or not (arch_dir / "manifest.json").is_file():
        raise Unsupported(
            f"no kernel build for {arch} found (looked in {install_dir()} and the source tree)",
            hint=f"run `kimictl kernels install`, or `kimictl kernels build --arch {arch}`",
        )
    try:
        return open_library(arch_dir)
    except LinkError as exc:
        raise Unsupported(f"linking the kernel library failed: {exc}") from exc


@dataclass
class InstallReport:
    arch: str
    installed_to: Path
    built: bool
    verify: dict[str, Any]
    bench_summary: dict[str, Any] | None
    table_path: Path | None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "installed_to": str(self.installed_to),
            "built": self.built,
            "verify": {k: self.verify[k] for k in ("ok", "checks", "worst_rel_err", "failed")},
            "bench": self.bench_summary,
            "dispatch_table": str(self.table_path) if self.table_path else None,
            "notes": self.notes,
        }


def install_kernels(*, source: Path | None = None, run_bench: bool = True) -> InstallReport:
    """Take (or build) this arch's artifacts into the cache, link, verify, bench, save the table."""
    _torch, arch = require_gpu("install")
    from kimictl.kernels.build import build, dsl_version, read_manifest
    from kimictl.kernels.harness import find_build, open_library
    from kimictl.kernels.verify import verify

    dest = install_dir() / arch
    built = False
    src = (source / arch) if source else find_build(arch)
    if src is None or read_manifest(src) is None:
        if dsl_version() is None:
            raise Unsupported(
                f"no prebuilt kernels for {arch} and the CuTe DSL is not installed to build them",
                hint=f"{DSL_HINT}, or pass --from DIR holding a `kimictl kernels build` output",
            )
        build(arch, install_dir())
        src, built = dest, True
    if src.resolve() != dest.resolve():
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.so", "dispatch.json"))
    lib = open_library(dest, relink=True)
    report = verify(lib)
    vj = report.to_json()
    (dest / "verify.json").write_text(_dumps(vj))
    if not report.ok:
        raise CheckFailed(
            f"kernel verification failed on this node: {len(vj['failed'])} of {vj['checks']} "
            f"checks (worst relative error {report.worst_rel_err:.2e}); no dispatch table written",
            hint=f"details in {dest / 'verify.json'}",
        )
    summary = None
    table_path = None
    if run_bench:
        from kimictl.kernels.bench import bench

        br = bench(lib)
        table_path = dispatch_table_path(arch)
        br.table.save(table_path)
        (dest / "bench.json").write_text(_dumps(br.to_json()))
        s = br.summary()
        summary = {
            "geomean_speedup_dispatched": s["geomean_speedup_dispatched"],
            "points": len(s["points"]),
            "seconds": round(br.seconds, 1),
        }
    notes = [f"DSL {dsl_version() or 'not installed'} on this node"]
    return InstallReport(arch, dest, built, vj, summary, table_path, notes)


def _dumps(obj: Any) -> str:

    return json.dumps(obj, indent=1, default=str)


# ----------------------------------------------------------------------------- the pinned stack


@dataclass(frozen=True)
class StackPlan:
    driver_cuda: str | None
    driver_ok: bool
    driver_reason: str
    packages: list[dict[str, Any]]  # name, spec, installed, status
    pip_argv: list[str] | None  # what install would run; None when nothing is to do

    @property
    def ok(self) -> bool:
        return self.driver_ok and self.pip_argv is None

    def to_json(self) -> dict[str, Any]:
        return {
            "driver_cuda": self.driver_cuda,
            "driver_ok": self.driver_ok,
            "driver_reason": self.driver_reason,
            "packages": self.packages,
            "pip_argv": self.pip_argv,
            "ok": self.ok,
        }


def _parse_cuda(version: str) -> tuple[int, int] | None:
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def plan_stack(stack: Any, driver_cuda: Any, *, python: str | None = None) -> StackPlan:
    """Which of the kernel-stack pins are off, and the single pip command that fixes them.

    `stack` is a kimictl.runtime.checks.stack.StackReport; `driver_cuda` the driver's CUDA version
    ("13.0"), or a falsy Unavailable/None when no driver answered."""
    from kimictl.runtime.checks.stack import PINNED

    if not driver_cuda:
        reason = getattr(driver_cuda, "reason", None) or "no NVIDIA driver answered"
        driver_ok, driver_str = False, None
        driver_reason = f"{reason}: the kernel stack needs a driver supporting CUDA 13"
    else:
        driver_str = str(driver_cuda)
        parsed = _parse_cuda(driver_str)
        driver_ok = parsed is not None and parsed >= MIN_DRIVER_CUDA
        driver_reason = (
            f"driver supports CUDA {driver_str}"
            if driver_ok
            else f"driver supports CUDA {driver_str}; vLLM 0.33.0's torch/cu13 wheels need >= 13.0"
        )
    pins = {p.name: p for p in PINNED}
    rows: list[dict[str, Any]] = []
    installs: list[str] = []
    for name in KERNEL_STACK:
        pin = pins.get(name)
        if pin is None:
            continue
        check = stack.package(name)
        installed = check.installed if check else None
        status = check.status if check else "missing"
        rows.append({"name": name, "spec": pin.spec, "installed": installed, "status": status})
        if status != "ok" and pin.install not in installs:
            installs.append(pin.install)
    argv = [python or sys.executable, "-m", "pip", "install", *installs] if installs else None
    return StackPlan(driver_str, driver_ok, driver_reason, rows, argv)


def _driver_cuda() -> Any:
    from kimictl.runtime.checks.hardware import probe_local

    hw = probe_local(include_stack=False)
    return hw.nodes[0].cuda_driver_version if hw.nodes else None


def node_stack_plan() -> StackPlan:
    """plan_stack for this node: its installed packages and its driver's CUDA version."""
    from kimictl.runtime.checks.stack import probe_stack

    return plan_stack(probe_stack(), _driver_cuda())


def install_stack(plan: StackPlan) -> StackPlan:
    """Run the plan's one pip command, then check the pins again. CheckFailed when pip fails or a
    pin still differs afterwards."""
    if plan.pip_argv is None:
        return plan
    proc = subprocess.run(plan.pip_argv, check=False)
    if proc.returncode != 0:
        raise CheckFailed(f"pip install exited with {proc.returncode}")
    after = node_stack_plan()
    if after.pip_argv is not None:
        differ = ", ".join(p["name"] for p in after.packages if p["status"] != "ok")
        raise CheckFailed(f"pins still differ after pip install: {differ}")
    return after
