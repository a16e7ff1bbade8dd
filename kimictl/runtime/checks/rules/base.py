"""The result type every check returns, shared by the deployment, hardware and stack rules."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

__all__ = ["Check", "Section", "Status", "verdict"]


class Status(StrEnum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"


class Section(StrEnum):
    HARDWARE = "Hardware"
    FABRIC = "Fabric and multicast"
    STACK = "Software stack"
    DEPLOYMENT = "Deployment"


@dataclass(frozen=True)
class Check:
    """One finding. `id` is stable (tests and --json key on it); `remedy` is the exact fix."""

    id: str
    section: Section
    status: Status
    message: str
    remedy: str = ""

    @property
    def blocking(self) -> bool:
        return self.status is Status.FAIL

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["section"] = self.section.value
        data["status"] = self.status.value
        return data


def verdict(checks: list[Check]) -> str:
    """`ready` when nothing blocks; UNKNOWN does not block (it is reported, with its reason)."""
    return "not_ready" if any(c.blocking for c in checks) else "ready"
