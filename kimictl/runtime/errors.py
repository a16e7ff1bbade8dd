"""The one error tree of kimictl. Each class fixes the exit code; cli.py alone prints them.

KimictlError (exit 1)
├── InputError (exit 2)        bad file, flag, value or command line: the user must change input
├── CheckFailed (exit 1)       a check ran and said no (doctor, validate, verify)
├── EndpointError (exit 1)     a server is unreachable, dead or answered garbage
├── LaunchError (exit 1)       vLLM could not be started or died during start-up
└── Unsupported (exit 1)       this machine cannot do it (no GPU, no driver, no runtime)
"""

from __future__ import annotations

__all__ = [
    "CheckFailed",
    "EndpointError",
    "InputError",
    "KimictlError",
    "LaunchError",
    "Unsupported",
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
