"""Options more than one command takes, defined once: the same flag reads the same everywhere.

Each is an `Annotated` type to put on a command's parameter (`json_out: JsonOpt = False`).
Bounds and choices are Typer's own (`min=`, `max=`, enums); cli.py words their errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["ApiKeyFileOpt", "JsonOpt", "OutputOpt"]

JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout (nothing else there).")
]
ApiKeyFileOpt = Annotated[
    Path | None,
    typer.Option(metavar="FILE", help="File holding the API key (default: env VLLM_API_KEY)."),
]
OutputOpt = Annotated[
    Path | None,
    typer.Option("--output", "-o", metavar="FILE", help="Write the report JSON to FILE."),
]
