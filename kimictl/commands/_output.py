"""Shared rendering for commands: one stdout console, one stderr console, JSON emission."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

from kimictl.core.jsondoc import dumps

__all__ = ["console", "err_console", "emit_json", "fits"]

console = Console()
err_console = Console(stderr=True)


def fits(table: Any) -> bool:
    """Whether a rich renderable prints at its natural width on the terminal: rich would
    otherwise squeeze columns (ellipsis, or a wrappable column dropped to nothing)."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(10_000)  # else rich caps it at the width
    return Measurement.get(console, unbounded, table).maximum <= console.width


def emit_json(obj: Any) -> None:
    """Write one JSON document to stdout (nothing else may go to stdout under --json)."""
    sys.stdout.write(dumps(obj).decode())
    sys.stdout.flush()
