"""The K3 fast-path rules: deployment flags, hardware and fabric, software stack.

`evaluate()` is the one entry point: doctor and serve's gate call only it. Each part runs when its
input is given (None = not checked); every failing rule is reported, not just the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kimictl.runtime.checks.rules.base import Check, Section, Status, verdict

if TYPE_CHECKING:
    from kimictl.deployment.spec import DeploymentSpec
    from kimictl.runtime.checks.hardware import HardwareReport
    from kimictl.runtime.checks.stack import StackReport

__all__ = [
    "Check",
    "Diagnosis",
    "Section",
    "Status",
    "diagnose",
    "evaluate",
    "no_deployment_check",
    "verdict",
]

# vLLM's rule 1 (compute capability) is checked by the deployment rules when a spec is given;
# the hardware rules carry the same finding when there is no spec. Report it once.
_DUPLICATES = {"k3.gpu_arch": "hw.compute_capability"}


def no_deployment_check() -> Check:
    return Check(
        "deployment.given",
        Section.DEPLOYMENT,
        Status.UNKNOWN,
        "No deployment given: flags not checked.",
        'Pass --profile NAME|FILE or --vllm-args "vllm serve ..." to check the launch flags.',
    )


def evaluate(
    spec: DeploymentSpec | None,
    hw: HardwareReport | None,
    stack: StackReport | None,
) -> list[Check]:
    """All checks, ordered Hardware, Fabric and multicast, Software stack, Deployment.

    With `hw` the environment checks read each node's recorded env (`NodeReport.env`) with the
    deployment's env on top; without it, the deployment's env alone."""
    from kimictl.runtime.checks.rules.deployment import deployment_checks
    from kimictl.runtime.checks.rules.environment import (
        environment_checks,
        launch_env,
        restrict_to_visible,
    )
    from kimictl.runtime.checks.rules.hardware import hardware_checks, stack_checks

    checks: list[Check] = []
    # The environment vLLM gets on each node: what the probing process had (live) or recorded
    # (snapshot), the deployment's env on top. The hardware checks see only the visible GPUs.
    envs = [launch_env(n.env, spec) for n in hw.nodes] if hw is not None else []
    checks.extend(environment_checks(hw, envs, spec))
    if hw is not None:
        hw = restrict_to_visible(hw, envs)
        # the GPUs a spec needs are counted by the deployment rules (k3.gpu_count)
        checks.extend(hardware_checks(hw))
    if stack is not None:
        checks.extend(stack_checks(stack, hw))
    layer = _layer_check(spec, hw)  # here, not beside _plugin_check: serve's gate shows it too
    if layer is not None:
        checks.append(layer)
    if spec is None:
        checks.append(no_deployment_check())
    else:
        found = list(deployment_checks(spec, hw))
        from kimictl.runtime.checks.rules.vllm_check import vllm_gate_checks

        found.extend(vllm_gate_checks(spec, found))  # only where vLLM 0.33 is importable
        if stack is not None:
            from kimictl.runtime.checks.rules.tracing import tracing_check

            checks.extend(tracing_check(spec, stack))
        ids = {c.id for c in found if c.status is not Status.UNKNOWN}
        drop = {mine for theirs, mine in _DUPLICATES.items() if theirs in ids}
        checks = [c for c in checks if c.id not in drop]
        checks.extend(found)
    order = list(Section)
    return sorted(checks, key=lambda c: order.index(c.section))


@dataclass
class Diagnosis:
    """What `kimictl doctor` reports: the checks plus the inputs they were computed from."""

    checks: list[Check]
    hardware: HardwareReport
    stack: StackReport | None
    spec: DeploymentSpec | None = None
    unrecognised: list[str] = field(default_factory=list)
    saved_to: Path | None = None

    @property
    def verdict(self) -> str:
        return verdict(self.checks)

    @property
    def blocking(self) -> int:
        return sum(1 for c in self.checks if c.blocking)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "blocking": self.blocking,
            "checks": [c.to_json() for c in self.checks],
            "hardware": self.hardware.to_json(),
            "stack": self.stack.to_json() if self.stack is not None else None,
            "deployment": self.spec.to_json() if self.spec is not None else None,
            "unrecognised_flags": list(self.unrecognised),
            "saved_snapshot": str(self.saved_to) if self.saved_to else None,
        }


def _plugin_env_arch(
    spec: DeploymentSpec | None, hw: HardwareReport | None
) -> tuple[dict[str, str], str | None]:
    """The launch env (the node's recorded env under the deployment's) and the first GPU's arch."""
    import os

    from kimictl.kernels.toolchain.harness import arch_of

    nodes = hw.nodes if hw is not None else []
    env = {**(nodes[0].env or {} if nodes else os.environ), **(spec.env if spec else {})}
    arch = None
    for node in nodes:
        for gpu in node.gpus:
            cc = gpu.compute_capability
            if isinstance(cc, tuple) and arch is None:
                arch = arch_of((int(cc[0]), int(cc[1])))
    return env, arch


def _plugin_check(spec: DeploymentSpec | None, hw: HardwareReport, *, live: bool) -> Check:
    """kimictl's vLLM kernels plugin: installed, enabled in the launch env, a table for the GPU;
    from a snapshot, the install it recorded (never this machine's)."""
    from kimictl.runtime.checks.rules.plugin import (
        RECORD_KEY,
        plugin_check,
        unrecorded_plugin_check,
    )

    env, arch = _plugin_env_arch(spec, hw)
    if live:
        return plugin_check(env, arch)
    recorded = next((n.stack.get(RECORD_KEY) for n in hw.nodes if n.stack), None)
    if not isinstance(recorded, dict):
        return unrecorded_plugin_check()
    return plugin_check(env, arch, recorded=recorded)


def _layer_check(spec: DeploymentSpec | None, hw: HardwareReport | None) -> Check | None:
    """The plugin's fused-layer switch, when the launch env turns it on (doctor and serve)."""
    from kimictl.runtime.checks.rules.plugin import layer_check

    return layer_check(*_plugin_env_arch(spec, hw), tp=spec.tensor_parallel_size if spec else None)


def _kernel_cache_check(
    spec: DeploymentSpec | None, hw: HardwareReport, stack: StackReport | None, *, live: bool
) -> Check | None:
    from kimictl.runtime.checks.rules.kernel_cache import kernel_cache_check, node_capability

    capability = node_capability(hw)
    return kernel_cache_check(spec, stack, capability, live=live)


def diagnose(
    spec: DeploymentSpec | None = None,
    *,
    snapshots: Sequence[str | Path] = (),
    save_snapshot: str | Path | None = None,
    overwrite_snapshot: bool = False,
    unrecognised: Sequence[str] = (),
) -> Diagnosis:
    """Probe this node (or load `snapshots`, one per node, as one TP group), then evaluate.

    With snapshots the software stack is the one recorded in them (first node; `stack.same`
    compares the rest), not this machine's.
    """
    from kimictl.runtime.checks import hardware
    from kimictl.runtime.checks.stack import StackReport, probe_stack

    if save_snapshot is not None:  # refuse a bad target before probing, not after
        hardware.check_snapshot_target(save_snapshot, overwrite=overwrite_snapshot)
    stack: StackReport | None
    if snapshots:
        hw = hardware.load_snapshots(snapshots)
        recorded = next((n.stack for n in hw.nodes if n.stack), None)
        stack = StackReport.from_json(recorded) if recorded else None
    else:
        from kimictl.kernels.vllm.plugin import plugin_status
        from kimictl.runtime.checks.rules.plugin import RECORD_KEY

        hw = hardware.probe_local(include_stack=False)
        stack = probe_stack()
        recorded = {
            **stack.to_json(),
            RECORD_KEY: plugin_status(None, _plugin_env_arch(None, hw)[1]),
        }
        hw = hardware.HardwareReport(
            nodes=[replace(n, stack=recorded) for n in hw.nodes], source=hw.source
        )
    saved = (
        hardware.save_snapshot(hw, save_snapshot, overwrite=overwrite_snapshot)
        if save_snapshot is not None
        else None
    )
    checks = evaluate(spec, hw, stack)
    if stack is None:
        checks.append(
            Check(
                "stack.recorded",
                Section.STACK,
                Status.UNKNOWN,
                "The snapshot records no software stack.",
                "Re-capture it with kimictl doctor --save-snapshot FILE on the node.",
            )
        )
    checks.append(_plugin_check(spec, hw, live=not snapshots))
    cache = _kernel_cache_check(spec, hw, stack, live=not snapshots)
    if cache is not None:
        checks.append(cache)
    if unrecognised:
        checks.append(
            Check(
                "deployment.unrecognised",
                Section.DEPLOYMENT,
                Status.WARN,
                "Flags kimictl does not know (passed to vLLM unchecked): "
                f"{' '.join(unrecognised)}.",
            )
        )
    order = list(Section)
    checks.sort(key=lambda c: order.index(c.section))
    return Diagnosis(checks, hw, stack, spec, list(unrecognised), saved)
