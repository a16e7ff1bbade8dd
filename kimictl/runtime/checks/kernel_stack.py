"""The kernel stack vLLM 0.33.0 pins on a GPU node (`kimictl kernels install --stack`).

The plan is pure: it reads a `StackReport` and the driver's CUDA version and says what pip would
install; `install_stack` runs that one pip command and checks the pins again.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from kimictl.core.errors import CheckFailed

__all__ = [
    "KERNEL_STACK",
    "MIN_DRIVER_CUDA",
    "StackPlan",
    "install_stack",
    "node_stack_plan",
    "plan_stack",
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
