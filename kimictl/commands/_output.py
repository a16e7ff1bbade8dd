"""Shared rendering for commands: one stdout console, one stderr console, JSON emission."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

__all__ = ["console", "err_console", "emit_json"]

console = Console()
err_console = Console(stderr=True)


def emit_json(obj: Any) -> None:
    """Write one JSON document to stdout (nothing else may go to stdout under --json)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()
