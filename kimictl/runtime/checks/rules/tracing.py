"""A deployment that sends trace spans needs the OpenTelemetry packages where vLLM runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kimictl.deployment.traces import OTEL_PACKAGES
from kimictl.runtime.checks.rules.base import Check, Section, Status

if TYPE_CHECKING:
    from kimictl.deployment.spec import DeploymentSpec
    from kimictl.runtime.checks.stack import StackReport

__all__ = ["tracing_check", "tracing_packages_check"]


def tracing_packages_check(installed: dict[str, str | None], where: str) -> Check:
    """PASS with the versions, or FAIL naming the missing packages: vLLM started with
    --otlp-traces-endpoint refuses to start without them (vllm/tracing/otel.py)."""
    missing = [name for name in OTEL_PACKAGES if not installed.get(name)]
    if not missing:
        found = ", ".join(f"{name} {installed[name]}" for name in OTEL_PACKAGES)
        return Check("stack.tracing", Section.STACK, Status.PASS, f"trace export: {found}.")
    return Check(
        "stack.tracing",
        Section.STACK,
        Status.FAIL,
        f"the deployment sends trace spans ([metrics] traces) but {where} lacks "
        f"{', '.join(missing)}; vLLM refuses to start without them.",
        f"pip install {' '.join(OTEL_PACKAGES)}",
    )


def tracing_check(spec: DeploymentSpec, stack: StackReport) -> list[Check]:
    """[] unless the spec sends traces and the stack was probed for the packages."""
    if spec.otlp_traces_endpoint is None or not stack.tracing:
        return []
    return [tracing_packages_check(stack.tracing, "this node")]
