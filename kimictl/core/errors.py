"""The one error tree of kimictl. Each class fixes the exit code; cli.py alone prints them.

KimictlError (exit 1)
├── InputError (exit 2)        bad file, flag, value or command line: the user must change input
├── CheckFailed (exit 1)       a check ran and said no (doctor, validate, verify)
├── EndpointError (exit 1)     a server is unreachable, dead or answered garbage
├── LaunchError (exit 1)       vLLM could not be started or died during start-up
├── Unsupported (exit 1)       this machine cannot do it (no GPU, no driver, no runtime)
└── WriteFailed (exit 1)       a finished result could not be written where asked (kept elsewhere)
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = [
    "CheckFailed",
    "EndpointError",
    "InputError",
    "KimictlError",
    "LaunchError",
    "Unsupported",
    "WriteFailed",
    "child_failure",
]


class KimictlError(Exception):
    """A failure the user can act on: one sentence, and optionally the next step."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class InputError(KimictlError):
    exit_code = 2


class CheckFailed(KimictlError):
    exit_code = 1


class EndpointError(KimictlError):
    exit_code = 1


class LaunchError(KimictlError):
    exit_code = 1


class Unsupported(KimictlError):
    exit_code = 1


class WriteFailed(KimictlError):
    exit_code = 1


# `ModuleNotFoundError: No module named 'x'`, `pip._internal.exceptions.InstallationError: ...`
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b.*$")


def child_failure(log: Path) -> str:
    """The line of a child's log that says why it failed: its last exception line (the one a
    traceback ends with), else its last non-empty line. Never a slice starting mid-path."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return f"(its log {log} cannot be read)"
    lines = [line for line in lines if line]
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return line
    return lines[-1] if lines else "(it printed nothing)"
