"""One way to print a rule check (doctor, profiles validate): a coloured status tag, the message
and, unless it passed, its fix. Rich only; no domain logic."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kimictl.runtime.checks.rules.base import Check

__all__ = ["STATUS_STYLE", "print_check"]

STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "unknown": "magenta"}


def print_check(check: Check) -> None:
    from rich.markup import escape

    from kimictl.commands._output import console

    status = check.status.value
    console.print(
        f"  [{STATUS_STYLE[status]}]{status.upper():<7}[/] {escape(check.message)}",
        highlight=False,
        soft_wrap=True,
    )
    if check.remedy and status != "pass":
        console.print(
            f"          [dim]fix:[/dim] {escape(check.remedy)}", highlight=False, soft_wrap=True
        )
