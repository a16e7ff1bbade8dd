"""Shared rendering for commands: one stdout console, one stderr console, JSON emission."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

from kimictl.core.jsondoc import dumps

__all__ = ["console", "err_console", "emit_json", "fits", "print_command"]

console = Console()
err_console = Console(stderr=True)


def fits(table: Any) -> bool:
    """Whether a rich renderable prints at its natural width on the terminal: rich would
    otherwise squeeze columns (ellipsis, or a wrappable column dropped to nothing)."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(10_000)  # else rich caps it at the width
    return Measurement.get(console, unbounded, table).maximum <= console.width


def print_command(label: str, argv: list[str], *, to: Console | None = None) -> None:
    """A command for a person to run: `label` then the argv as ONE shlex-quoted line, never read
    as Rich markup (`pkg[cu13]` keeps its extra) and never wrapped or cut, so it copies exactly."""
    import shlex

    (to or console).print(
        label + shlex.join(argv), markup=False, highlight=False, soft_wrap=True, crop=False
    )


def emit_json(obj: Any) -> None:
    """Write one JSON document to stdout (nothing else may go to stdout under --json)."""
    sys.stdout.write(dumps(obj).decode())
    sys.stdout.flush()
